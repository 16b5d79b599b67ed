package hostlen_test

import (
	"testing"

	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/passes/hostlen"
	"github.com/stretchr/testify/require"
)

// Host-length reuse applies to every speculative graph: the verify graph
// and the draft extend after a verify step start from acceptance the
// scheduler (or the drafter) already has on the host when it builds them,
// like the draft steps and the draft extend after a prefill chunk; every
// lengths reader is rewired and none is skipped. The statements say so.
func TestSpeculativeGraphs(t *testing.T) {
	cfg := passtest.TinyMTP(t).Config()
	reps := passtest.SpecStatement(t, hostlen.Name, cfg, nil)
	for _, name := range []string{"verify", "draft-extend-accepted", "draft-extend", "draft-step"} {
		require.NotEmpty(t, reps[name].Fired, name)
		require.Empty(t, reps[name].Skipped, name)
	}
	require.Contains(t, reps["verify"].Notes[0], "eligible")
	require.NotContains(t, reps["verify"].Notes[0], "not eligible")
}
