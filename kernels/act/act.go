// Package act holds elementwise activations: sigmoid, SiLU, the clamped
// SwiGLU of GLM's MLPs and experts, softplus and KDA's forget gate.
//
// The scalar functions (Sigmoid, SiLU, Softplus) and the *Exact slice
// functions compute in float64 and round once: they are the references of
// parity paths. The slice kernels (ExpSlice, SigmoidSlice, SiLUSlice,
// SoftplusSlice, SwiGLU, KDAGate, …) are float32 SIMD kernels (AVX-512 or
// AVX2+FMA, chosen at run time; pure Go elsewhere) with a few ulp of error,
// split across cores (package parallel)
// when a call has at least ParallelMin elements. Every element goes through
// the same instructions wherever it lies in a slice, so a row's result does
// not depend on the batch it is part of.
//
// Tested bounds against float64 (vec_test.go): exp ≤ 2.5e-7 relative over
// [−87, 88.7] (≤ 2 ulp; 8.2e-8 measured) and within 2^-149 where the result
// is subnormal; sigmoid, SiLU and softplus ≤ 4e-7 relative over [−110, 110]
// where the result is normal (1.9e-7, 2.1e-7, 1.6e-7 measured); SwiGLU
// ≤ 5e-7 relative to SwiGLUExact, with clamps exact (a clamped gate gives
// the bits of the gate at the limit, a clamped up value is exactly ±limit).
//
// Special values: exp(NaN) = NaN, exp(+Inf) = +Inf, exp(−Inf) = 0, exp
// overflows to +Inf above ≈ 88.72 and underflows gradually through the
// subnormals to 0 below ≈ −103.97; sigmoid(±Inf) = 1 or 0 and
// SiLU(−Inf) = NaN (−Inf·0, as in the float64 reference); softplus(+Inf) =
// +Inf, softplus(−Inf) = 0; NaN in gives NaN out everywhere, also through
// the SwiGLU clamps.
package act

import (
	"math"
	"unsafe"

	"github.com/glmflash/glmflash/kernels/parallel"
)

// ParallelMin is the number of elements from which the slice kernels split
// a call across cores; smaller calls run on the calling goroutine.
var ParallelMin = 1 << 15

// grain is the number of elements of one parallel chunk.
func grain() int { return max(ParallelMin/2, 1) }

// Sigmoid returns 1/(1+e^−x), computed in float64.
func Sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(float64(-x)))) }

// SiLU returns x·sigmoid(x), with Sigmoid's float64 sigmoid.
func SiLU(x float32) float32 { return x * Sigmoid(x) }

// Softplus returns log(1+e^x), computed in float64 (x itself above 20).
func Softplus(x float32) float32 {
	v := float64(x)
	if v > 20 {
		return x
	}
	return float32(math.Log1p(math.Exp(v)))
}

// unaryPar runs a one-input kernel of the current implementation over
// src, in parallel chunks when it is large.
func unaryPar(pick func(*vecImpl) func(dst, src unsafe.Pointer, n uintptr), dst, src []float32) {
	im := cur
	k := pick(im)
	n := len(src)
	if n < ParallelMin {
		unary(k, im.vw, dst, src)
		return
	}
	parallel.ForArgs(&unaryPool, n, grain(), unaryArgs{k, im.vw, dst[:n], src})
}

type unaryArgs struct {
	k        func(dst, src unsafe.Pointer, n uintptr)
	vw       int
	dst, src []float32
}

var unaryPool parallel.Pool[unaryArgs]

func (a *unaryArgs) Run(lo, hi int) { unary(a.k, a.vw, a.dst[lo:hi], a.src[lo:hi]) }

// ExpSlice writes dst[i] = e^src[i] (float32, ≤ 2 ulp). dst may be src.
func ExpSlice(dst, src []float32) {
	unaryPar(func(im *vecImpl) func(dst, src unsafe.Pointer, n uintptr) { return im.exp }, dst, src)
}

