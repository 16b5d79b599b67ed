package gateup_test

import (
	"testing"

	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/passes/gateup"
	"github.com/stretchr/testify/require"
)

// On speculative decoding's graphs: the verify graph fuses what a mixed
// batch does; the MTP layer's only SwiGLU MLP, its shared expert, fuses
// with option shared_experts and is skipped (saying why) without it; every
// DFlash draft layer's MLP fuses.
func TestSpeculativeGraphs(t *testing.T) {
	cfg := passtest.TinyMTP(t).Config()
	opts := map[string]any{"shared_experts": true}
	_, mixed, _ := passtest.Explain(t, cfg, graph.Mixed, []pass.Request{{Name: gateup.Name, Options: opts}}, nil)
	reps := passtest.SpecStatement(t, gateup.Name, cfg, opts)
	require.Equal(t, mixed.Find(gateup.Name).Fired, reps["verify"].Fired)
	for _, name := range []string{"draft-extend", "draft-extend-accepted", "draft-step"} {
		require.Len(t, reps[name].Fired, 1, name)
		require.Equal(t, cfg.MTPLayer(0), reps[name].Fired[0].Layer, name)
	}
	require.Len(t, reps["dflash"].Fired, 2, "each DFlash draft layer's MLP")
	reps = passtest.SpecStatement(t, gateup.Name, cfg, map[string]any{"shared_experts": false})
	require.Empty(t, reps["draft-step"].Fired)
	require.Contains(t, reps["draft-step"].Skipped[0].Reason, "shared expert")
}
