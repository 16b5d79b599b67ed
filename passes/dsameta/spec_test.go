package dsameta_test

import (
	"testing"

	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/passes/dsameta"
	"github.com/stretchr/testify/require"
)

// On speculative decoding's graphs: the verify graph hoists one metadata
// node for every DSA layer; each MTP graph's single DSA layer, which
// attends over its own store's lengths (its batch's), is its one site.
func TestSpeculativeGraphs(t *testing.T) {
	cfg := passtest.TinyMTP(t).Config()
	dsa := 0
	for l := 0; l < cfg.NumHiddenLayers; l++ {
		if cfg.IsDSA(l) {
			dsa++
		}
	}
	reps := passtest.SpecStatement(t, dsameta.Name, cfg, nil)
	require.Len(t, reps["verify"].Fired, dsa)
	for _, name := range []string{"draft-extend", "draft-extend-accepted", "draft-step"} {
		require.Len(t, reps[name].Fired, 1, name)
		require.Equal(t, cfg.MTPLayer(0), reps[name].Fired[0].Layer, name)
	}
}
