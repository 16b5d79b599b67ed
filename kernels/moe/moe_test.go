package moe

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/glmflash/glmflash/kernels/act"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/stretchr/testify/require"
)

func TestRouteUngrouped(t *testing.T) {
	r := &Router{Experts: 4, TopK: 2, Groups: 1, TopKGroup: 1, Normalize: true, Scaling: 2.5, Bias: []float32{0, 0, 1, 0}}
	logits := []float32{3, 2, -1, 0}
	idx := make([]int32, 2)
	w := make([]float32, 2)
	r.Route(idx, w, logits, 1)
	// biased choice: 0.95, 0.88, 1.27, 0.5 → experts 0 and 2, weights from unbiased sigmoid
	require.Equal(t, []int32{0, 2}, idx)
	s0, s2 := act.Sigmoid(3), act.Sigmoid(-1)
	require.InDelta(t, 2.5*s0/(s0+s2), w[0], 1e-6)
	require.InDelta(t, 2.5*s2/(s0+s2), w[1], 1e-6)
}

func TestRouteGroupLimited(t *testing.T) {
	// 6 experts in 3 groups of 2; the best single expert (5) sits in a group
	// whose pair-sum is lowest, so with topk_group=2 it must not be chosen.
	r := &Router{Experts: 6, TopK: 2, Groups: 3, TopKGroup: 2, Normalize: false, Scaling: 1, Bias: make([]float32, 6)}
	logits := []float32{1, 1, 0.5, 0.6, -5, 4}
	idx := make([]int32, 2)
	w := make([]float32, 2)
	r.Route(idx, w, logits, 1)
	require.Equal(t, []int32{0, 1}, idx)
	require.InDelta(t, act.Sigmoid(1), w[0], 1e-6)
}

func TestExpertsMatchPerTokenReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	N, D, I, T, K := 5, 7, 6, 9, 2
	f := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	ex := &Experts{N: N, D: D, I: I, Limit: 10}
	for e := 0; e < N; e++ {
		ex.Gate = append(ex.Gate, f(I*D))
		ex.Up = append(ex.Up, f(I*D))
		ex.Down = append(ex.Down, f(D*I))
	}
	x := f(T * D)
	idx := make([]int32, T*K)
	w := f(T * K)
	for t0 := 0; t0 < T; t0++ {
		a := rng.IntN(N)
		b := (a + 1 + rng.IntN(N-1)) % N
		if a > b {
			a, b = b, a
		}
		idx[t0*K], idx[t0*K+1] = int32(a), int32(b)
	}
	got := make([]float32, T*D)
	ex.Forward(got, x, idx, w, T, K)
	for t0 := 0; t0 < T; t0++ {
		for d := 0; d < D; d++ {
			var want float64
			for k := 0; k < K; k++ {
				e := idx[t0*K+k]
				h := make([]float64, I)
				for i := 0; i < I; i++ {
					var g, u float64
					for c := 0; c < D; c++ {
						g += float64(ex.Gate[e][i*D+c]) * float64(x[t0*D+c])
						u += float64(ex.Up[e][i*D+c]) * float64(x[t0*D+c])
					}
					g = math.Min(g, 10)
					u = math.Max(-10, math.Min(u, 10))
					h[i] = g / (1 + math.Exp(-g)) * u
				}
				var y float64
				for i := 0; i < I; i++ {
					y += float64(ex.Down[e][d*I+i]) * h[i]
				}
				want += float64(w[t0*K+k]) * y
			}
			require.InDelta(t, want, got[t0*D+d], 1e-4*(1+math.Abs(want)))
		}
	}
}