// ExpSerial is ExpSlice on the calling goroutine only (for callers that
// are already inside a parallel region).
func ExpSerial(dst, src []float32) { unary(cur.exp, cur.vw, dst, src) }

// SigmoidSlice writes dst[i] = 1/(1+e^−src[i]) (float32). dst may be src.
func SigmoidSlice(dst, src []float32) {
	unaryPar(func(im *vecImpl) func(dst, src unsafe.Pointer, n uintptr) { return im.sigmoid }, dst, src)
}

// SigmoidSerial is SigmoidSlice on the calling goroutine only.
func SigmoidSerial(dst, src []float32) { unary(cur.sigmoid, cur.vw, dst, src) }

// SigmoidInPlace applies the sigmoid to every element of src, writing dst
// (SigmoidSlice; the name is historical: dst may be, but need not be, src).
func SigmoidInPlace(dst, src []float32) { SigmoidSlice(dst, src) }

// SiLUSlice writes dst[i] = src[i]·sigmoid(src[i]) (float32). dst may be
// src.
func SiLUSlice(dst, src []float32) {
	unaryPar(func(im *vecImpl) func(dst, src unsafe.Pointer, n uintptr) { return im.silu }, dst, src)
}

// SiLUSerial is SiLUSlice on the calling goroutine only (for callers that
// are already inside a parallel region).
func SiLUSerial(dst, src []float32) { unary(cur.silu, cur.vw, dst, src) }

// SoftplusSlice writes dst[i] = log(1+e^src[i]) (float32). dst may be src.
func SoftplusSlice(dst, src []float32) {
	unaryPar(func(im *vecImpl) func(dst, src unsafe.Pointer, n uintptr) { return im.softplus }, dst, src)
}

// swigluLimit maps SwiGLU's limit to the kernels': +Inf when the clamp is
// off (a non-positive, infinite or NaN limit).
func swigluLimit(limit float32) float32 {
	if !(limit > 0) || math.IsInf(float64(limit), 0) {
		return float32(math.Inf(1))
	}
	return limit
}

// SwiGLU writes dst[i] = silu(min(g[i], limit)) · clamp(u[i], −limit, limit)
// with the float32 SIMD kernels, split across cores when large. A
// non-positive or infinite limit disables the clamp. dst may be g or u.
func SwiGLU(dst, g, u []float32, limit float32) {
	n := len(g)
	if n < ParallelMin {
		SwiGLUSerial(dst, g, u, limit)
		return
	}
	parallel.ForArgs(&swigluPool, n, grain(), swigluArgs{dst[:n], g, u[:n], limit})
}

type swigluArgs struct {
	dst, g, u []float32
	limit     float32
}

var swigluPool parallel.Pool[swigluArgs]

func (a *swigluArgs) Run(lo, hi int) { SwiGLUSerial(a.dst[lo:hi], a.g[lo:hi], a.u[lo:hi], a.limit) }

// SwiGLUSerial is SwiGLU on the calling goroutine only (for callers that
// are already inside a parallel region, such as MoE experts).
func SwiGLUSerial(dst, g, u []float32, limit float32) {
	im, l := cur, swigluLimit(limit)
	binary(func(d, a, b unsafe.Pointer, nv uintptr) { im.swiglu(d, a, b, nv, l) }, im.vw, dst, g, u)
}

// SwiGLUPacked applies SwiGLU to R rows of x ([R][2·I]: gate then up, per
// row), writing y ([R][I]); rows are split across cores when large.
func SwiGLUPacked(y, x []float32, R, I int, limit float32) {
	a := packedArgs{y, x, I, limit}
	if R*I < ParallelMin || R < 2 {
		a.Run(0, R)
		return
	}
	parallel.ForArgs(&packedPool, R, max(grain()/max(I, 1), 1), a)
}

type packedArgs struct {
	y, x  []float32
	I     int
	limit float32
}

