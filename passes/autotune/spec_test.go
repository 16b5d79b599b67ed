package autotune_test

import (
	"testing"

	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/passes/autotune"
	"github.com/stretchr/testify/require"
)

// On speculative decoding's graphs: the verify graph's GEMMs are tuned
// like a mixed batch's (the same shapes and buckets), and so are the MTP
// layer's in every draft graph (eh_proj's halves, its DSA and MoE, the
// shared lm_head), and a DFlash draft graph's (its shapes in the table),
// every GEMM-trait node getting tuned attributes.
func TestSpeculativeGraphs(t *testing.T) {
	cfg := passtest.TinyMTP(t).Config()
	gs := passtest.SpecGraphs(t, cfg)
	dir := fixedTable(t, cfg, gs["dflash"])
	_, mixed, _ := passtest.Explain(t, cfg, graph.Mixed, request(dir), nil)
	for name, g := range gs {
		rep := passtest.RunOn(t, g, cfg, request(dir), nil)
		pr := rep.Find(autotune.Name)
		require.Empty(t, pr.Error, name)
		require.NotEmpty(t, pr.Fired, name)
		if name == "verify" {
			require.Equal(t, mixed.Find(autotune.Name).Fired, pr.Fired)
		}
		for _, n := range g.Nodes {
			if n.Def().GEMM != nil && n.Op == ir.OpLinear {
				_, grain := ir.AttrTuneColGrain.Lookup(n)
				require.True(t, grain, "%s: %s (layer %d) is not tuned: %v", name, n.Op, n.Layer, n.Attrs)
			}
		}
	}
	passtest.SpecStatement(t, autotune.Name, cfg, map[string]any{"table_dir": dir, "cpu": "test-cpu"})
}
