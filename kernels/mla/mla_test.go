package mla

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAttendMatchesDenseReference(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	f := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		return x
	}
	H, dq, dv, R, L, T := 3, 5, 4, 6, 12, 3
	c := &Config{Heads: H, QKDim: dq, VDim: dv, Rank: R, Scale: float32(1 / math.Sqrt(float64(dq))), KVBW: f(H * (dq + dv) * R)}
	ckv, q := f(L*R), f(T*H*dq)
	width := 6
	sel := []int32{0, 3, 4, 11, -1, -1, -1, -1, -1, -1, -1, -1, 2, 9, 7, 1, 0, 5}
	o := make([]float32, T*H*dv)
	c.Attend(o, q, ckv, sel, T, width)
	// reference: expand everything, dense softmax over the listed positions
	kv := make([]float64, L*H*(dq+dv))
	for p := 0; p < L; p++ {
		for x := 0; x < H*(dq+dv); x++ {
			var s float64
			for k := 0; k < R; k++ {
				s += float64(ckv[p*R+k]) * float64(c.KVBW[x*R+k])
			}
			kv[p*H*(dq+dv)+x] = s
		}
	}
	for t0 := 0; t0 < T; t0++ {
		for h := 0; h < H; h++ {
			var ps []int
			for _, p := range sel[t0*width : (t0+1)*width] {
				if p >= 0 {
					ps = append(ps, int(p))
				}
			}
			want := make([]float64, dv)
			if len(ps) > 0 {
				ls := make([]float64, len(ps))
				mx := math.Inf(-1)
				for i, p := range ps {
					for x := 0; x < dq; x++ {
						ls[i] += float64(q[t0*H*dq+h*dq+x]) * kv[p*H*(dq+dv)+h*(dq+dv)+x]
					}
					ls[i] /= math.Sqrt(float64(dq))
					mx = math.Max(mx, ls[i])
				}
				var s float64
				for i := range ls {
					ls[i] = math.Exp(ls[i] - mx)
					s += ls[i]
				}
				for i, p := range ps {
					for x := 0; x < dv; x++ {
						want[x] += ls[i] / s * kv[p*H*(dq+dv)+h*(dq+dv)+dq+x]
					}
				}
			}
			for x := 0; x < dv; x++ {
				require.InDelta(t, want[x], o[t0*H*dv+h*dv+x], 1e-5)
			}
		}
	}
}
