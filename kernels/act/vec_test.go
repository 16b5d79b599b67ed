package act

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// forImpls runs f with every implementation this CPU supports as cur.
func forImpls(t *testing.T, f func(t *testing.T)) {
	saved := cur
	defer func() { cur = saved }()
	for _, im := range impls {
		cur = im
		t.Run(im.name, f)
	}
}

var (
	inf  = float32(math.Inf(1))
	nan  = float32(math.NaN())
	tiny = math.Float32frombits(1)          // smallest subnormal
	sub  = math.Float32frombits(0x00400000) // a mid subnormal
)

// grid returns n evenly spaced values over [lo, hi] plus random ones.
func grid(lo, hi float64, n int) []float32 {
	r := rand.New(rand.NewPCG(1, 2))
	xs := make([]float32, 0, 2*n)
	for i := 0; i < n; i++ {
		xs = append(xs, float32(lo+(hi-lo)*float64(i)/float64(n-1)))
		xs = append(xs, float32(lo+(hi-lo)*r.Float64()))
	}
	return xs
}

// maxRel returns the largest |got−want|/|want| (want ≠ 0; absolute error
// where |want| < floor).
func maxRel(t *testing.T, xs, got []float32, ref func(float64) float64, floor float64) (worst float64, at float32) {
	for i, x := range xs {
		w := ref(float64(x))
		e := math.Abs(float64(got[i]) - w)
		if math.Abs(w) >= floor {
			e /= math.Abs(w)
		}
		if e > worst || math.IsNaN(e) {
			worst, at = e, x
		}
	}
	return
}

const minNormal = 0x1p-126

func TestExpAccuracy(t *testing.T) {
	forImpls(t, func(t *testing.T) {
		xs := grid(-87, 88.7, 200000)
		got := make([]float32, len(xs))
		ExpSlice(got, xs)
		worst, at := maxRel(t, xs, got, math.Exp, 0)
		t.Logf("exp over [-87, 88.7]: max relative error %.3g at %g", worst, at)
		require.LessOrEqual(t, worst, 2.5e-7, "at %g", at) // ≤ 2 ulp
		// the subnormal outputs: within one subnormal step (2^-149)
		xs = grid(-103.9, -87.4, 20000)
		got = make([]float32, len(xs))
		ExpSlice(got, xs)
		for i, x := range xs {
			require.InDelta(t, math.Exp(float64(x)), float64(got[i]), 0x1p-149, "exp(%g)", x)
		}
	})
}

func TestExpSpecialValues(t *testing.T) {
	forImpls(t, func(t *testing.T) {
		in := []float32{0, float32(math.Copysign(0, -1)), inf, -inf, nan, 88.72, 88.73, 89, 1e30, -1e30, -104, -200, tiny, -tiny, sub, 1}
		got := make([]float32, len(in))
		ExpSlice(got, in)
		require.Equal(t, float32(1), got[0])
		require.Equal(t, float32(1), got[1])
		require.True(t, math.IsInf(float64(got[2]), 1))
		require.Equal(t, float32(0), got[3])
		require.True(t, got[4] != got[4], "exp(NaN) = NaN")
		require.InEpsilon(t, math.Exp(float64(in[5])), float64(got[5]), 2.5e-7)
		for _, i := range []int{6, 7, 8} {
			require.True(t, math.IsInf(float64(got[i]), 1), "exp(%g) = %g", in[i], got[i])
		}
		for _, i := range []int{9, 10, 11} {
			require.Equal(t, float32(0), got[i], "exp(%g)", in[i])
		}
		for _, i := range []int{12, 13, 14} {
			require.Equal(t, float32(1), got[i], "exp(%g)", in[i])
		}
		require.InEpsilon(t, math.E, float64(got[15]), 2.5e-7)
	})
}

func sigmoid64(x float64) float64 { return 1 / (1 + math.Exp(-x)) }
func silu64(x float64) float64    { return x / (1 + math.Exp(-x)) }
func softplus64(x float64) float64 {
	if x > 30 {
		return x + math.Exp(-x)
	}
	return math.Log1p(math.Exp(x))
}

