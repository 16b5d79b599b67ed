package kda

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

type inputs struct {
	q, k, v, g, beta []float32
}

func makeInputs(r *rand.Rand, T, Dk, Dv int) inputs {
	f := func(n int, s float64) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64() * s)
		}
		return x
	}
	in := inputs{q: f(T*Dk, 1), k: f(T*Dk, 1), v: f(T*Dv, 1), g: make([]float32, T*Dk), beta: make([]float32, T)}
	for i := range in.g {
		in.g[i] = float32(-5 / (1 + math.Exp(-r.NormFloat64()))) // (−5, 0) like the safe gate
	}
	for i := range in.beta {
		in.beta[i] = float32(1 / (1 + math.Exp(-r.NormFloat64())))
	}
	L2Normalize(in.q, T, Dk, 1e-6, float32(1/math.Sqrt(float64(Dk))))
	L2Normalize(in.k, T, Dk, 1e-6, 1)
	return in
}

// naive is the recurrent definition in float64.
func naive(in inputs, T, Dk, Dv int, S0 []float32) ([]float64, []float64) {
	S := make([]float64, Dk*Dv)
	for i := range S0 {
		S[i] = float64(S0[i])
	}
	o := make([]float64, T*Dv)
	for t := 0; t < T; t++ {
		for c := 0; c < Dk; c++ {
			e := math.Exp(float64(in.g[t*Dk+c]))
			for x := 0; x < Dv; x++ {
				S[c*Dv+x] *= e
			}
		}
		for x := 0; x < Dv; x++ {
			var p float64
			for c := 0; c < Dk; c++ {
				p += S[c*Dv+x] * float64(in.k[t*Dk+c])
			}
			d := float64(in.beta[t]) * (float64(in.v[t*Dv+x]) - p)
			for c := 0; c < Dk; c++ {
				S[c*Dv+x] += float64(in.k[t*Dk+c]) * d
			}
		}
		for x := 0; x < Dv; x++ {
			var s float64
			for c := 0; c < Dk; c++ {
				s += S[c*Dv+x] * float64(in.q[t*Dk+c])
			}
			o[t*Dv+x] = s
		}
	}
	return o, S
}

func requireClose(t *testing.T, want []float64, got []float32, tol float64, msg string) {
	t.Helper()
	for i := range want {
		require.InDelta(t, want[i], float64(got[i]), tol*(1+math.Abs(want[i])), "%s at %d", msg, i)
	}
}

func TestChunkedAndRecurrentMatchNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for _, sh := range [][3]int{{1, 4, 4}, {5, 8, 6}, {63, 16, 16}, {64, 8, 8}, {65, 8, 12}, {130, 16, 16}, {200, 7, 5}} {
		T, Dk, Dv := sh[0], sh[1], sh[2]
		in := makeInputs(r, T, Dk, Dv)
		S0 := make([]float32, Dk*Dv)
		for i := range S0 {
			S0[i] = float32(r.NormFloat64() * 0.3)
		}
		wantO, wantS := naive(in, T, Dk, Dv, S0)

		S := append([]float32(nil), S0...)
		o := make([]float32, T*Dv)
		Recurrent(o, in.q, in.k, in.v, in.g, in.beta, T, Dk, Dv, S)
		requireClose(t, wantO, o, 1e-4, "recurrent o")
		requireClose(t, wantS, S, 1e-4, "recurrent S")

		S = append([]float32(nil), S0...)
		o = make([]float32, T*Dv)
		Chunked(o, in.q, in.k, in.v, in.g, in.beta, T, Dk, Dv, S)
		requireClose(t, wantO, o, 1e-4, "chunked o")
		requireClose(t, wantS, S, 1e-4, "chunked S")
	}
}

