package graph

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
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

// The tiny model's decode graph, as text (with stable value names, the
// baseline the passes' goldens are diffed against), is a golden file: any
// change to the builder shows up as a diff here.
func TestGoldenDecodeGraph(t *testing.T) {
	g, err := Build(fixtureConfig(t, "glm5next-tiny-a"), Options{Mode: Decode, Logits: LastLogits})
	require.NoError(t, err)
	path := filepath.Join("testdata", "tiny-a.decode.golden")
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, []byte(g.StableText()), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(want), g.StableText())
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
	_, err := Build(cfg, Options{Mode: ir.Mode(99)})
	require.ErrorContains(t, err, "mode(99)")
	_, err = ParseMode("sideways")
	require.ErrorContains(t, err, "sideways")
	_, err = Build(cfg, Options{Logits: "some"})
	require.ErrorContains(t, err, "some")
}

func mtpConfig(t *testing.T, name string) *model.Config {
	t.Helper()
	cfg := fixtureConfig(t, name).Clone()
	cfg.NumNextNPredictLayers = 1
	require.NoError(t, cfg.Validate())
	return cfg
}

// The MTP graph of the tiny model, as text, is a golden file too.
func TestGoldenMTPGraph(t *testing.T) {
	g, err := BuildMTP(mtpConfig(t, "glm5next-tiny-a"), Options{Mode: Decode, Logits: LastLogits})
	require.NoError(t, err)
	path := filepath.Join("testdata", "tiny-a.mtp.golden")
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(g.StableText()), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(want), g.StableText())
}

