package kdafusion_test

import (
	"testing"

	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/passes/kdafusion"
	"github.com/stretchr/testify/require"
)

// On speculative decoding's graphs: the verify graph fuses every KDA
// layer (its per-position states are kept downstream, by kda_conv and
// kda_attn); the MTP layer's draft graphs have no KDA, so no site.
func TestSpeculativeGraphs(t *testing.T) {
	cfg := passtest.TinyMTP(t).Config()
	kda := 0
	for l := 0; l < cfg.NumHiddenLayers; l++ {
		if cfg.IsKDA(l) {
			kda++
		}
	}
	reps := passtest.SpecStatement(t, kdafusion.Name, cfg, nil)
	require.Len(t, reps["verify"].Fired, kda)
	require.Empty(t, reps["verify"].Skipped)
	for _, name := range []string{"draft-extend", "draft-extend-accepted", "draft-step", "dflash"} {
		require.Empty(t, reps[name].Fired, name)
		require.Empty(t, reps[name].Skipped, name)
		require.Contains(t, reps[name].Notes[0], "no KDA")
	}
}
