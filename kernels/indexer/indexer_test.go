package indexer

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
)

func rnd(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// naiveSelect rebuilds every pool from all keys for each query (the
// transformers formulation) and returns each query's position set.
func naiveSelect(c *Config, k, g, q, w []float32, T int) [][]int {
	D, H := c.Dim, c.Heads
	out := make([][]int, T)
	for t := 0; t < T; t++ {
		n := (t + 1) / c.KPool
		type ps struct {
			p int
			s float64
		}
		var cand []ps
		for p := 0; p < n; p++ {
			key := make([]float32, D)
			c.PoolKey(key, k[p*c.KPool*D:(p+1)*c.KPool*D], g[p*c.KPool*D:(p+1)*c.KPool*D])
			var s float64
			for h := 0; h < H; h++ {
				var dot float64
				for x := 0; x < D; x++ {
					dot += float64(q[t*H*D+h*D+x]) * float64(key[x])
				}
				dot /= math.Sqrt(float64(D))
				s += float64(w[t*H+h]) * math.Max(dot, 0)
			}
			cand = append(cand, ps{p, s})
		}
		sort.SliceStable(cand, func(a, b int) bool { return cand[a].s > cand[b].s })
		keep := c.TopK / c.KPool
		if keep > len(cand) {
			keep = len(cand)
		}
		var pos []int
		for _, cd := range cand[:keep] {
			for x := 0; x < c.KPool; x++ {
				pos = append(pos, cd.p*c.KPool+x)
			}
		}
		for p := n * c.KPool; p <= t; p++ {
			pos = append(pos, p)
		}
		sort.Ints(pos)
		out[t] = pos
	}
	return out
}

func rowSet(row []int32) []int {
	var s []int
	for _, v := range row {
		if v >= 0 {
			s = append(s, int(v))
		}
	}
	sort.Ints(s)
	return s
}

func TestSelectMatchesNaiveAcrossSplits(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 3))
	for _, geo := range [][3]int{{4, 16, 3}, {2, 8, 5}, {8, 16, 2}, {3, 6, 4}} {
		kpool, topk, H := geo[0], geo[1], geo[2]
		D, T := 6, 41
		c := &Config{Heads: H, Dim: D, KPool: kpool, TopK: topk, SelectTail: true, APE: rnd(r, kpool*D)}
		k, g, q, w := rnd(r, T*D), rnd(r, T*D), rnd(r, T*H*D), rnd(r, T*H)
		want := naiveSelect(c, k, g, q, w, T)
		for _, split := range []int{T, 1, 7} {
			st := &State{}
			Wd := c.Width()
			for t0 := 0; t0 < T; t0 += split {
				n := split
				if t0+n > T {
					n = T - t0
				}
				vis := make([]int, n)
				c.Append(st, t0, k[t0*D:(t0+n)*D], g[t0*D:(t0+n)*D], n, vis)
				sel := make([]int32, n*Wd)
				c.Select(sel, st, t0, q[t0*H*D:(t0+n)*H*D], w[t0*H:(t0+n)*H], n, vis)
				for j := 0; j < n; j++ {
					require.Equal(t, want[t0+j], rowSet(sel[j*Wd:(j+1)*Wd]), "geo %v split %d token %d", geo, split, t0+j)
				}
			}
			require.Equal(t, T/kpool, st.NumPools(D))
		}
	}
}

func TestShortContextSelectsEverything(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 9))
	c := &Config{Heads: 2, Dim: 4, KPool: 4, TopK: 16, SelectTail: true, APE: rnd(r, 16)}
	T := 19 // 4 pools ≤ 16/4: every position ≤ t is selected
	st := &State{}
	vis := make([]int, T)
	c.Append(st, 0, rnd(r, T*4), rnd(r, T*4), T, vis)
	sel := make([]int32, T*c.Width())
	c.Select(sel, st, 0, rnd(r, T*8), rnd(r, T*2), T, vis)
	for j := 0; j < T; j++ {
		var want []int
		for p := 0; p <= j; p++ {
			want = append(want, p)
		}
		require.Equal(t, want, rowSet(sel[j*c.Width():(j+1)*c.Width()]))
	}
}