func TestSigmoidSiLUSoftplusAccuracy(t *testing.T) {
	forImpls(t, func(t *testing.T) {
		xs := grid(-110, 110, 100000)
		xs = append(xs, grid(-1, 1, 20000)...)
		got := make([]float32, len(xs))
		for _, c := range []struct {
			name  string
			f     func(dst, src []float32)
			ref   func(float64) float64
			bound float64
			floor float64
		}{
			{"sigmoid", SigmoidSlice, sigmoid64, 4e-7, minNormal},
			// below x ≈ −87.3 the sigmoid factor is subnormal (absolute
			// error 2^-149, times |x| ≤ 110 < 2^7)
			{"silu", SiLUSlice, silu64, 4e-7, 0x1p-119},
			{"softplus", SoftplusSlice, softplus64, 4e-7, minNormal},
		} {
			c.f(got, xs)
			// relative error where the result is ≥ floor, absolute error
			// (at most one subnormal step, scaled) below that
			worst, at := maxRel(t, xs, got, c.ref, c.floor)
			t.Logf("%s over [-110, 110]: max relative error %.3g at %g", c.name, worst, at)
			require.LessOrEqual(t, worst, c.bound, "%s(%g)", c.name, at)
		}
	})
}

func TestSigmoidSiLUSoftplusSpecialValues(t *testing.T) {
	forImpls(t, func(t *testing.T) {
		nz := float32(math.Copysign(0, -1))
		in := []float32{0, nz, inf, -inf, nan, 1e30, -1e30, tiny, -tiny}
		got := make([]float32, len(in))
		SigmoidSlice(got, in)
		require.Equal(t, []float32{0.5, 0.5, 1, 0}, got[:4])
		require.True(t, got[4] != got[4])
		require.Equal(t, []float32{1, 0, 0.5, 0.5}, got[5:])
		SiLUSlice(got, in)
		require.Equal(t, []float32{0, 0, inf}, got[:3])
		require.True(t, got[3] != got[3], "silu(-Inf) = -Inf·0 = NaN, as in float64")
		require.True(t, got[4] != got[4])
		require.Equal(t, []float32{1e30, 0}, got[5:7])
		require.Equal(t, float32(0), got[7]) // tiny·0.5 rounds to 0 (ties to even)
		SoftplusSlice(got, in)
		ln2 := float32(math.Ln2)
		require.Equal(t, []float32{ln2, ln2, inf, 0}, got[:4])
		require.True(t, got[4] != got[4])
		require.Equal(t, []float32{1e30, 0, ln2, ln2}, got[5:])
	})
}

func TestSwiGLUVersusExact(t *testing.T) {
	forImpls(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(3, 4))
		n := 4099
		g, u := make([]float32, n), make([]float32, n)
		for i := range g {
			g[i] = float32(r.NormFloat64() * 8)
			u[i] = float32(r.NormFloat64() * 8)
		}
		for _, limit := range []float32{10, 0, -1, inf, 7} {
			want, got := make([]float32, n), make([]float32, n)
			SwiGLUExact(want, g, u, limit)
			SwiGLU(got, g, u, limit)
			for i := range want {
				require.InDelta(t, want[i], got[i], 5e-7*math.Abs(float64(want[i]))+1e-30, "limit %g g %g u %g", limit, g[i], u[i])
			}
		}
	})
}

func TestSwiGLUClampsExactly(t *testing.T) {
	forImpls(t, func(t *testing.T) {
		// a clamped gate equals the gate at the limit, bit for bit; a
		// clamped up value is exactly ±limit
		g := []float32{50, 10, inf, 3, 3, 3, nan, 3, -inf}
		u := []float32{2, 2, 2, 50, -50, inf, 1, nan, 1}
		dst := make([]float32, len(g))
		SwiGLU(dst, g, u, 10)
		one := make([]float32, 1)
		SiLUSlice(one, []float32{10})
		s10 := one[0]
		SiLUSlice(one, []float32{3})
		s3 := one[0]
		require.Equal(t, []float32{s10 * 2, s10 * 2, s10 * 2, s3 * 10, s3 * -10, s3 * 10}, dst[:6])
		require.True(t, dst[6] != dst[6], "NaN gate passes the clamp")
		require.True(t, dst[7] != dst[7], "NaN up passes the clamp")
		require.True(t, dst[8] != dst[8], "silu(-Inf) = -Inf·0 is NaN, as in float64")
		// no clamp
		SwiGLU(dst, g[:1], u[:1], 0)
		require.InEpsilon(t, 50*2, dst[0], 1e-6)
	})
}

