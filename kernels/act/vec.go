package act

import (
	"math"
	"sync"
	"unsafe"
)

// A vector implementation: kernels over nvec whole vectors of vw lanes (see
// gen_asm.go for the math, which the pure-Go kernels below mirror).
type vecImpl struct {
	name     string
	vw       int
	exp      func(dst, src unsafe.Pointer, nvec uintptr)
	sigmoid  func(dst, src unsafe.Pointer, nvec uintptr)
	silu     func(dst, src unsafe.Pointer, nvec uintptr)
	softplus func(dst, src unsafe.Pointer, nvec uintptr)
	swiglu   func(dst, gate, up unsafe.Pointer, nvec uintptr, limit float32)
	gatesig  func(dst, z, bias unsafe.Pointer, nvec uintptr, rate, lb float32)
	gatesp   func(dst, z, bias unsafe.Pointer, nvec uintptr, negRate float32)
}

// impls lists the implementations this CPU runs, best last; cur is the one
// the slice kernels use (tests switch it to cover every implementation).
var (
	impls = append([]*vecImpl{goImpl}, simdImpls()...)
	cur   = impls[len(impls)-1]
)

// Impl names the implementation the slice kernels use ("go", "avx2",
// "avx512"): the best this CPU (as x/sys/cpu sees it) runs.
func Impl() string { return cur.name }

var goImpl = &vecImpl{
	name:     "go",
	vw:       1,
	exp:      unaryGo(expf),
	sigmoid:  unaryGo(sigmoidf),
	silu:     unaryGo(func(x float32) float32 { return x * sigmoidf(x) }),
	softplus: unaryGo(softplusf),
	swiglu: func(dst, gate, up unsafe.Pointer, n uintptr, limit float32) {
		d, g, u := f32s(dst, n), f32s(gate, n), f32s(up, n)
		for i, gv := range g {
			gv = min32(limit, gv)
			uv := max32(-limit, min32(limit, u[i]))
			d[i] = gv * sigmoidf(gv) * uv
		}
	},
	gatesig: func(dst, z, bias unsafe.Pointer, n uintptr, rate, lb float32) {
		d, zs, b := f32s(dst, n), f32s(z, n), f32s(bias, n)
		for i, v := range zs {
			d[i] = lb * sigmoidf(rate*(v+b[i]))
		}
	},
	gatesp: func(dst, z, bias unsafe.Pointer, n uintptr, negRate float32) {
		d, zs, b := f32s(dst, n), f32s(z, n), f32s(bias, n)
		for i, v := range zs {
			d[i] = negRate * softplusf(v+b[i])
		}
	},
}

func f32s(p unsafe.Pointer, n uintptr) []float32 { return unsafe.Slice((*float32)(p), n) }

func unaryGo(f func(float32) float32) func(dst, src unsafe.Pointer, n uintptr) {
	return func(dst, src unsafe.Pointer, n uintptr) {
		d, s := f32s(dst, n), f32s(src, n)
		for i, v := range s {
			d[i] = f(v)
		}
	}
}

// min32 and max32 return b when either is NaN (like MINPS/MAXPS with b as
// the second source), so a NaN input survives a clamp against a constant.
func min32(a, b float32) float32 {
	if a < b {
		return a
	}
	return b
}

func max32(a, b float32) float32 {
	if a > b {
		return a
	}
	return b
}

func fma32(a, b, c float32) float32 { return float32(math.FMA(float64(a), float64(b), float64(c))) }

// expf is the float32 exp of the vector kernels.
func expf(x float32) float32 {
	x = min32(88.75, x)
	x = max32(-104, x)
	n := float32(math.RoundToEven(float64(x * float32(math.Log2E))))
	r := fma32(-n, 0.693359375, x)
	r = fma32(-n, -2.12194440e-4, r)
	p := float32(1.9875691500e-4)
	for _, c := range [...]float32{1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1} {
		p = fma32(p, r, c)
	}
	p = fma32(p, r*r, r) + 1
	if n != n { // NaN
		return p
	}
	ni := int32(n)
	n1 := ni >> 1
	n2 := ni - n1
	p *= math.Float32frombits(uint32(n1+127) << 23)
	return p * math.Float32frombits(uint32(n2+127)<<23)
}

// sigmoidf is the float32 sigmoid of the vector kernels.
func sigmoidf(x float32) float32 {
	e := expf(-abs32(x))
	s := 1 / (1 + e)
	if math.Signbit(float64(x)) {
		return e * s
	}
	return s
}

// softplusf is the float32 softplus of the vector kernels.
func softplusf(x float32) float32 {
	u := expf(-abs32(x))
	w := 1 + u
	corr := (u - (w - 1)) / w
	m, e := w, float32(0)
	if w > math.Sqrt2 {
		m, e = w*0.5, 1
	}
	f := m - 1
	p := float32(7.0376836292e-2)
	for _, c := range [...]float32{-1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
		-1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1} {
		p = fma32(p, f, c)
	}
	z := f * f
	y := z * (f * p)
	y = fma32(e, -2.12194440e-4, y)
	y = fma32(z, -0.5, y)
	l := f + y
	l = fma32(e, 0.693359375, l)
	l += corr
	return l + max32(0, x)
}

func abs32(x float32) float32 { return math.Float32frombits(math.Float32bits(x) &^ (1 << 31)) }

// unary runs a one-input kernel over len(src) elements: whole vectors in
// place, a partial last vector through a padded buffer.
// tailPool holds the padded tail buffers of unary and binary.
var tailPool = sync.Pool{New: func() any { return new([2][16]float32) }}

func unary(k func(dst, src unsafe.Pointer, nvec uintptr), vw int, dst, src []float32) {
	n := len(src)
	dst = dst[:n]
	nv := n / vw
	if nv > 0 {
		k(unsafe.Pointer(&dst[0]), unsafe.Pointer(&src[0]), uintptr(nv))
	}
	if r := n - nv*vw; r > 0 {
		tb := tailPool.Get().(*[2][16]float32) // a stack array would escape through k
		buf := &tb[0]
		copy(buf[:], src[nv*vw:])
		k(unsafe.Pointer(&buf[0]), unsafe.Pointer(&buf[0]), 1)
		copy(dst[nv*vw:], buf[:r])
		tailPool.Put(tb)
	}
}

// binary is unary for a two-input kernel with scalar arguments bound by k.
func binary(k func(dst, a, b unsafe.Pointer, nvec uintptr), vw int, dst, a, b []float32) {
	n := len(a)
	dst, b = dst[:n], b[:n]
	nv := n / vw
	if nv > 0 {
		k(unsafe.Pointer(&dst[0]), unsafe.Pointer(&a[0]), unsafe.Pointer(&b[0]), uintptr(nv))
	}
	if r := n - nv*vw; r > 0 {
		tb := tailPool.Get().(*[2][16]float32) // stack arrays would escape through k
		ba, bb := &tb[0], &tb[1]
		copy(ba[:], a[nv*vw:])
		copy(bb[:], b[nv*vw:])
		k(unsafe.Pointer(&ba[0]), unsafe.Pointer(&ba[0]), unsafe.Pointer(&bb[0]), 1)
		copy(dst[nv*vw:], ba[:r])
		tailPool.Put(tb)
	}
}
