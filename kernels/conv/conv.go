// Package conv implements KDA's short causal depthwise convolution with SiLU.
package conv

import (
	"sync"

	"github.com/glmflash/glmflash/kernels/act"
	"github.com/glmflash/glmflash/kernels/parallel"
)

// ParallelMin is the number of outputs (T·C) from which CausalSiLU splits
// its channels across cores.
var ParallelMin = 1 << 15

// CausalSiLU convolves u ([T][C], row-major) along time, channel by channel:
//
//	out_t[c] = silu( Σ_{j<K} w[c][j] · u_{t−(K−1)+j}[c] )
//
// where positions before the call come from state ([C][K−1], oldest first;
// zeros for a fresh sequence). w is [C][K] (w[c][K−1] multiplies the current
// token). After the call state holds the last K−1 raw (pre-convolution)
// inputs of each channel. dst ([T][C]) must not alias u.
//
// The sums are float32 in j order (as a scalar loop would do them); the
// SiLU is act's SIMD kernel. Channels are split across cores when T·C ≥
// ParallelMin.
func CausalSiLU(dst, u []float32, T, C int, w []float32, K int, state []float32) {
	if T*C < ParallelMin {
		causalSiLU(dst, u, T, C, w, K, state, 0, C)
		return
	}
	// chunks of whole cache lines of channels
	grain := max((ParallelMin/2)/max(T, 1), 16)
	grain = (grain + 15) &^ 15
	parallel.ForArgs(&convPool, C, grain, convArgs{dst, u, T, C, w, K, state})
}

type convArgs struct {
	dst, u []float32
	T, C   int
	w      []float32
	K      int
	state  []float32
}

var convPool parallel.Pool[convArgs]

func (a *convArgs) Run(c0, c1 int) { causalSiLU(a.dst, a.u, a.T, a.C, a.w, a.K, a.state, c0, c1) }

// scratchPool holds causalSiLU's transposed weights and state.
var scratchPool = sync.Pool{New: func() any { return new([]float32) }}

// CausalSiLUSerial is CausalSiLU on the calling goroutine only (for callers
// already inside a parallel region).
func CausalSiLUSerial(dst, u []float32, T, C int, w []float32, K int, state []float32) {
	causalSiLU(dst, u, T, C, w, K, state, 0, C)
}

// causalSiLU does channels [c0, c1), time-major: the pre-activations of a
// row segment (weights transposed to [K][c1−c0] so every operand is
// contiguous), then the SiLU over it. Each sum starts at 0 and adds the K
// products in j order, as the channel-by-channel loop did.
func causalSiLU(dst, u []float32, T, C int, w []float32, K int, state []float32, c0, c1 int) {
	S, n := K-1, c1-c0
	sb := scratchPool.Get().(*[]float32)
	defer scratchPool.Put(sb)
	if cap(*sb) < (K+S)*n {
		*sb = make([]float32, (K+S)*n)
	}
	wT := (*sb)[: K*n : K*n]
	old := (*sb)[K*n : (K+S)*n] // the state, transposed to [S][n]
	for c := c0; c < c1; c++ {
		for j := 0; j < K; j++ {
			wT[j*n+c-c0] = w[c*K+j]
		}
		for x := 0; x < S; x++ {
			old[x*n+c-c0] = state[c*S+x]
		}
	}
	row := func(p int) []float32 { // input position p of the call, [n]
		if p >= 0 {
			return u[p*C+c0 : p*C+c1]
		}
		return old[(S+p)*n : (S+p+1)*n]
	}
	for t := 0; t < T; t++ {
		out := dst[t*C+c0 : t*C+c1]
		if K == 4 {
			w0, w1, w2, w3 := wT[:n], wT[n:2*n], wT[2*n:3*n], wT[3*n:4*n]
			r0, r1, r2, r3 := row(t - 3)[:n], row(t - 2)[:n], row(t - 1)[:n], row(t)[:n]
			for c := range out {
				var s float32
				s += w0[c] * r0[c]
				s += w1[c] * r1[c]
				s += w2[c] * r2[c]
				s += w3[c] * r3[c]
				out[c] = s
			}
		} else {
			clear(out)
			for j := 0; j < K; j++ {
				wj, r := wT[j*n:(j+1)*n], row(t - S + j)[:n]
				for c := range out {
					out[c] += wj[c] * r[c]
				}
			}
		}
		act.SiLUSerial(out, out)
	}
	// the last S raw inputs of each channel
	for c := c0; c < c1; c++ {
		st := state[c*S : c*S+S]
		for x := range st {
			st[x] = row(T - S + x)[c-c0]
		}
	}
}
