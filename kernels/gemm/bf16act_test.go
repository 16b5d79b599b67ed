package gemm

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// refBF16Act is the float64 reference of MatMulTBF16Act: the activations
// rounded to bf16, the products and their sum in float64. It also returns
// Σ|x·w| per output (the scale of the fp32 summation error).
func refBF16Act(x []float32, T, K int, w []uint16, N int) (ref, abs []float64) {
	ref, abs = make([]float64, T*N), make([]float64, T*N)
	for t := 0; t < T; t++ {
		for n := 0; n < N; n++ {
			var s, a float64
			for k := 0; k < K; k++ {
				p := float64(BF16ToFloat32(Float32ToBF16(x[t*K+k]))) * float64(BF16ToFloat32(w[n*K+k]))
				s += p
				a += math.Abs(p)
			}
			ref[t*N+n], abs[t*N+n] = s, a
		}
	}
	return ref, abs
}

// checkBF16Act runs MatMulTBF16Act on one shape and compares it with the
// float64 reference: the products of bf16 values are exact in fp32, so the
// only error is the fp32 summation, |Δ| ≤ K·2⁻²⁴·Σ|x·w| (the standard
// bound; a summation tree does much better). The weights are followed by
// Inf and NaN, which the masked tail must never read.
func checkBF16Act(t *testing.T, r *rand.Rand, T, K, N int) {
	x := randSlice(r, T*K)
	w := append(randBF16(r, N*K), 0x7f80, 0x7fc0, 0xff80, 0x7fc0)
	for i := 0; i < 64; i++ {
		w = append(w, 0x7fc0)
	}
	d := make([]float32, T*N)
	MatMulTBF16Act(d, x, T, K, w[:N*K:N*K], N)
	ref, abs := refBF16Act(x, T, K, w, N)
	for i := range d {
		bound := float64(K)*0x1p-24*abs[i] + 1e-30
		require.LessOrEqual(t, math.Abs(float64(d[i])-ref[i]), bound, "T%d K%d N%d out %d: %v vs %v", T, K, N, i, d[i], ref[i])
	}
}

func TestMatMulTBF16ActMatchesReference(t *testing.T) {
	t.Logf("VDPBF16PS kernels: %v", BF16Dot())
	eachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(7, 8))
		for _, s := range [][3]int{
			{1, 1, 1}, {1, 31, 3}, {1, 32, 8}, {1, 33, 9}, {2, 63, 17}, {3, 64, 5},
			{4, 65, 6}, {5, 95, 13}, {7, 100, 25}, {9, 257, 31}, {13, 1000, 7},
			{70, 48, 50}, {130, 33, 19}, {1, 2048, 40}, {6, 4099, 3},
		} {
			checkBF16Act(t, r, s[0], s[1], s[2])
		}
	})
}

// The rounding really happens: the result differs from the fp32-activation
// product, and equals MatMulTBF16 of the pre-rounded activations to fp32
// summation-order precision.
func TestMatMulTBF16ActRounds(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	T, K, N := 5, 300, 11
	x, w := randSlice(r, T*K), randBF16(r, N*K)
	a, f := make([]float32, T*N), make([]float32, T*N)
	MatMulTBF16Act(a, x, T, K, w, N)
	MatMulTBF16(f, x, T, K, w, N)
	require.Greater(t, maxRelDiff(a, f), 1e-4, "bf16 activations change the result")
	xr := make([]float32, len(x))
	for i, v := range x {
		xr[i] = BF16ToFloat32(Float32ToBF16(v))
	}
	MatMulTBF16(f, xr, T, K, w, N)
	require.Less(t, maxRelDiff(a, f), tol(K))
}

// Every output is one fixed computation: a row alone equals the same row in
// a batch (bit for bit), serial equals parallel, whatever Params.
func TestMatMulTBF16ActBatchInvariance(t *testing.T) {
	eachImpl(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(5, 6))
		T, K, N := 37, 515, 61
		x, w := randSlice(r, T*K), randBF16(r, N*K)
		all := make([]float32, T*N)
		MatMulTBF16Act(all, x, T, K, w, N)
		ser := make([]float32, T*N)
		MatMulTBF16ActSerial(ser, x, T, K, w, N)
		require.Equal(t, all, ser)
		odd := make([]float32, T*N)
		MatMulTBF16ActWith(Params{ColGrain: 3, RowBlock: 5}, odd, x, T, K, w, N)
		require.Equal(t, all, odd)
		one := make([]float32, N)
		for _, row := range []int{0, 3, 36} {
			MatMulTBF16Act(one, x[row*K:(row+1)*K], 1, K, w, N)
			require.Equal(t, all[row*N:(row+1)*N], one, "row %d", row)
		}
	})
}

// BenchmarkBF16Act compares, on a 512×1024×1024 GEMM (T×K×N), the
// VDPBF16PS kernel (bf16 activations) with the fp32-activation bf16-weight
// kernel: interleaved rounds, the median GFLOP/s of each reported.
func BenchmarkBF16Act(b *testing.B) {
	const T, K, N, rounds = 512, 1024, 1024, 9
	r := rand.New(rand.NewPCG(1, 2))
	x, w, d := randSlice(r, T*K), randBF16(r, N*K), make([]float32, T*N)
	flop := float64(2 * T * K * N)
	gflops := func(f func()) float64 {
		f() // warm
		n, t0 := 0, time.Now()
		for time.Since(t0) < 200*time.Millisecond {
			f()
			n++
		}
		return flop * float64(n) / time.Since(t0).Seconds() / 1e9
	}
	for b.Loop() {
		var act, wgt []float64
		for range rounds {
			act = append(act, gflops(func() { MatMulTBF16Act(d, x, T, K, w, N) }))
			wgt = append(wgt, gflops(func() { MatMulTBF16(d, x, T, K, w, N) }))
		}
		slices.Sort(act)
		slices.Sort(wgt)
		b.ReportMetric(act[rounds/2], "bf16act_GFLOP/s")
		b.ReportMetric(wgt[rounds/2], "fp32act_GFLOP/s")
		b.ReportMetric(act[rounds/2]/wgt[rounds/2], "speedup")
		b.Logf("impl %s, VDPBF16PS %v: bf16 act %v, fp32 act %v", Impl(), BF16Dot(), act, wgt)
	}
}

// The vector rounding equals Float32ToBF16 bit for bit: random bit
// patterns (NaNs, infinities, subnormals, ties) and the edge cases.
func TestRoundRowBF16(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	src := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()),
		math.Float32frombits(0x7f800001), math.Float32frombits(0xff800001), math.Float32frombits(0x7fffffff),
		math.Float32frombits(0x3f808000), math.Float32frombits(0x3f818000), math.Float32frombits(0x7f7fffff), math.Float32frombits(1)}
	for len(src) < 1003 {
		src = append(src, math.Float32frombits(r.Uint32()))
	}
	got, want := make([]uint16, len(src)), make([]uint16, len(src))
	Float32sToBF16(want, src)
	for _, n := range []int{0, 1, 15, 16, 17, 100, len(src)} {
		clear(got)
		roundRowBF16(got[:n], src[:n])
		require.Equal(t, want[:n], got[:n], "n=%d", n)
	}
}
