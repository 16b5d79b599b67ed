package gemm

import (
	"math"
	"unsafe"
)

// BF16 weights: bfloat16 values stored as their raw bits (the high half of
// an IEEE fp32), laid out like fp32 weights ([N][K] row-major). The kernels
// widen them to fp32 exactly (bits << 16) and accumulate in fp32, so
// MatMulTBF16(w) equals MatMulT(BF16ToFloat32s(w)) up to summation order.

// BF16ToFloat32 widens one bfloat16 to fp32 (exact).
func BF16ToFloat32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// Float32ToBF16 rounds f to the nearest bfloat16 (ties to even); NaNs stay
// NaNs (quieted), infinities and signed zeros are kept.
func Float32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN
		return uint16(u>>16) | 0x40
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// BF16ToFloat32s widens src into dst (len(dst) ≥ len(src)).
func BF16ToFloat32s(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, b := range src {
		dst[i] = math.Float32frombits(uint32(b) << 16)
	}
}

// Float32sToBF16 rounds src into dst (len(dst) ≥ len(src)) with
// Float32ToBF16.
func Float32sToBF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		dst[i] = Float32ToBF16(f)
	}
}

// MatMulTBF16 computes dst[T×N] = x[T×K] · w[N×K]ᵀ for bfloat16 weights with
// default parameters.
func MatMulTBF16(dst, x []float32, T, K int, w []uint16, N int) {
	MatMulTBF16With(Default(), dst, x, T, K, w, N)
}

// MatMulTBF16With is MatMulTBF16 with explicit tuning parameters (the same
// Params as MatMulTWith; results do not depend on them).
func MatMulTBF16With(p Params, dst, x []float32, T, K int, w []uint16, N int) {
	matMulTBF16(p.norm(), false, dst, x, T, K, w, N)
}

// MatMulTBF16Serial is MatMulTBF16 on the calling goroutine only.
func MatMulTBF16Serial(dst, x []float32, T, K int, w []uint16, N int) {
	matMulTBF16(Default(), true, dst, x, T, K, w, N)
}

func matMulTBF16(p Params, serial bool, dst, x []float32, T, K int, w []uint16, N int) {
	if !checkShapes(dst, x, T, K, N, len(w)) {
		return
	}
	o := getOp(p, dst, x, T, K, N, unsafe.Pointer(&w[0]), 2, opBF16)
	o.wb = w
	o.start(serial)
}

// MatMulTBF16Naive is the reference for MatMulTBF16: widen, then a plain
// triple loop.
func MatMulTBF16Naive(dst, x []float32, T, K int, w []uint16, N int) {
	for t := 0; t < T; t++ {
		for n := 0; n < N; n++ {
			var s float32
			for k := 0; k < K; k++ {
				s += x[t*K+k] * BF16ToFloat32(w[n*K+k])
			}
			dst[t*N+n] = s
		}
	}
}

// blockBF16 is the pure-Go block for bfloat16 weights: rows [t0,t1) ×
// columns [n0,n1) with 4×2 register tiles, each output summed left to right
// in float64 and rounded once (as block).
func blockBF16(dst, x []float32, w []uint16, K, N, t0, t1, n0, n1 int) {
	n := n0
	for ; n+2 <= n1; n += 2 {
		w0 := w[n*K : n*K+K]
		w1 := w[(n+1)*K : (n+1)*K+K]
		t := t0
		for ; t+4 <= t1; t += 4 {
			x0 := x[t*K : t*K+K]
			x1 := x[(t+1)*K : (t+1)*K+K]
			x2 := x[(t+2)*K : (t+2)*K+K]
			x3 := x[(t+3)*K : (t+3)*K+K]
			var a00, a01, a10, a11, a20, a21, a30, a31 float64
			for k := range w0 {
				b0 := float64(math.Float32frombits(uint32(w0[k]) << 16))
				b1 := float64(math.Float32frombits(uint32(w1[k]) << 16))
				v := float64(x0[k])
				a00 += v * b0
				a01 += v * b1
				v = float64(x1[k])
				a10 += v * b0
				a11 += v * b1
				v = float64(x2[k])
				a20 += v * b0
				a21 += v * b1
				v = float64(x3[k])
				a30 += v * b0
				a31 += v * b1
			}
			dst[t*N+n], dst[t*N+n+1] = float32(a00), float32(a01)
			dst[(t+1)*N+n], dst[(t+1)*N+n+1] = float32(a10), float32(a11)
			dst[(t+2)*N+n], dst[(t+2)*N+n+1] = float32(a20), float32(a21)
			dst[(t+3)*N+n], dst[(t+3)*N+n+1] = float32(a30), float32(a31)
		}
		for ; t < t1; t++ {
			x0 := x[t*K : t*K+K]
			var a0, a1 float64
			for k, v := range x0 {
				v := float64(v)
				a0 += v * float64(math.Float32frombits(uint32(w0[k])<<16))
				a1 += v * float64(math.Float32frombits(uint32(w1[k])<<16))
			}
			dst[t*N+n], dst[t*N+n+1] = float32(a0), float32(a1)
		}
	}
	for ; n < n1; n++ {
		wr := w[n*K : n*K+K]
		for t := t0; t < t1; t++ {
			xr := x[t*K : t*K+K]
			var s float64
			for k, v := range xr {
				s += float64(v) * float64(math.Float32frombits(uint32(wr[k])<<16))
			}
			dst[t*N+n] = float32(s)
		}
	}
}
