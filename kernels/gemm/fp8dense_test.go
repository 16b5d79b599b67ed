package gemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/glmflash/glmflash/kernels/parallel"
	"github.com/stretchr/testify/require"
)

// randParts returns FP8 parts of the given row counts (K columns, blocks
// br×bc) and their dequantized row concatenation.
func randParts(r *rand.Rand, rows []int, K, br, bc int, pow2 bool) ([]*FP8, []float32, int) {
	var parts []*FP8
	var deq []float32
	N := 0
	for _, n := range rows {
		w := randFP8(r, n, K, br, bc, pow2)
		parts = append(parts, w)
		deq = append(deq, w.Dequant(n, K)...)
		N += n
	}
	return parts, deq, N
}

func bitsEqual(t *testing.T, want, got []float32, msg string, args ...any) {
	t.Helper()
	for i := range want {
		if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
			require.Failf(t, "bits differ", "i=%d want %v got %v: "+msg, append([]any{i, want[i], got[i]}, args...)...)
		}
	}
}

// The dense FP8 product, split over any number of workers and over the
// parts of a row-concatenated weight (a part's rows not a multiple of the
// scale block, N not a multiple of the block or of the work unit), equals
// MatMulT on the dequantized concatenation bit for bit, at decode (T=1),
// fused-kernel (T≤8) and tile (T>8) heights, in every implementation.
func TestMatMulTFP8PartsMatchesDequantized(t *testing.T) {
	defer func() { _ = SetImpl("") }()
	oldW := parallel.Workers
	defer func() { parallel.Workers = oldW }()
	r := rand.New(rand.NewPCG(21, 22))
	for _, name := range Impls() {
		require.NoError(t, SetImpl(name))
		for _, sh := range []struct {
			rows      []int
			K, br, bc int
		}{
			{[]int{300}, 256, 128, 128},          // one matrix, N past the block
			{[]int{256, 128, 77}, 320, 128, 128}, // concat: whole blocks, then a partial last part
			{[]int{40, 40, 13}, 129, 20, 32},     // small blocks, K tail
			{[]int{5}, 64, 128, 128},             // fewer rows than a work unit
		} {
			for _, pow2 := range []bool{false, true} {
				parts, deq, N := randParts(r, sh.rows, sh.K, sh.br, sh.bc, pow2)
				for _, T := range []int{1, 3, 8, 9, 17, 70, 300} {
					x := make([]float32, T*sh.K)
					for i := range x {
						x[i] = float32(r.NormFloat64())
					}
					want := make([]float32, T*N)
					MatMulT(want, x, T, sh.K, deq, N)
					for _, nw := range []int{1, 2, 3, 7} {
						parallel.Workers = nw
						got := make([]float32, T*N)
						MatMulTFP8Parts(got, x, T, sh.K, parts, N)
						bitsEqual(t, want, got, "%s %+v pow2=%v T=%d workers=%d", name, sh, pow2, T, nw)
						if len(parts) == 1 {
							clear(got)
							MatMulTFP8(got, x, T, sh.K, parts[0], N)
							bitsEqual(t, want, got, "%s %+v one T=%d workers=%d", name, sh, T, nw)
						}
					}
					parallel.Workers = oldW
				}
			}
		}
	}
}

// With bf16 activations: for bf16-exact weights (power-of-two scales) the
// tile path equals MatMulTBF16Act on the dequantized weights bit for bit
// where it runs the VDPBF16PS kernels (T > 8), and every other case equals
// the fp32 product of the rounded activations (MatMulTFP8Parts), bit for
// bit.
func TestMatMulTFP8PartsAct(t *testing.T) {
	defer func() { _ = SetImpl("") }()
	oldW := parallel.Workers
	defer func() { parallel.Workers = oldW }()
	r := rand.New(rand.NewPCG(23, 24))
	for _, name := range Impls() {
		require.NoError(t, SetImpl(name))
		for _, pow2 := range []bool{false, true} {
			parts, deq, N := randParts(r, []int{256, 200}, 384, 128, 128, pow2)
			exact := true
			for _, w := range parts {
				exact = exact && w.BF16Exact(384)
			}
			require.Equal(t, pow2, exact)
			bf := make([]uint16, len(deq))
			Float32sToBF16(bf, deq)
			for _, T := range []int{1, 8, 9, 33, 70} {
				x := make([]float32, T*384)
				xr := make([]float32, len(x))
				for i := range x {
					x[i] = float32(r.NormFloat64())
					xr[i] = BF16ToFloat32(Float32ToBF16(x[i]))
				}
				want := make([]float32, T*N)
				if pow2 && BF16Dot() && T > fp8FusedRows {
					MatMulTBF16Act(want, x, T, 384, bf, N)
				} else {
					MatMulTFP8Parts(want, xr, T, 384, parts, N)
				}
				for _, nw := range []int{1, 2, 5} {
					parallel.Workers = nw
					got := make([]float32, T*N)
					MatMulTFP8PartsAct(got, x, T, 384, parts, N)
					bitsEqual(t, want, got, "%s pow2=%v T=%d workers=%d", name, pow2, T, nw)
					if pow2 {
						ref := make([]float32, T*N)
						MatMulTBF16Act(ref, x, T, 384, bf, N)
						require.Less(t, MaxRelDiff(got, ref), 1e-4, "%s T=%d", name, T)
					}
				}
				parallel.Workers = oldW
			}
		}
	}
}

