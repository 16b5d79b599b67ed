package backend_test

import (
	"slices"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	_ "github.com/glmflash/glmflash/core/backend/cpu"
	_ "github.com/glmflash/glmflash/core/backend/cuda"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/stretchr/testify/require"
)

// Every registered op that is not constant has a binding in every backend,
// and no backend binds an op the IR does not know or folds. The tables are
// static, so this needs no GPU.
func TestEveryOpBoundInEveryBackend(t *testing.T) {
	require.Equal(t, []string{"cpu", "cuda"}, backend.Names())
	want := ir.KernelOps()
	require.Contains(t, want, ir.OpMoEAppendExpert) // the plugin op too
	for _, name := range backend.Names() {
		have := backend.BoundOps(name)
		for _, op := range want {
			require.True(t, slices.Contains(have, op), "backend %s has no binding for op %s", name, op)
		}
		for _, op := range have {
			require.True(t, slices.Contains(want, op), "backend %s binds %s, which is not a kernel op of the IR", name, op)
		}
	}
}
