package cpu

import (
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/model/safetensors"
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
	require.Equal(t, gemm.Default(), gemmParams(&ir.Node{Op: ir.OpLinear, Attrs: ir.Attrs{}})(17))
	n := &ir.Node{Op: ir.OpLinear, Attrs: ir.NewAttrs(ir.AttrTuneBuckets.Is([]int{1, 64}), ir.AttrTuneColGrain.Is([]int{4, 16}), ir.AttrTuneRowBlock.Is([]int{16, 256}))}
	prm := gemmParams(n)
	require.Equal(t, gemm.Params{ColGrain: 4, RowBlock: 16}, prm(1))
	require.Equal(t, gemm.Params{ColGrain: 16, RowBlock: 256}, prm(2))
	require.Equal(t, gemm.Params{ColGrain: 16, RowBlock: 256}, prm(1000))
}

// FP8 weights become bf16 only when every code×scale is exactly bf16
// (power-of-two scales); otherwise the copy is refused (float32 is kept).
func TestFP8DequantIsExactOrRefused(t *testing.T) {
	codes := []byte{0x38, 0xb8, 0x3c, 0x01, 0x7e, 0x00} // 1, −1, 1.5, min subnormal, 448, 0
	raw := func(scale float32) *plan.RawTensor {
		return &plan.RawTensor{DType: safetensors.F8E4M3, Shape: []int{2, 3}, Block: [2]int{128, 128},
			Parts: []plan.RawPart{{Data: codes, Rows: 2, Cols: 3, Scales: []float32{scale}}}}
	}
	w := newWeights()
	for _, s := range []float32{1, 0.25, 1024} {
		b, err := w.copyBF16(6, func(b []uint16) bool { return dequantFP8BF16(b, raw(s)) })
		require.NoError(t, err)
		require.Len(t, b, 6)
		for i, c := range codes {
			require.Equal(t, safetensors.F8E4M3ToFloat32(c)*s, gemm.BF16ToFloat32(b[i]), "scale %g code %#x", s, c)
		}
	}
	b, err := w.copyBF16(6, func(b []uint16) bool { return dequantFP8BF16(b, raw(1.0/3)) })
	require.NoError(t, err)
	require.Nil(t, b, "1/3 scales are not bf16-exact")
	require.Len(t, w.anon, 3)
	require.NoError(t, w.close())
}

// The cpu backend opens in both precisions and says which; programs in
// bf16 pick the bf16-activation product for bf16 weights.
func TestPrecisionBF16IsAccepted(t *testing.T) {
	for _, prec := range []backend.Precision{"", "fp32", "bf16"} {
		b, err := backend.Open("cpu", backend.Options{Precision: prec})
		require.NoError(t, err, prec)
		want := prec
		if want == "" {
			want = "fp32"
		}
		require.Equal(t, want, b.Info().Precision)
		require.Equal(t, prec == "bf16", (&Program{opts: b.(*Backend).opts}).bf16Act())
		require.NoError(t, b.Close())
	}
}