// BF16Exact admits power-of-two scales in the normal range without a scan
// and checks other scales code by code: 1/3 is refused, a tiny power of
// two whose products fall below bf16's subnormals is refused, and a scale
// of 3 (2 significant bits: 4 + 2 ≤ 8) is admitted.
func TestFP8BF16Exact(t *testing.T) {
	mk := func(s float32) *FP8 {
		codes := make([]byte, 3*40)
		for i := range codes {
			codes[i] = byte(i) &^ 0x80
			if codes[i] == 0x7f {
				codes[i] = 0x7e
			}
		}
		return &FP8{Codes: codes, Scales: []float32{1, s, 1, 1}, BlockRows: 2, BlockCols: 32, ScaleCols: 2}
	}
	for _, c := range []struct {
		s    float32
		want bool
	}{{0.25, true}, {1024, true}, {1.0 / 3, false}, {float32(math.Ldexp(1, -130)), false}, {3, true}, {float32(math.Ldexp(1, -124)), true}} {
		w := mk(c.s)
		got := w.BF16Exact(40)
		require.Equal(t, c.want, got, "scale %g", c.s)
		require.Equal(t, c.want, w.BF16Exact(40), "cached")
		exact := true
		for _, v := range w.Dequant(3, 40) {
			if math.Float32bits(v)&0xffff != 0 {
				exact = false
			}
		}
		require.Equal(t, exact, got, "scale %g: the scan and the values agree", c.s)
	}
}

// A prefill's rows (several row blocks, packed once for every worker) on
// the bf16 tiles equal MatMulTBF16Act on the dequantized weights bit for
// bit, and on the fp32 tiles (scales not powers of two) the product of
// the rounded activations, whatever the workers.
func TestMatMulTFP8PartsActPrefill(t *testing.T) {
	defer func() { _ = SetImpl("") }()
	oldW := parallel.Workers
	defer func() { parallel.Workers = oldW }()
	r := rand.New(rand.NewPCG(29, 30))
	const T, K = 400, 384
	for _, name := range Impls() {
		require.NoError(t, SetImpl(name))
		for _, pow2 := range []bool{false, true} {
			parts, deq, N := randParts(r, []int{256, 200}, K, 128, 128, pow2)
			bf := make([]uint16, len(deq))
			Float32sToBF16(bf, deq)
			x := make([]float32, T*K)
			xr := make([]float32, len(x))
			for i := range x {
				x[i] = float32(r.NormFloat64())
				xr[i] = BF16ToFloat32(Float32ToBF16(x[i]))
			}
			want := make([]float32, T*N)
			parallel.Workers = 1
			if pow2 && BF16Dot() {
				MatMulTBF16Act(want, x, T, K, bf, N)
			} else {
				MatMulTFP8Parts(want, xr, T, K, parts, N)
			}
			for _, nw := range []int{1, 2, 5} {
				parallel.Workers = nw
				got := make([]float32, T*N)
				MatMulTFP8PartsAct(got, x, T, K, parts, N)
				bitsEqual(t, want, got, "%s pow2=%v workers=%d", name, pow2, nw)
			}
			parallel.Workers = oldW
		}
	}
}

// A warm dense FP8 product allocates nothing (decode and prefill heights,
// the latter also with the rows packed once for all workers, T ≥ 64;
// both precisions).
func TestMatMulTFP8PartsNoAlloc(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	parts, _, N := randParts(r, []int{128, 64}, 256, 128, 128, true)
	for _, T := range []int{1, 20, 70} {
		x, dst := make([]float32, T*256), make([]float32, T*N)
		MatMulTFP8Parts(dst, x, T, 256, parts, N)
		MatMulTFP8PartsAct(dst, x, T, 256, parts, N)
		MatMulTFP8(dst, x, T, 256, parts[0], 128)
		if raceOn {
			t.Skip("sync.Pool drops items under the race detector")
		}
		require.Zero(t, testing.AllocsPerRun(10, func() { MatMulTFP8Parts(dst, x, T, 256, parts, N) }), "T=%d", T)
		require.Zero(t, testing.AllocsPerRun(10, func() { MatMulTFP8PartsAct(dst, x, T, 256, parts, N) }), "T=%d act", T)
		require.Zero(t, testing.AllocsPerRun(10, func() { MatMulTFP8(dst, x[:T*256], T, 256, parts[0], 128) }), "T=%d one", T)
	}
}

// BenchmarkDenseFP8 compares a dense FP8 product (a bench-preset dense MLP
// gate: K=1024, N=2816; split over the workers) with the same weights as a
// bf16 copy, in both precisions, at decode and prefill heights.
func BenchmarkDenseFP8(b *testing.B) {
	r := rand.New(rand.NewPCG(27, 28))
	const K, N = 1024, 2816
	w := randFP8(r, N, K, 128, 128, true)
	bf := make([]uint16, N*K)
	Float32sToBF16(bf, w.Dequant(N, K))
	parts := []*FP8{w}
	for _, T := range []int{1, 8, 64, 512} {
		x, dst := make([]float32, T*K), make([]float32, T*N)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		for _, c := range []struct {
			name string
			f    func()
		}{
			{"fp32/fp8", func() { MatMulTFP8Parts(dst, x, T, K, parts, N) }},
			{"fp32/bf16", func() { MatMulTBF16With(Default(), dst, x, T, K, bf, N) }},
			{"bf16/fp8", func() { MatMulTFP8PartsAct(dst, x, T, K, parts, N) }},
			{"bf16/bf16", func() { MatMulTBF16ActWith(Default(), dst, x, T, K, bf, N) }},
		} {
			b.Run(fmt.Sprintf("T=%d/%s", T, c.name), func(b *testing.B) {
				b.ReportMetric(0, "ns/op")
				for range b.N {
					c.f()
				}
				b.ReportMetric(2*float64(T*N*K)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}