// BF16Act runs the bf16-weight experts on bf16-rounded activations: the
// output equals the fp32-activation one with the rounding applied to each
// GEMM's input (a reference built here), and differs from the unrounded.
func TestExpertsBF16Act(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	const N, D, I, T, K = 3, 40, 24, 5, 2
	bf := func(n int) []uint16 {
		s := make([]uint16, n)
		for i := range s {
			s[i] = gemm.Float32ToBF16(float32(r.NormFloat64() * 0.3))
		}
		return s
	}
	ex := &Experts{N: N, D: D, I: I, Limit: 10}
	for range N {
		ex.GateB, ex.UpB, ex.DownB = append(ex.GateB, bf(I*D)), append(ex.UpB, bf(I*D)), append(ex.DownB, bf(D*I))
	}
	x := make([]float32, T*D)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	idx := []int32{0, 1, 1, 2, 0, 2, 2, 1, 0, 1}
	w := []float32{0.5, 0.5, 0.3, 0.7, 1, 0.2, 0.6, 0.4, 0.9, 0.1}
	plain, rounded := make([]float32, T*D), make([]float32, T*D)
	ex.Forward(plain, x, idx, w, T, K)
	ex.BF16Act = true
	ex.Forward(rounded, x, idx, w, T, K)
	require.Greater(t, gemm.MaxRelDiff(rounded, plain), 1e-4)
	require.Less(t, gemm.MaxRelDiff(rounded, plain), 5e-2)
	// reference: token by token, each GEMM input rounded, products widened
	rnd := func(v []float32) []float32 {
		o := make([]float32, len(v))
		for i, f := range v {
			o[i] = gemm.BF16ToFloat32(gemm.Float32ToBF16(f))
		}
		return o
	}
	want := make([]float32, T*D)
	for t0 := 0; t0 < T; t0++ {
		for k := 0; k < K; k++ {
			e, xs := idx[t0*K+k], rnd(x[t0*D:(t0+1)*D])
			g, u, y := make([]float32, I), make([]float32, I), make([]float32, D)
			gemm.MatMulTBF16Naive(g, xs, 1, D, ex.GateB[e], I)
			gemm.MatMulTBF16Naive(u, xs, 1, D, ex.UpB[e], I)
			act.SwiGLUSerial(g, g, u, ex.Limit)
			gemm.MatMulTBF16Naive(y, rnd(g), 1, I, ex.DownB[e], D)
			for d := range y {
				want[t0*D+d] += w[t0*K+k] * y[d]
			}
		}
	}
	require.Less(t, gemm.MaxRelDiff(rounded, want), 1e-4)
}

// Routing and experts run through one reused Workspace give the results of
// fresh scratch, bit for bit, over batches of changing sizes; routing with
// a warm workspace allocates nothing.
func TestWorkspaceReuseIsExact(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	const E, K, D, I = 8, 2, 16, 24
	rt := &Router{Experts: E, TopK: K, Groups: 2, TopKGroup: 1, Normalize: true, Scaling: 2.5, Bias: make([]float32, E)}
	ex := &Experts{N: E, D: D, I: I, Limit: 7}
	for e := 0; e < E; e++ {
		rt.Bias[e] = r.Float32() - 0.5
		ex.Gate = append(ex.Gate, randVec(r, I*D))
		ex.Up = append(ex.Up, randVec(r, I*D))
		ex.Down = append(ex.Down, randVec(r, D*I))
	}
	ws := new(Workspace)
	for _, T := range []int{5, 1, 9, 3} {
		logits, x := randVec(r, T*E), randVec(r, T*D)
		idx, w := make([]int32, T*K), make([]float32, T*K)
		idx2, w2 := make([]int32, T*K), make([]float32, T*K)
		rt.Route(idx, w, logits, T)
		rt.RouteWith(ws, idx2, w2, logits, T)
		require.Equal(t, idx, idx2)
		require.Equal(t, w, w2)
		y, y2 := make([]float32, T*D), make([]float32, T*D)
		ex.Forward(y, x, idx, w, T, K)
		ex.ForwardWith(ws, y2, x, idx, w, T, K)
		require.Equal(t, y, y2, "T=%d", T)
		require.Zero(t, testing.AllocsPerRun(5, func() { rt.RouteWith(ws, idx2, w2, logits, T) }))
	}
}

func randVec(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = r.Float32()*2 - 1
	}
	return v
}
