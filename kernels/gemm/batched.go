package gemm

import "github.com/glmflash/glmflash/kernels/parallel"

// BatchedMatMulT runs G independent GEMMs in one parallel region: x is
// [T][G·K] (group g reads columns [g·K, (g+1)·K)), w is [G][N][K], and
// ys[g] ([T][N]) = x_g · w_gᵀ. This is the batched low-rank GEMM of KDA's
// forget/output gates (f_b and g_b stacked).
func BatchedMatMulT(ys [][]float32, x []float32, T, K int, w []float32, N int) {
	batched(ys, x, T, K, N, func(dst, xg []float32, g, n0, n1 int) {
		MatMulTSerial(dst, xg, T, K, w[(g*N+n0)*K:(g*N+n1)*K], n1-n0)
	})
}

// BatchedMatMulTBF16 is BatchedMatMulT for bfloat16 weights (w is
// [G][N][K] bf16); the products are those of the widened weights.
func BatchedMatMulTBF16(ys [][]float32, x []float32, T, K int, w []uint16, N int) {
	batched(ys, x, T, K, N, func(dst, xg []float32, g, n0, n1 int) {
		MatMulTBF16Serial(dst, xg, T, K, w[(g*N+n0)*K:(g*N+n1)*K], n1-n0)
	})
}

// BatchedMatMulTBF16Act is BatchedMatMulTBF16 with the activations
// rounded to bfloat16 (MatMulTBF16Act).
func BatchedMatMulTBF16Act(ys [][]float32, x []float32, T, K int, w []uint16, N int) {
	batched(ys, x, T, K, N, func(dst, xg []float32, g, n0, n1 int) {
		MatMulTBF16ActSerial(dst, xg, T, K, w[(g*N+n0)*K:(g*N+n1)*K], n1-n0)
	})
}

// batched runs the G groups' column chunks in one parallel region; mm
// computes group g's columns [n0, n1) into dst ([T][n1-n0]).
func batched(ys [][]float32, x []float32, T, K, N int, mm func(dst, xg []float32, g, n0, n1 int)) {
	G := len(ys)
	if T == 0 || N == 0 || G == 0 {
		return
	}
	// gather each group's input block contiguously once (in a pooled
	// buffer, like the packing buffers: no allocation in the steady state)
	xb := getBuf(G * T * K)
	defer bufPool.Put(xb)
	xg := *xb
	for g := 0; g < G; g++ {
		b := xg[g*T*K : (g+1)*T*K]
		for t := 0; t < T; t++ {
			copy(b[t*K:(t+1)*K], x[t*G*K+g*K:t*G*K+(g+1)*K])
		}
	}
	const grain = 32
	per := (N + grain - 1) / grain
	parallel.For(G*per, 1, func(lo, hi int) {
		tb := getBuf(T * grain)
		defer bufPool.Put(tb)
		for task := lo; task < hi; task++ {
			g, c := task/per, task%per
			n0, n1 := c*grain, (c+1)*grain
			if n1 > N {
				n1 = N
			}
			cols := n1 - n0
			tmp := (*tb)[:T*cols]
			mm(tmp, xg[g*T*K:(g+1)*T*K], g, n0, n1)
			y := ys[g]
			for t := 0; t < T; t++ {
				copy(y[t*N+n0:t*N+n1], tmp[t*cols:(t+1)*cols])
			}
		}
	})
}
