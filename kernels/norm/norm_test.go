package norm

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func rnd(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

func TestRMSNormMatchesFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, sh := range [][2]int{{1, 1}, {3, 7}, {5, 64}, {2, 129}} {
		T, D := sh[0], sh[1]
		x, w := rnd(r, T*D), rnd(r, D)
		got := make([]float32, T*D)
		RMSNorm(got, x, T, D, w, 1e-5)
		for ti := 0; ti < T; ti++ {
			var s float64
			for d := 0; d < D; d++ {
				s += float64(x[ti*D+d]) * float64(x[ti*D+d])
			}
			inv := 1 / math.Sqrt(s/float64(D)+1e-5)
			for d := 0; d < D; d++ {
				require.InDelta(t, float64(w[d])*float64(x[ti*D+d])*inv, got[ti*D+d], 1e-5)
			}
		}
	}
}

func TestLayerNormMatchesFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 1))
	T, D := 3, 17
	x, w, b := rnd(r, T*D), rnd(r, D), rnd(r, D)
	got := make([]float32, T*D)
	LayerNorm(got, x, T, D, w, b, 1e-6)
	for ti := 0; ti < T; ti++ {
		var m, v float64
		for d := 0; d < D; d++ {
			m += float64(x[ti*D+d])
		}
		m /= float64(D)
		for d := 0; d < D; d++ {
			e := float64(x[ti*D+d]) - m
			v += e * e
		}
		v /= float64(D)
		for d := 0; d < D; d++ {
			want := (float64(x[ti*D+d])-m)/math.Sqrt(v+1e-6)*float64(w[d]) + float64(b[d])
			require.InDelta(t, want, got[ti*D+d], 1e-5)
		}
	}
}

func TestGatedRMSNormPerHead(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 1))
	T, H, Dh := 2, 3, 5
	o, g, w := rnd(r, T*H*Dh), rnd(r, T*H*Dh), rnd(r, Dh)
	got := make([]float32, T*H*Dh)
	GatedRMSNorm(got, o, g, T, H, Dh, w, 1e-5)
	for row := 0; row < T*H; row++ {
		var s float64
		for d := 0; d < Dh; d++ {
			s += float64(o[row*Dh+d]) * float64(o[row*Dh+d])
		}
		inv := 1 / math.Sqrt(s/float64(Dh)+1e-5)
		for d := 0; d < Dh; d++ {
			i := row*Dh + d
			want := float64(o[i]) * inv * float64(w[d]) / (1 + math.Exp(-float64(g[i])))
			require.InDelta(t, want, got[i], 1e-5)
		}
	}
}
