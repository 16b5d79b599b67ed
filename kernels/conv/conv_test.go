package conv

import (
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
