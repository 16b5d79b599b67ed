package mhc

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSinkhornIsNearlyDoublyStochastic(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 3))
	for _, H := range []int{1, 2, 3, 4} {
		p := &Params{H: H, D: 8, Base: make([]float32, (2+H)*H), Scale: []float32{1, 1, 1}, HCEps: 1e-6, Iterations: 20}
		m := make([]float32, (2+H)*H)
		for i := range m {
			m[i] = float32(r.NormFloat64() * 2)
		}
		pre, post, comb := make([]float32, H), make([]float32, H), make([]float32, H*H)
		Mapping(p, m, pre, post, comb)
		for j := 0; j < H; j++ {
			var s float64
			for i := 0; i < H; i++ {
				s += float64(comb[i*H+j])
			}
			require.InDelta(t, 1, s, 1e-4, "column %d", j)
		}
		for i := 0; i < H; i++ {
			require.True(t, post[i] > 0 && post[i] < 2)
			require.True(t, pre[i] > 0 && pre[i] < 1.0001)
		}
	}
}

// float64 re-statement of the mHC pre step.
func TestPreMatchesFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 3))
	H, D, T := 3, 5, 2
	mix := (2 + H) * H
	f := func(n int, s float64) []float32 { return randVec(r, n, s) }
	p := &Params{H: H, D: D, Fn: f(mix*H*D, 0.3), Base: f(mix, 0.5), Scale: []float32{0.7, 1.2, 0.9}, NormEps: 1e-5, HCEps: 1e-6, Iterations: 20}
	X := f(T*H*D, 1)
	h, post, comb := make([]float32, T*D), make([]float32, T*H), make([]float32, T*H*H)
	Pre(p, h, post, comb, X, T)
	for ti := 0; ti < T; ti++ {
		x := X[ti*H*D : (ti+1)*H*D]
		var ss float64
		for _, v := range x {
			ss += float64(v) * float64(v)
		}
		rr := 1 / math.Sqrt(ss/float64(H*D)+1e-5)
		m := make([]float64, mix)
		for i := range m {
			for k := range x {
				m[i] += float64(p.Fn[i*H*D+k]) * float64(x[k]) * rr
			}
		}
		sig := func(v float64) float64 { return 1 / (1 + math.Exp(-v)) }
		C := make([]float64, H*H)
		for i := 0; i < H; i++ {
			var s float64
			for j := 0; j < H; j++ {
				C[i*H+j] = math.Exp(float64(p.Scale[2])*m[2*H+i*H+j] + float64(p.Base[2*H+i*H+j]))
				s += C[i*H+j]
			}
			for j := 0; j < H; j++ {
				C[i*H+j] = C[i*H+j]/s + 1e-6
			}
		}
		col := func() {
			for j := 0; j < H; j++ {
				var s float64
				for i := 0; i < H; i++ {
					s += C[i*H+j]
				}
				for i := 0; i < H; i++ {
					C[i*H+j] /= s + 1e-6
				}
			}
		}
		col()
		for it := 1; it < 20; it++ {
			for i := 0; i < H; i++ {
				var s float64
				for j := 0; j < H; j++ {
					s += C[i*H+j]
				}
				for j := 0; j < H; j++ {
					C[i*H+j] /= s + 1e-6
				}
			}
			col()
		}
		for i := 0; i < H*H; i++ {
			require.InDelta(t, C[i], comb[ti*H*H+i], 1e-5)
		}
		for i := 0; i < H; i++ {
			require.InDelta(t, 2*sig(float64(p.Scale[1])*m[H+i]+float64(p.Base[H+i])), post[ti*H+i], 1e-5)
		}
		for d := 0; d < D; d++ {
			var s float64
			for i := 0; i < H; i++ {
				s += (sig(float64(p.Scale[0])*m[i]+float64(p.Base[i])) + 1e-6) * float64(x[i*D+d])
			}
			require.InDelta(t, s, h[ti*D+d], 1e-5)
		}
	}
	// Post uses the transpose of comb.
	o := f(T*D, 1)
	out := make([]float32, T*H*D)
	Post(out, o, X, post, comb, T, H, D)
	for ti := 0; ti < T; ti++ {
		for j := 0; j < H; j++ {
			for d := 0; d < D; d++ {
				want := float64(post[ti*H+j]) * float64(o[ti*D+d])
				for i := 0; i < H; i++ {
					want += float64(comb[ti*H*H+i*H+j]) * float64(X[(ti*H+i)*D+d])
				}
				require.InDelta(t, want, out[(ti*H+j)*D+d], 1e-5)
			}
		}
	}
}

func TestPostPreFusedEqualsUnfusedBitForBit(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	H, D, T := 4, 12, 5
	mix := (2 + H) * H
	f := func(n int, s float64) []float32 { return randVec(r, n, s) }
	p := &Params{H: H, D: D, Fn: f(mix*H*D, 0.2), Base: f(mix, 0.5), Scale: []float32{1, 0.8, 1.1}, NormEps: 1e-5, HCEps: 1e-6, Iterations: 20}
	o, R, post, comb := f(T*D, 1), f(T*H*D, 1), f(T*H, 1), f(T*H*H, 0.3)
	normW := f(D, 1)
	mk := func() *PostPreArgs {
		return &PostPreArgs{Out: make([]float32, T*H*D), H2: make([]float32, T*D), Post2: make([]float32, T*H), Comb2: make([]float32, T*H*H),
			O: o, R: R, Post: post, Comb: comb, NormW: normW, NormEps: 1e-5}
	}
	a, b := mk(), mk()
	PostPre(p, a, T)
	PostPreUnfused(p, b, T)
	require.Equal(t, b.Out, a.Out)
	require.Equal(t, b.H2, a.H2)
	require.Equal(t, b.Post2, a.Post2)
	require.Equal(t, b.Comb2, a.Comb2)
}

// Pre over T tokens (mixing logits from one product per block of preRows
// tokens, with a tail) equals Pre token by token (Dot) bit for bit.
func TestPreBlocksEqualTokenByToken(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	H, D, T := 4, 40, 2*preRows+3
	mix := (2 + H) * H
	f := func(n int, s float64) []float32 { return randVec(r, n, s) }
	p := &Params{H: H, D: D, Fn: f(mix*H*D, 0.2), Base: f(mix, 0.5), Scale: []float32{1, 0.8, 1.1}, NormEps: 1e-5, HCEps: 1e-6, Iterations: 20}
	X := f(T*H*D, 1)
	h1, post1, comb1 := make([]float32, T*D), make([]float32, T*H), make([]float32, T*H*H)
	h2, post2, comb2 := make([]float32, T*D), make([]float32, T*H), make([]float32, T*H*H)
	Pre(p, h1, post1, comb1, X, T)
	for tk := 0; tk < T; tk++ {
		Pre(p, h2[tk*D:(tk+1)*D], post2[tk*H:(tk+1)*H], comb2[tk*H*H:(tk+1)*H*H], X[tk*H*D:(tk+1)*H*D], 1)
	}
	require.Equal(t, h2, h1)
	require.Equal(t, post2, post1)
	require.Equal(t, comb2, comb1)
}

// randVec is n normal values of standard deviation s.
func randVec(r *rand.Rand, n int, s float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * s)
	}
	return x
}
