// Package gemm multiplies activations by weight matrices stored PyTorch-style
// ([out_features, in_features], row-major): y[t][n] = Σ_k x[t][k]·w[n][k].
package gemm

import "github.com/glmflash/glmflash/kernels/parallel"

// Params are the tunable knobs of MatMulT. The zero value picks defaults.
type Params struct {
	// ColGrain is the number of output columns (weight rows) one work item
	// covers; larger values mean fewer, bigger tasks.
	ColGrain int
	// RowBlock is the number of activation rows processed against one block
	// of weight rows before moving on (cache blocking over T).
	RowBlock int
}

// Default returns the parameters used when none are tuned.
func Default() Params { return Params{ColGrain: 16, RowBlock: 64} }

func (p Params) norm() Params {
	d := Default()
	if p.ColGrain <= 0 {
		p.ColGrain = d.ColGrain
	}
	if p.RowBlock <= 0 {
		p.RowBlock = d.RowBlock
	}
	return p
}

// MatMulT computes dst[T×N] = x[T×K] · w[N×K]ᵀ with default parameters.
func MatMulT(dst, x []float32, T, K int, w []float32, N int) {
	MatMulTWith(Default(), dst, x, T, K, w, N)
}

// MatMulTWith is MatMulT with explicit tuning parameters. Results do not
// depend on the parameters: every output is one left-to-right sum over k.
func MatMulTWith(p Params, dst, x []float32, T, K int, w []float32, N int) {
	if T == 0 || N == 0 {
		return
	}
	p = p.norm()
	_ = dst[T*N-1]
	_ = x[T*K-1]
	_ = w[N*K-1]
	grain := p.ColGrain
	nTasks := (N + grain - 1) / grain
	parallel.For(nTasks, 1, func(lo, hi int) {
		n0, n1 := lo*grain, hi*grain
		if n1 > N {
			n1 = N
		}
		for t0 := 0; t0 < T; t0 += p.RowBlock {
			t1 := t0 + p.RowBlock
			if t1 > T {
				t1 = T
			}
			block(dst, x, w, K, N, t0, t1, n0, n1)
		}
	})
}

// block computes rows [t0,t1) × columns [n0,n1) with 4×4 register tiles.
func block(dst, x, w []float32, K, N, t0, t1, n0, n1 int) {
	n := n0
	for ; n+4 <= n1; n += 4 {
		w0 := w[n*K : n*K+K]
		w1 := w[(n+1)*K : (n+1)*K+K]
		w2 := w[(n+2)*K : (n+2)*K+K]
		w3 := w[(n+3)*K : (n+3)*K+K]
		t := t0
		for ; t+4 <= t1; t += 4 {
			x0 := x[t*K : t*K+K]
			x1 := x[(t+1)*K : (t+1)*K+K]
			x2 := x[(t+2)*K : (t+2)*K+K]
			x3 := x[(t+3)*K : (t+3)*K+K]
			var a00, a01, a02, a03, a10, a11, a12, a13 float32
			var a20, a21, a22, a23, a30, a31, a32, a33 float32
			for k := range w0 {
				b0, b1, b2, b3 := w0[k], w1[k], w2[k], w3[k]
				v := x0[k]
				a00 += v * b0
				a01 += v * b1
				a02 += v * b2
				a03 += v * b3
				v = x1[k]
				a10 += v * b0
				a11 += v * b1
				a12 += v * b2
				a13 += v * b3
				v = x2[k]
				a20 += v * b0
				a21 += v * b1
				a22 += v * b2
				a23 += v * b3
				v = x3[k]
				a30 += v * b0
				a31 += v * b1
				a32 += v * b2
				a33 += v * b3
			}
			d := dst[t*N+n : t*N+n+4]
			d[0], d[1], d[2], d[3] = a00, a01, a02, a03
			d = dst[(t+1)*N+n : (t+1)*N+n+4]
			d[0], d[1], d[2], d[3] = a10, a11, a12, a13
			d = dst[(t+2)*N+n : (t+2)*N+n+4]
			d[0], d[1], d[2], d[3] = a20, a21, a22, a23
			d = dst[(t+3)*N+n : (t+3)*N+n+4]
			d[0], d[1], d[2], d[3] = a30, a31, a32, a33
		}
		for ; t < t1; t++ {
			x0 := x[t*K : t*K+K]
			var a0, a1, a2, a3 float32
			for k, v := range x0 {
				a0 += v * w0[k]
				a1 += v * w1[k]
				a2 += v * w2[k]
				a3 += v * w3[k]
			}
			d := dst[t*N+n : t*N+n+4]
			d[0], d[1], d[2], d[3] = a0, a1, a2, a3
		}
	}
	for ; n < n1; n++ {
		wr := w[n*K : n*K+K]
		for t := t0; t < t1; t++ {
			dst[t*N+n] = Dot(x[t*K:t*K+K], wr)
		}
	}
}

// MatMulTSerial is MatMulT on the calling goroutine only (for callers that
// already parallelize at a coarser level, such as one expert per worker).
func MatMulTSerial(dst, x []float32, T, K int, w []float32, N int) {
	if T == 0 || N == 0 {
		return
	}
	rb := Default().RowBlock
	for t0 := 0; t0 < T; t0 += rb {
		t1 := t0 + rb
		if t1 > T {
			t1 = T
		}
		block(dst, x, w, K, N, t0, t1, 0, N)
	}
}

// Dot returns Σ a[i]·b[i] (len(b) ≥ len(a)), summed left to right.
func Dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s float32
	for i, v := range a {
		s += v * b[i]
	}
	return s
}

// MatMulTNaive is the reference for MatMulT: a plain triple loop.
func MatMulTNaive(dst, x []float32, T, K int, w []float32, N int) {
	for t := 0; t < T; t++ {
		for n := 0; n < N; n++ {
			var s float32
			for k := 0; k < K; k++ {
				s += x[t*K+k] * w[n*K+k]
			}
			dst[t*N+n] = s
		}
	}
}

// MatMul computes dst[M×N] = a[M×K] · b[K×N] (both row-major); used by the
// small inner products of attention and KDA. dst is overwritten.
func MatMul(dst, a []float32, M, K int, b []float32, N int) {
	for i := 0; i < M; i++ {
		d := dst[i*N : i*N+N]
		for j := range d {
			d[j] = 0
		}
		ar := a[i*K : i*K+K]
		for k, av := range ar {
			if av == 0 {
				continue
			}
			Axpy(d, av, b[k*N:k*N+N])
		}
	}
}

// Axpy computes y += a·x.
func Axpy(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += a * x[i]
	}
}