func TestKDAGateVersusExact(t *testing.T) {
	forImpls(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(5, 6))
		T, H, Dh := 37, 3, 40
		z := make([]float32, T*H*Dh)
		for i := range z {
			z[i] = float32(r.NormFloat64() * 6)
		}
		z[0], z[1], z[2] = 30, -40, 0
		aLog := []float32{0.5, -0.2, 1.5}
		dt := make([]float32, H*Dh)
		for i := range dt {
			dt[i] = float32(r.NormFloat64())
		}
		lb := -5.0
		for _, l := range []*float64{&lb, nil} {
			want, got := make([]float32, len(z)), make([]float32, len(z))
			KDAGateExact(want, z, T, H, Dh, aLog, dt, l)
			KDAGate(got, z, T, H, Dh, aLog, dt, l)
			for i := range want {
				// 4e-7 relative, plus the float32 roundings of rate and of
				// the sigmoid's argument rate·(z+b) (2·2^-24) amplified
				// by the sigmoid's condition number |rate·(z+b)|
				h := (i / Dh) % H
				a := math.Exp(float64(aLog[h])) * math.Abs(float64(z[i]+dt[h*Dh+i%Dh]))
				tol := 4e-7
				if l != nil {
					tol += a * 0x1p-23
				}
				require.InDelta(t, want[i], got[i], tol*math.Abs(float64(want[i]))+1e-37, "i %d z %g", i, z[i])
			}
		}
	})
}

// Every length (the padded partial vector) and the parallel split give the
// same bits as element-by-element calls.
func TestSlicesTailsAndParallelAgree(t *testing.T) {
	forImpls(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(7, 8))
		big := 3*ParallelMin + 5
		x, y := make([]float32, big), make([]float32, big)
		for i := range x {
			x[i] = float32(r.NormFloat64() * 10)
			y[i] = float32(r.NormFloat64() * 10)
		}
		one := func(f func(dst, src []float32), v float32) float32 {
			o := []float32{v}
			f(o, o)
			return o[0]
		}
		for _, f := range []func(dst, src []float32){ExpSlice, SigmoidSlice, SiLUSlice, SoftplusSlice} {
			for _, n := range []int{0, 1, 7, 8, 15, 16, 17, 33, 100, big} {
				got := make([]float32, n)
				f(got, x[:n])
				for i := 0; i < n; i += 1 + n/200 {
					require.Equal(t, one(f, x[i]), got[i], "n %d i %d", n, i)
				}
			}
		}
		for _, n := range []int{5, 31, big} {
			got := make([]float32, n)
			SwiGLU(got, x[:n], y[:n], 7)
			for i := 0; i < n; i += 1 + n/200 {
				o := []float32{0}
				SwiGLUSerial(o, x[i:i+1], y[i:i+1], 7)
				require.Equal(t, o[0], got[i], "n %d i %d", n, i)
			}
		}
		// packed rows equal per-row calls
		R, I := 40, 1000
		packed, want, got := x[:2*R*I], make([]float32, R*I), make([]float32, R*I)
		for rr := 0; rr < R; rr++ {
			SwiGLUSerial(want[rr*I:(rr+1)*I], packed[2*rr*I:2*rr*I+I], packed[2*rr*I+I:2*(rr+1)*I], 7)
		}
		SwiGLUPacked(got, packed, R, I, 7)
		require.Equal(t, want, got)
	})
}

// The SIMD implementations compute the same bits as each other.
func TestSIMDImplsAgree(t *testing.T) {
	if len(impls) < 3 {
		t.Skip("fewer than two SIMD implementations here")
	}
	xs := grid(-120, 120, 50000)
	a, b := make([]float32, len(xs)), make([]float32, len(xs))
	for _, k := range []string{"exp", "sigmoid", "silu", "softplus"} {
		pick := map[string]func(*vecImpl) func(dst, src unsafe.Pointer, n uintptr){}
		_ = pick
		for j, im := range impls[1:] {
			var f = map[string]func(dst, src unsafe.Pointer, n uintptr){"exp": im.exp, "sigmoid": im.sigmoid, "silu": im.silu, "softplus": im.softplus}[k]
			out := a
			if j > 0 {
				out = b
			}
			unary(f, im.vw, out, xs)
		}
		require.Equal(t, a, b, fmt.Sprint(k))
	}
}
