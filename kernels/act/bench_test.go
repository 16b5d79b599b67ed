package act

import (
	"math/rand/v2"
	"testing"
)

// The benchmarks report ns per element ("ns/elem"): *Exact is the float64
// scalar path the CPU backend ran before the SIMD kernels, Serial the SIMD
// kernel on one goroutine, the plain name what the backend calls now (SIMD,
// split across cores above ParallelMin).

const benchN = 1 << 20 // about a 512-token MLP activation of the bench preset

func benchInputs(n int) (a, b, dst []float32) {
	r := rand.New(rand.NewPCG(1, 1))
	a, b, dst = make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range a {
		a[i] = float32(r.NormFloat64() * 4)
		b[i] = float32(r.NormFloat64() * 4)
	}
	return
}

func perElem(b *testing.B, n int, f func()) {
	b.ResetTimer()
	for b.Loop() {
		f()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/elem")
}

func BenchmarkSwiGLUExact(b *testing.B) {
	g, u, d := benchInputs(benchN)
	perElem(b, benchN, func() { SwiGLUExact(d, g, u, 10) })
}

func BenchmarkSwiGLUSerial(b *testing.B) {
	g, u, d := benchInputs(benchN)
	perElem(b, benchN, func() { SwiGLUSerial(d, g, u, 10) })
}

func BenchmarkSwiGLU(b *testing.B) {
	g, u, d := benchInputs(benchN)
	perElem(b, benchN, func() { SwiGLU(d, g, u, 10) })
}

func BenchmarkSigmoidExact(b *testing.B) {
	x, _, d := benchInputs(benchN)
	perElem(b, benchN, func() {
		for i, v := range x {
			d[i] = Sigmoid(v)
		}
	})
}

func BenchmarkSigmoid(b *testing.B) {
	x, _, d := benchInputs(benchN)
	perElem(b, benchN, func() { SigmoidSlice(d, x) })
}

func BenchmarkSiLUExact(b *testing.B) {
	x, _, d := benchInputs(benchN)
	perElem(b, benchN, func() {
		for i, v := range x {
			d[i] = SiLU(v)
		}
	})
}

func BenchmarkSiLUSerial(b *testing.B) {
	x, _, d := benchInputs(benchN)
	perElem(b, benchN, func() { SiLUSerial(d, x) })
}

func BenchmarkSiLU(b *testing.B) {
	x, _, d := benchInputs(benchN)
	perElem(b, benchN, func() { SiLUSlice(d, x) })
}

func BenchmarkExp(b *testing.B) {
	x, _, d := benchInputs(benchN)
	perElem(b, benchN, func() { ExpSlice(d, x) })
}

func BenchmarkSoftplus(b *testing.B) {
	x, _, d := benchInputs(benchN)
	perElem(b, benchN, func() { SoftplusSlice(d, x) })
}

// KDA gate of a 512-token prefill of the bench preset: 8 heads × 128.
func benchGate(b *testing.B, exact, lower bool) {
	T, H, Dh := 512, 8, 128
	z, bias, d := benchInputs(T * H * Dh)
	aLog := []float32{0.1, 0.2, -0.3, 0.4, 0.5, -0.6, 0.7, 0.8}
	lb := -5.0
	l := &lb
	if !lower {
		l = nil
	}
	f := KDAGate
	if exact {
		f = KDAGateExact
	}
	perElem(b, T*H*Dh, func() { f(d, z, T, H, Dh, aLog, bias[:H*Dh], l) })
}

func BenchmarkKDAGateSigmoidExact(b *testing.B)  { benchGate(b, true, true) }
func BenchmarkKDAGateSigmoid(b *testing.B)       { benchGate(b, false, true) }
func BenchmarkKDAGateSoftplusExact(b *testing.B) { benchGate(b, true, false) }
func BenchmarkKDAGateSoftplus(b *testing.B)      { benchGate(b, false, false) }
