package dsameta_test

import (
	"testing"

	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/passes/dsameta"
	"github.com/stretchr/testify/require"
)

var req = []pass.Request{{Name: dsameta.Name}}

// The rewrite of the tiny model's decode graph, as IR text.
func TestGoldenIR(t *testing.T) {
	f := passtest.TinyA(t)
	g, _, _ := passtest.Explain(t, f.Checkpoint.Config(), graph.Decode, req, nil)
	passtest.Golden(t, "testdata/tiny-a.decode.golden", g.StableText())
}

// Every DSA layer reads the one hoisted metadata node.
func TestFiresOncePerDSALayer(t *testing.T) {
	for _, dir := range passtest.Fixtures(t) {
		cfg := passtest.OpenFixture(t, dir).Checkpoint.Config()
		dsa := 0
		for l := 0; l < cfg.NumHiddenLayers; l++ {
			if !cfg.IsKDA(l) {
				dsa++
			}
		}
		g, rep, _ := passtest.Explain(t, cfg, graph.Decode, req, nil)
		pr := rep.Find(dsameta.Name)
		require.Len(t, pr.Fired, dsa, dir)
		require.Equal(t, int64(dsa-1), pr.Stats[0].Value, dir)
		metas := 0
		for _, n := range g.Nodes {
			if n.Op == ir.OpDSAMeta {
				metas++
				require.Equal(t, -1, n.Layer, "the metadata node is hoisted to the prologue")
			}
		}
		require.Equal(t, 1, metas, dir)
	}
}

// kpool 1 has no pools to share: every layer is skipped, the graph unchanged.
func TestIneligibleWithoutPools(t *testing.T) {
	c := passtest.TinyA(t).Checkpoint.Config().Clone()
	c.IndexKPool = 1
	g, rep, before := passtest.Explain(t, c, graph.Decode, req, nil)
	pr := rep.Find(dsameta.Name)
	require.Empty(t, pr.Fired)
	require.NotEmpty(t, pr.Skipped)
	for _, s := range pr.Skipped {
		require.Contains(t, s.Reason, "kpool 1 ≤ 1")
	}
	require.Equal(t, before, g.Text())
}

// The conformance suite.
func TestConformance(t *testing.T) {
	passtest.Run(t, passtest.TinyA(t), passtest.Subject{Name: dsameta.Name,
		Ineligible: passtest.Ineligibility{Model: func(c *model.Config) { c.IndexKPool = 1 }}})
}