// The MTP graph is one DSA + MoE layer at index num_hidden_layers without
// mHC: its inputs are tokens and hidden rows, its outputs logits (rows per
// the selection) and final_hidden (every token); it reads only the MTP
// layer's tensors and the trunk's embedding and lm_head.
func TestMTPGraphShape(t *testing.T) {
	for _, name := range []string{"glm5next-tiny-a", "glm5next-tiny-b", "glm5next-tiny-c"} {
		cfg := mtpConfig(t, name)
		L, D := cfg.NumHiddenLayers, cfg.HiddenSize
		for _, logits := range []Logits{AllLogits, LastLogits} {
			g, err := BuildMTP(cfg, Options{Mode: Prefill, Logits: logits})
			require.NoError(t, err, name)
			count := map[string]int{}
			for _, n := range g.Nodes {
				count[n.Op]++
				require.Contains(t, []int{-1, L}, n.Layer, "%s: node %s", name, n.Op)
			}
			require.Equal(t, withoutZeros(map[string]int{ir.OpSeqLengths: 1, ir.OpEmbed: 1, ir.OpRMSNorm: 7, ir.OpSliceCols: 2, ir.OpLinear: 15, ir.OpAdd: 4,
				ir.OpDSAMeta: 1, ir.OpLayerNorm: 1, ir.OpDSATopK: 1, ir.OpMLAAttn: 1, ir.OpMoERoute: 1, ir.OpMoEExperts: 1, ir.OpSwiGLU: 1, ir.OpLastRows: btoi(logits == LastLogits)}), withoutZeros(count), name)
			var inputs []string
			for _, in := range g.Inputs {
				inputs = append(inputs, in.Name)
			}
			require.Equal(t, []string{ir.InputTokens, ir.InputBatch, ir.InputHidden}, inputs)
			require.Equal(t, []int{ir.DimT, D}, g.Input(ir.InputHidden).Shape)
			require.Len(t, g.Outputs, 2)
			require.Equal(t, []int{ir.DimT, D}, g.Outputs[ir.OutputFinalHidden].Shape)
			rows := ir.DimT
			if logits == LastLogits {
				rows = ir.DimS
			}
			require.Equal(t, []int{rows, cfg.VocabSize}, g.Outputs[ir.OutputLogits].Shape)
			mtp := map[string]bool{}
			for _, s := range cfg.MTPWeightCatalog(false) {
				mtp[s.Name] = true
			}
			for _, w := range g.Weights {
				for _, n := range w.LeafNames() {
					require.True(t, mtp[n] || n == model.EmbedName || n == model.LMHeadName, "%s: weight %s", name, n)
					delete(mtp, n)
				}
			}
			require.Empty(t, mtp, "%s: every MTP tensor is used", name)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func withoutZeros(m map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

func TestBuildMTPRejects(t *testing.T) {
	_, err := BuildMTP(fixtureConfig(t, "glm5next-tiny-a"), Options{})
	require.ErrorContains(t, err, "no MTP layer (num_nextn_predict_layers is 0)")
	cfg := mtpConfig(t, "glm5next-tiny-a")
	_, err = BuildMTP(cfg, Options{CaptureHidden: true})
	require.ErrorContains(t, err, "takes no hidden-capture options")
	_, err = BuildMTP(cfg, Options{Logits: "some"})
	require.ErrorContains(t, err, "some")
}

// FinalHidden adds the normalized final hidden of every token as an output;
// the logits stay those of the graph without it (same rows, the same
// lm_head input), and nothing else changes.
func TestTrunkFinalHidden(t *testing.T) {
	cfg := fixtureConfig(t, "glm5next-tiny-a")
	for _, logits := range []Logits{AllLogits, LastLogits} {
		plain, err := Build(cfg, Options{Mode: Mixed, Logits: logits})
		require.NoError(t, err)
		g, err := Build(cfg, Options{Mode: Mixed, Logits: logits, FinalHidden: true})
		require.NoError(t, err)
		fh := g.Outputs[ir.OutputFinalHidden]
		require.NotNil(t, fh)
		require.Equal(t, []int{ir.DimT, cfg.HiddenSize}, fh.Shape)
		require.Equal(t, ir.OpRMSNorm, fh.Producer.Op)
		require.Equal(t, ir.OpStreamMean, fh.Producer.Inputs[0].Producer.Op)
		require.Equal(t, model.FinalNormName, fh.Producer.Inputs[1].Ref)
		require.Equal(t, plain.Outputs[ir.OutputLogits].Shape, g.Outputs[ir.OutputLogits].Shape)
		require.Len(t, g.Nodes, len(plain.Nodes))
		require.NotContains(t, plain.Outputs, ir.OutputFinalHidden)
		head := g.Outputs[ir.OutputLogits].Producer
		if logits == LastLogits {
			require.Equal(t, ir.OpLastRows, head.Inputs[0].Producer.Op)
			require.Same(t, fh, head.Inputs[0].Producer.Inputs[1])
		} else {
			require.Same(t, fh, head.Inputs[0])
		}
	}
}

// Every attribute the builder sets, on any fixture, mode and graph (trunk,
// MTP with and without index sharing), is declared by its op with the
// value's type (the verifier checks the same; this names the culprit), and
// the graph's mode and MTP layer are its typed properties.
func TestBuilderAttributesAreDeclared(t *testing.T) {
	check := func(g *ir.Graph, what string) {
		for _, n := range g.Nodes {
			for k, v := range n.Attrs {
				d, ok := n.Def().Attr(k)
				require.True(t, ok, "%s: %s (layer %d) sets undeclared attribute %q", what, n.Op, n.Layer, k)
				require.Equal(t, d.Type.String(), attrType(v), "%s: %s.%s", what, n.Op, k)
			}
			for _, d := range n.Def().AttrDefs() {
				if d.Required {
					require.Contains(t, n.Attrs, d.Name, "%s: %s (layer %d) lacks required %q", what, n.Op, n.Layer, d.Name)
				}
			}
		}
		for k := range g.Attrs {
			require.True(t, slices.ContainsFunc(ir.GraphAttrs, func(d ir.AttrDef) bool { return d.Name == k }), "%s: graph attribute %q", what, k)
		}
	}
	modes := []Mode{Prefill, Decode, Extend, Mixed, Verify}
	for _, name := range []string{"glm5next-tiny-a", "glm5next-tiny-b", "glm5next-tiny-c"} {
		cfg := fixtureConfig(t, name)
		for _, m := range modes {
			for _, o := range []Options{{Mode: m}, {Mode: m, Logits: AllLogits, CaptureHidden: true, FinalHidden: true}} {
				g, err := Build(cfg, o)
				require.NoError(t, err)
				check(g, name+"/"+m.String())
				require.Equal(t, m, g.Mode())
				_, mtp := g.MTPLayer()
				require.False(t, mtp)
			}
		}
		mc := mtpConfig(t, name)
		for _, m := range modes {
			for _, share := range []int{0, 2} {
				g, err := BuildMTP(mc, Options{Mode: m, IndexShare: share})
				require.NoError(t, err)
				check(g, name+"/mtp/"+m.String())
				require.Equal(t, m, g.Mode())
				l, mtp := g.MTPLayer()
				require.True(t, mtp)
				require.Equal(t, mc.MTPLayer(0), l)
			}
		}
	}
}

func attrType(v any) string {
	switch v.(type) {
	case int:
		return ir.IntAttr.String()
	case float64:
		return ir.FloatAttr.String()
	case string:
		return ir.StringAttr.String()
	case bool:
		return ir.BoolAttr.String()
	case []int:
		return ir.IntsAttr.String()
	}
	return "unsupported"
}
