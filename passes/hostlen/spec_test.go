package hostlen_test

import (
	"testing"

	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/passes/hostlen"
	"github.com/stretchr/testify/require"
)

// Host-length reuse is not eligible where lengths come from acceptance:
// every lengths reader of the verify graph and of the draft extend after a
// verify step is skipped, saying so; the draft steps and the draft extend
// after a prefill chunk (lengths the host knows) are rewired.
func TestSpeculativeGraphs(t *testing.T) {
	cfg := passtest.TinyMTP(t).Config()
	reps := passtest.SpecStatement(t, hostlen.Name, cfg, nil)
	for _, name := range []string{"verify", "draft-extend-accepted"} {
		pr := reps[name]
		require.Empty(t, pr.Fired, name)
		require.NotEmpty(t, pr.Skipped, name)
		for _, s := range pr.Skipped {
			require.Contains(t, s.Reason, "speculative accept lengths", name)
		}
		require.Contains(t, pr.Notes[0], "not", name)
	}
	for _, name := range []string{"draft-extend", "draft-step"} {
		require.NotEmpty(t, reps[name].Fired, name)
		require.Empty(t, reps[name].Skipped, name)
	}
}
