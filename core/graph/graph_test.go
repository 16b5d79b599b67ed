package graph

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/model"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite golden files")

func fixtureConfig(t *testing.T, name string) *model.Config {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", name, "checkpoint", "config.json"))
	require.NoError(t, err)
	cfg, err := model.ParseConfig(b, name)
	require.NoError(t, err)
	return cfg
}

// The tiny model's decode graph, as text, is a golden file: any change to
// the builder shows up as a diff here.
func TestGoldenDecodeGraph(t *testing.T) {
	g, err := Build(fixtureConfig(t, "glm5next-tiny-a"), Options{Mode: Decode, Logits: LastLogits})
	require.NoError(t, err)
	path := filepath.Join("testdata", "tiny-a.decode.golden")
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, []byte(g.Text()), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(want), g.Text())
}

func TestGraphShapeFollowsConfig(t *testing.T) {
	for _, name := range []string{"glm5next-tiny-a", "glm5next-tiny-b", "glm5next-tiny-c"} {
		cfg := fixtureConfig(t, name)
		g, err := Build(cfg, Options{Mode: Prefill, Logits: AllLogits, CaptureHidden: true})
		require.NoError(t, err)
		count := map[string]int{}
		for _, n := range g.Nodes {
			count[n.Op]++
		}
		kda, dsa, full, moe := 0, 0, 0, 0
		for l := 0; l < cfg.NumHiddenLayers; l++ {
			if cfg.IsKDA(l) {
				kda++
			} else {
				dsa++
				if cfg.IndexerTypes[l] == model.IndexerFull {
					full++
				}
			}
			if cfg.IsMoE(l) {
				moe++
			}
		}
		require.Equal(t, kda, count[ir.OpKDAAttn], name)
		require.Equal(t, dsa, count[ir.OpMLAAttn], name)
		require.Equal(t, full, count[ir.OpDSATopK], name)
		require.Equal(t, moe, count[ir.OpMoEExperts], name)
		require.Equal(t, 2*cfg.NumHiddenLayers, count[ir.OpMHCPre], name)
		require.Len(t, g.Outputs, cfg.NumHiddenLayers+1, name)
		require.True(t, strings.HasPrefix(g.Text(), "graph glm5_next"))
	}
}

func TestBuildRejectsBadOptions(t *testing.T) {
	cfg := fixtureConfig(t, "glm5next-tiny-a")
	_, err := Build(cfg, Options{Mode: "sideways"})
	require.ErrorContains(t, err, "sideways")
	_, err = Build(cfg, Options{Logits: "some"})
	require.ErrorContains(t, err, "some")
}