func TestChunkedContinuationMatchesOneCall(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	T, Dk, Dv := 150, 8, 8
	in := makeInputs(r, T, Dk, Dv)
	wantO, wantS := naive(in, T, Dk, Dv, make([]float32, Dk*Dv))
	S := make([]float32, Dk*Dv)
	o := make([]float32, T*Dv)
	for _, span := range [][2]int{{0, 70}, {70, 71}, {71, 150}} {
		a, b := span[0], span[1]
		if b-a == 1 {
			Recurrent(o[a*Dv:b*Dv], in.q[a*Dk:b*Dk], in.k[a*Dk:b*Dk], in.v[a*Dv:b*Dv], in.g[a*Dk:b*Dk], in.beta[a:b], b-a, Dk, Dv, S)
		} else {
			Chunked(o[a*Dv:b*Dv], in.q[a*Dk:b*Dk], in.k[a*Dk:b*Dk], in.v[a*Dv:b*Dv], in.g[a*Dk:b*Dk], in.beta[a:b], b-a, Dk, Dv, S)
		}
	}
	requireClose(t, wantO, o, 1e-4, "o")
	requireClose(t, wantS, S, 1e-4, "S")
}

func BenchmarkChunked(b *testing.B) {
	r := rand.New(rand.NewPCG(9, 9))
	T, D := 512, 128
	in := makeInputs(r, T, D, D)
	o := make([]float32, T*D)
	S := make([]float32, D*D)
	for i := 0; i < b.N; i++ {
		Chunked(o, in.q, in.k, in.v, in.g, in.beta, T, D, D, S)
	}
}

// TestChunkedBlockedMatchesScalar checks the blocked form against the scalar
// pairwise form at the model's head size with tails (T not a multiple of
// the chunk or the sub-block), from a non-zero state, and that a gate
// outside [BlockedMinG, 0] takes the scalar form and still matches the
// recurrent definition.
func TestChunkedBlockedMatchesScalar(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 10))
	for _, sh := range [][3]int{{1, 128, 128}, {17, 128, 128}, {64, 128, 128}, {100, 128, 128}, {129, 32, 48}, {7, 5, 3}} {
		T, Dk, Dv := sh[0], sh[1], sh[2]
		in := makeInputs(r, T, Dk, Dv)
		S0 := make([]float32, Dk*Dv)
		for i := range S0 {
			S0[i] = float32(r.NormFloat64() * 0.3)
		}
		require.True(t, blockedOK(in.g))
		wantO, wantS := naive(in, T, Dk, Dv, S0)
		S1, S2 := append([]float32(nil), S0...), append([]float32(nil), S0...)
		o1, o2 := make([]float32, T*Dv), make([]float32, T*Dv)
		var ws Workspace
		ws.chunkedBlocked(o1, in.q, in.k, in.v, in.g, in.beta, T, Dk, Dv, S1)
		ws.chunkedScalar(o2, in.q, in.k, in.v, in.g, in.beta, T, Dk, Dv, S2)
		requireClose(t, wantO, o1, 1e-4, "blocked o")
		requireClose(t, wantS, S1, 1e-4, "blocked S")
		for i := range o1 {
			require.InDelta(t, o2[i], o1[i], 1e-5*(1+math.Abs(float64(o2[i]))), "o at %d (T %d)", i, T)
		}
		for i := range S1 {
			require.InDelta(t, S2[i], S1[i], 1e-5*(1+math.Abs(float64(S2[i]))), "S at %d (T %d)", i, T)
		}
	}
	// a gate below the blocked range (the softplus gate is unbounded below)
	T, Dk, Dv := 70, 16, 16
	in := makeInputs(r, T, Dk, Dv)
	in.g[5*Dk+3] = -30
	require.False(t, blockedOK(in.g))
	wantO, wantS := naive(in, T, Dk, Dv, make([]float32, Dk*Dv))
	S := make([]float32, Dk*Dv)
	o := make([]float32, T*Dv)
	Chunked(o, in.q, in.k, in.v, in.g, in.beta, T, Dk, Dv, S)
	requireClose(t, wantO, o, 1e-4, "scalar o")
	requireClose(t, wantS, S, 1e-4, "scalar S")
}

func BenchmarkChunkedScalar(b *testing.B) {
	r := rand.New(rand.NewPCG(9, 9))
	T, D := 512, 128
	in := makeInputs(r, T, D, D)
	o := make([]float32, T*D)
	S := make([]float32, D*D)
	var ws Workspace
	for i := 0; i < b.N; i++ {
		ws.chunkedScalar(o, in.q, in.k, in.v, in.g, in.beta, T, D, D, S)
	}
}
