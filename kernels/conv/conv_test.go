package conv

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/glmflash/glmflash/kernels/act"
	"github.com/stretchr/testify/require"
)

func naive(u []float32, T, C int, w []float32, K int) []float32 {
	out := make([]float32, T*C)
	for t := 0; t < T; t++ {
		for c := 0; c < C; c++ {
			var s float32
			for j := 0; j < K; j++ {
				p := t - (K - 1) + j
				if p >= 0 {
					s += w[c*K+j] * u[p*C+c]
				}
			}
			out[t*C+c] = act.SiLU(s)
		}
	}
	return out
}

func TestCausalSiLUSplitCallsMatchOneCall(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for _, sh := range [][3]int{{1, 3, 4}, {2, 5, 4}, {9, 7, 3}, {17, 6, 2}} {
		T, C, K := sh[0], sh[1], sh[2]
		u := make([]float32, T*C)
		w := make([]float32, C*K)
		for i := range u {
			u[i] = float32(r.NormFloat64())
		}
		for i := range w {
			w[i] = float32(r.NormFloat64())
		}
		want := naive(u, T, C, w, K)
		// one call
		st := make([]float32, C*(K-1))
		got := make([]float32, T*C)
		CausalSiLU(got, u, T, C, w, K, st)
		require.InDeltaSlice(t, want, got, 1e-5)
		// token by token, and split in two uneven parts, carrying the state
		for _, split := range []int{1, T / 2} {
			st = make([]float32, C*(K-1))
			var all []float32
			for t0 := 0; t0 < T; t0 += split {
				n := split
				if t0+n > T || split == T/2 && t0 > 0 {
					n = T - t0
				}
				if n == 0 {
					break
				}
				part := make([]float32, n*C)
				CausalSiLU(part, u[t0*C:(t0+n)*C], n, C, w, K, st)
				all = append(all, part...)
				if split == T/2 && t0 > 0 {
					break
				}
			}
			require.InDeltaSlice(t, want, all, 1e-5, "split %d", split)
		}
	}
}

// causalSiLUScalar is the channel-by-channel implementation with the
// float64 SiLU that CausalSiLU replaced (kept for the before/after
// benchmark and as a second reference).
func causalSiLUScalar(dst, u []float32, T, C int, w []float32, K int, state []float32) {
	S := K - 1
	win := make([]float32, S+T)
	for c := 0; c < C; c++ {
		copy(win[:S], state[c*S:c*S+S])
		for t := 0; t < T; t++ {
			win[S+t] = u[t*C+c]
		}
		wc := w[c*K : c*K+K]
		for t := 0; t < T; t++ {
			var s float32
			for j, wv := range wc {
				s += wv * win[t+j]
			}
			dst[t*C+c] = act.SiLU(s)
		}
		copy(state[c*S:c*S+S], win[T:T+S])
	}
}

func TestCausalSiLUParallelMatchesSerialAndScalar(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 6))
	for _, sh := range [][3]int{{64, 1027, 4}, {300, 256, 4}, {70, 999, 3}, {2, 40000, 4}} {
		T, C, K := sh[0], sh[1], sh[2]
		u := make([]float32, T*C)
		w := make([]float32, C*K)
		st0 := make([]float32, C*(K-1))
		for i := range u {
			u[i] = float32(r.NormFloat64())
		}
		for i := range w {
			w[i] = float32(r.NormFloat64())
		}
		for i := range st0 {
			st0[i] = float32(r.NormFloat64())
		}
		require.GreaterOrEqual(t, T*C, ParallelMin)
		stP, stS, stR := append([]float32(nil), st0...), append([]float32(nil), st0...), append([]float32(nil), st0...)
		par, ser, ref := make([]float32, T*C), make([]float32, T*C), make([]float32, T*C)
		CausalSiLU(par, u, T, C, w, K, stP)
		CausalSiLUSerial(ser, u, T, C, w, K, stS)
		causalSiLUScalar(ref, u, T, C, w, K, stR)
		require.Equal(t, ser, par, "shape %v", sh)
		require.Equal(t, stS, stP)
		require.Equal(t, stR, stS, "state")
		for i := range ref { // float32 SIMD SiLU vs the float64 one
			require.InDelta(t, ref[i], ser[i], 4e-7*math.Abs(float64(ref[i]))+1e-30, "shape %v i %d", sh, i)
		}
	}
}

// The KDA short conv of a 512-token prefill of the bench preset: C = 3·8·128.
func benchConv(b *testing.B, f func(dst, u []float32, T, C int, w []float32, K int, state []float32)) {
	T, C, K := 512, 3072, 4
	r := rand.New(rand.NewPCG(1, 1))
	u, w, dst, st := make([]float32, T*C), make([]float32, C*K), make([]float32, T*C), make([]float32, C*(K-1))
	for i := range u {
		u[i] = float32(r.NormFloat64())
	}
	for i := range w {
		w[i] = float32(r.NormFloat64())
	}
	for b.Loop() {
		f(dst, u, T, C, w, K, st)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(T*C), "ns/elem")
}

func BenchmarkCausalSiLUScalar(b *testing.B) { benchConv(b, causalSiLUScalar) }
func BenchmarkCausalSiLUSerial(b *testing.B) { benchConv(b, CausalSiLUSerial) }
func BenchmarkCausalSiLU(b *testing.B)       { benchConv(b, CausalSiLU) }
