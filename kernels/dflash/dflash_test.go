package dflash

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// naive is the DFlash attention of one sequence written straight from the
// contract, in float64: the context rows (positions L..L+c−1) and block
// rows (L+c..L+c+B−1) are normed per head and rotated (rotate_half), the
// block queries attend to the L cached keys (already normed and rotated),
// the c context keys and the B block keys.
func naive(cfg Config, qn, kn []float32, cacheK, cacheV []float32, L int, kc, vc []float32, c int, q, kb, vb []float32, B int) []float64 {
	Hq, Hkv, hd := cfg.Heads, cfg.KVHeads, cfg.HeadDim
	normRope := func(x []float32, w []float32, pos int) []float64 {
		var ss float64
		for _, v := range x {
			ss += float64(v) * float64(v)
		}
		r := 1 / math.Sqrt(ss/float64(hd)+cfg.Eps)
		y := make([]float64, hd)
		for i := range y {
			y[i] = float64(x[i]) * r * float64(w[i])
		}
		out := make([]float64, hd)
		for i := 0; i < hd; i++ {
			j := i % (hd / 2)
			f := float64(pos) / math.Pow(cfg.Theta, float64(2*j)/float64(hd))
			rot := -y[i+hd/2*boolInt(i < hd/2)] // rotate_half: [−x2, x1]
			if i >= hd/2 {
				rot = y[i-hd/2]
			}
			out[i] = y[i]*math.Cos(f) + rot*math.Sin(f)
		}
		return out
	}
	type kv struct{ k, v []float64 }
	keys := make([][]kv, Hkv) // per kv head
	for h := 0; h < Hkv; h++ {
		for j := 0; j < L; j++ {
			keys[h] = append(keys[h], kv{f64(cacheK[(j*Hkv+h)*hd : (j*Hkv+h+1)*hd]), f64(cacheV[(j*Hkv+h)*hd : (j*Hkv+h+1)*hd])})
		}
		for j := 0; j < c; j++ {
			keys[h] = append(keys[h], kv{normRope(kc[(j*Hkv+h)*hd:(j*Hkv+h+1)*hd], kn, L+j), f64(vc[(j*Hkv+h)*hd : (j*Hkv+h+1)*hd])})
		}
		for j := 0; j < B; j++ {
			keys[h] = append(keys[h], kv{normRope(kb[(j*Hkv+h)*hd:(j*Hkv+h+1)*hd], kn, L+c+j), f64(vb[(j*Hkv+h)*hd : (j*Hkv+h+1)*hd])})
		}
	}
	o := make([]float64, B*Hq*hd)
	for b := 0; b < B; b++ {
		for h := 0; h < Hq; h++ {
			qh := normRope(q[(b*Hq+h)*hd:(b*Hq+h+1)*hd], qn, L+c+b)
			ks := keys[h/(Hq/Hkv)]
			s := make([]float64, len(ks))
			m := math.Inf(-1)
			for j, e := range ks {
				for i := range qh {
					s[j] += qh[i] * e.k[i]
				}
				s[j] /= math.Sqrt(float64(hd))
				m = math.Max(m, s[j])
			}
			var sum float64
			for j := range s {
				s[j] = math.Exp(s[j] - m)
				sum += s[j]
			}
			for j, e := range ks {
				for i := 0; i < hd; i++ {
					o[(b*Hq+h)*hd+i] += s[j] / sum * e.v[i]
				}
			}
		}
	}
	return o
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func f64(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

func randv(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// NormRope and Attend, composed as the CPU binding composes them (context
// rows normed, rotated and appended to the cache, block rows normed and
// rotated, the block attending to cache+block), equal the naive contract
// within fp32 rounding, for grouped heads, an empty and a filled cache and
// no new context rows.
func TestMatchesNaiveContract(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	for _, tc := range []struct{ Hq, Hkv, hd, L, c, B int }{
		{4, 2, 8, 0, 5, 4}, {4, 4, 16, 7, 3, 8}, {6, 2, 8, 9, 0, 3}, {2, 1, 4, 1, 1, 1},
	} {
		cfg := Config{Heads: tc.Hq, KVHeads: tc.Hkv, HeadDim: tc.hd, Eps: 1e-6, Theta: 10000}
		kvw := tc.Hkv * tc.hd
		qn, kn := randv(r, tc.hd), randv(r, tc.hd)
		cacheK, cacheV := randv(r, tc.L*kvw), randv(r, tc.L*kvw)
		kc, vc := randv(r, tc.c*kvw), randv(r, tc.c*kvw)
		q, kb, vb := randv(r, tc.B*tc.Hq*tc.hd), randv(r, tc.B*kvw), randv(r, tc.B*kvw)
		want := naive(cfg, qn, kn, cacheK, cacheV, tc.L, kc, vc, tc.c, q, kb, vb, tc.B)

		N := tc.L + tc.c + tc.B
		k := append(append([]float32(nil), cacheK...), kc...)
		v := append(append([]float32(nil), cacheV...), vc...)
		cfg.NormRope(k[tc.L*kvw:], tc.c, tc.Hkv, kn, tc.L)
		kbn := append([]float32(nil), kb...)
		cfg.NormRope(kbn, tc.B, tc.Hkv, kn, tc.L+tc.c)
		k, v = append(k, kbn...), append(v, vb...)
		qq := append([]float32(nil), q...)
		cfg.NormRope(qq, tc.B, tc.Hq, qn, tc.L+tc.c)
		o := make([]float32, len(q))
		cfg.Attend(o, qq, tc.B, k, v, N)
		for i := range o {
			require.InDelta(t, want[i], float64(o[i]), 2e-4*(1+math.Abs(want[i])), "case %+v, element %d", tc, i)
		}
	}
}

// RoPE at position 0 is the identity: NormRope is then the per-head
// RMSNorm alone.
func TestNormRopeAtZeroIsTheNorm(t *testing.T) {
	cfg := Config{Heads: 2, KVHeads: 2, HeadDim: 4, Eps: 1e-6, Theta: 1e6}
	x := []float32{1, 2, 3, 4, -1, 0, 0, 1}
	w := []float32{1, 1, 2, 0.5}
	cfg.NormRope(x, 1, 2, w, 0)
	r1 := 1 / math.Sqrt((1+4+9+16)/4.0+1e-6)
	r2 := 1 / math.Sqrt(2/4.0+1e-6)
	want := []float64{r1, 2 * r1, 6 * r1, 2 * r1, -r2, 0, 0, 0.5 * r2}
	for i := range x {
		require.InDelta(t, want[i], float64(x[i]), 1e-6)
	}
}
