package cpu

import (
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/stretchr/testify/require"
)

// Every executable op of the IR has a CPU binding (const ops are folded by
// the plan and need none).
func TestEveryOpBound(t *testing.T) {
	var want []string
	for _, op := range ir.OpNames() {
		if d, _ := ir.Lookup(op); !d.Const {
			want = append(want, op)
		}
	}
	require.Empty(t, backend.MissingOps(New(backend.Options{}), want), "ops without a CPU binding")
}
