package mhcfusion_test

import (
	"testing"

	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/passes/mhcfusion"
	"github.com/stretchr/testify/require"
)

// On speculative decoding's graphs: the verify graph (whose final hidden
// rows the drafter reads) fuses exactly the boundaries a mixed batch does,
// the terminal layer skipped; the MTP layer has no mHC.
func TestSpeculativeGraphs(t *testing.T) {
	cfg := passtest.TinyMTP(t).Config()
	_, mixed, _ := passtest.Explain(t, cfg, graph.Mixed, []pass.Request{{Name: mhcfusion.Name}}, nil)
	reps := passtest.SpecStatement(t, mhcfusion.Name, cfg, nil)
	require.Equal(t, mixed.Find(mhcfusion.Name).Fired, reps["verify"].Fired)
	require.Equal(t, mixed.Find(mhcfusion.Name).Skipped, reps["verify"].Skipped)
	require.NotEmpty(t, reps["verify"].Fired)
	for _, name := range []string{"draft-extend", "draft-extend-accepted", "draft-step", "dflash"} {
		require.Empty(t, reps[name].Fired, name)
		require.Contains(t, reps[name].Notes[0], "no mHC")
	}
}
