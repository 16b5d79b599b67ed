package cpu

import (
	"testing"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/stretchr/testify/require"
)

// Every op with the GEMM trait is bound with bindGEMM (its binder gets the
// tuned kernel parameters), and only those are.
func TestEveryGEMMOpIsTunable(t *testing.T) {
	var gemms []string
	for _, op := range ir.OpNames() {
		if d, _ := ir.Lookup(op); d.GEMM != nil {
			gemms = append(gemms, op)
			require.True(t, tunable[op], "GEMM-trait op %s is not bound with bindGEMM: tuned parameters would be ignored", op)
		}
	}
	require.NotEmpty(t, gemms)
	for op := range tunable {
		d, _ := ir.Lookup(op)
		require.NotNil(t, d.GEMM, "op %s is bound as tunable but has no GEMM trait: no pass would tune it", op)
	}
}

// A node's tuned attributes choose the parameters of the smallest bucket
// holding the batch (else the largest); without them, the defaults.
func TestGEMMParamsFollowTheTuneAttributes(t *testing.T) {
	require.Equal(t, gemm.Default(), gemmParams(&ir.Node{Attrs: ir.Attrs{}})(17))
	n := &ir.Node{Attrs: ir.Attrs{ir.AttrTuneBuckets: []int{1, 64}, ir.AttrTuneColGrain: []int{4, 16}, ir.AttrTuneRowBlock: []int{16, 256}}}
	prm := gemmParams(n)
	require.Equal(t, gemm.Params{ColGrain: 4, RowBlock: 16}, prm(1))
	require.Equal(t, gemm.Params{ColGrain: 16, RowBlock: 256}, prm(2))
	require.Equal(t, gemm.Params{ColGrain: 16, RowBlock: 256}, prm(1000))
}
