// Package conv implements KDA's short causal depthwise convolution with SiLU.
package conv

import "github.com/glmflash/glmflash/kernels/act"

// CausalSiLU convolves u ([T][C], row-major) along time, channel by channel:
//
//	out_t[c] = silu( Σ_{j<K} w[c][j] · u_{t−(K−1)+j}[c] )
//
// where positions before the call come from state ([C][K−1], oldest first;
// zeros for a fresh sequence). w is [C][K] (w[c][K−1] multiplies the current
// token). After the call state holds the last K−1 raw (pre-convolution)
// inputs of each channel. dst ([T][C]) must not alias u.
func CausalSiLU(dst, u []float32, T, C int, w []float32, K int, state []float32) {
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