var packedPool parallel.Pool[packedArgs]

func (a *packedArgs) Run(lo, hi int) {
	I := a.I
	for r := lo; r < hi; r++ {
		row := a.x[2*r*I : 2*(r+1)*I]
		SwiGLUSerial(a.y[r*I:(r+1)*I], row[:I], row[I:], a.limit)
	}
}

// SwiGLUExact is the float64-sigmoid SwiGLU (SiLU per element): the
// reference the SIMD kernel is tested against.
func SwiGLUExact(dst, g, u []float32, limit float32) {
	clamp := limit > 0 && !math.IsInf(float64(limit), 0)
	u = u[:len(g)]
	dst = dst[:len(g)]
	for i, gv := range g {
		uv := u[i]
		if clamp {
			if gv > limit {
				gv = limit
			}
			if uv > limit {
				uv = limit
			} else if uv < -limit {
				uv = -limit
			}
		}
		dst[i] = SiLU(gv) * uv
	}
}

// KDAGate computes the KDA forget gate (log-decay) for T tokens of H heads ×
// Dh channels from z = f_b(f_a(x)):
//
//	with a lower bound lb:  g = lb · sigmoid(exp(A_log[h]) · (z + dt_bias))
//	without (lb == nil):    g = −exp(A_log[h]) · softplus(z + dt_bias)
//
// with the float32 SIMD kernels (exp(A_log) in float64), token-head rows
// split across cores when large. KDAGateExact is the float64 reference.
func KDAGate(dst, z []float32, T, H, Dh int, aLog, dtBias []float32, lb *float64) {
	if T*H*Dh == 0 {
		return
	}
	a := gateArgs{cur, dst, z, dtBias, aLog, H, Dh, lb}
	if T*H*Dh < ParallelMin {
		a.Run(0, T*H)
		return
	}
	parallel.ForArgs(&gatePool, T*H, max(grain()/Dh, 1), a)
}

type gateArgs struct {
	im                   *vecImpl
	dst, z, dtBias, aLog []float32
	H, Dh                int
	lb                   *float64
}

var gatePool parallel.Pool[gateArgs]

// Run computes rows [lo, hi) (a row is one token's head); the head's rate
// exp(A_log[h]) is computed in float64 per row.
func (a *gateArgs) Run(lo, hi int) {
	im, H, Dh := a.im, a.H, a.Dh
	for r := lo; r < hi; r++ {
		h := r % H
		d, zr, b := a.dst[r*Dh:(r+1)*Dh], a.z[r*Dh:(r+1)*Dh], a.dtBias[h*Dh:(h+1)*Dh]
		rate := float32(math.Exp(float64(a.aLog[h])))
		if a.lb != nil {
			l := float32(*a.lb)
			binary(func(d, a, b unsafe.Pointer, nv uintptr) { im.gatesig(d, a, b, nv, rate, l) }, im.vw, d, zr, b)
		} else {
			nr := -rate
			binary(func(d, a, b unsafe.Pointer, nv uintptr) { im.gatesp(d, a, b, nv, nr) }, im.vw, d, zr, b)
		}
	}
}

// KDAGateExact is KDAGate computed in float64 per element: the reference
// the SIMD kernels are tested against.
func KDAGateExact(dst, z []float32, T, H, Dh int, aLog, dtBias []float32, lb *float64) {
	P := H * Dh
	for t := 0; t < T; t++ {
		for h := 0; h < H; h++ {
			rate := math.Exp(float64(aLog[h]))
			for d := 0; d < Dh; d++ {
				i := t*P + h*Dh + d
				v := float64(z[i] + dtBias[h*Dh+d])
				if lb != nil {
					dst[i] = float32(*lb * (1 / (1 + math.Exp(-rate*v))))
				} else {
					sp := v
					if v <= 20 {
						sp = math.Log1p(math.Exp(v))
					}
					dst[i] = float32(-rate * sp)
				}
			}
		}
	}
}
