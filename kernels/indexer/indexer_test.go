package indexer

import (
	"fmt"
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
				require.NoError(t, c.Append(st, t0, k[t0*D:(t0+n)*D], g[t0*D:(t0+n)*D], n, vis))
				sel := make([]int32, n*Wd)
				c.Select(sel, st, t0, q[t0*H*D:(t0+n)*H*D], w[t0*H:(t0+n)*H], n, vis)
				for j := 0; j < n; j++ {
					require.Equal(t, want[t0+j], rowSet(sel[j*Wd:(j+1)*Wd]), "geo %v split %d token %d", geo, split, t0+j)
				}
			}
			require.Equal(t, T/kpool, st.NumPools())
		}
	}
}

func TestShortContextSelectsEverything(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 9))
	c := &Config{Heads: 2, Dim: 4, KPool: 4, TopK: 16, SelectTail: true, APE: rnd(r, 16)}
	T := 19 // 4 pools ≤ 16/4: every position ≤ t is selected
	st := &State{}
	vis := make([]int, T)
	require.NoError(t, c.Append(st, 0, rnd(r, T*4), rnd(r, T*4), T, vis))
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

// legacySelect is Select as it was before the GEMM form: per query and pool
// scalar dot products summed left to right, and a full stable sort.
func legacySelect(c *Config, sel []int32, st *State, pos0 int, q, w []float32, T int, visible []int) {
	H, D, W := c.Heads, c.Dim, c.Width()
	scale := float32(1 / math.Sqrt(float64(D)))
	keep := c.TopK / c.KPool
	for j := 0; j < T; j++ {
		row := sel[j*W : (j+1)*W]
		for i := range row {
			row[i] = -1
		}
		n := visible[j]
		var scores []float32
		qj, wj := q[j*H*D:(j+1)*H*D], w[j*H:(j+1)*H]
		for p := 0; p < n; p++ {
			key := st.Pools.Row(p)
			var s float32
			for h := 0; h < H; h++ {
				var dot float32
				for x, v := range qj[h*D : (h+1)*D] {
					dot += v * key[x]
				}
				dot *= scale
				if dot > 0 {
					s += wj[h] * dot
				}
			}
			scores = append(scores, s)
		}
		k := min(keep, n)
		var order []int
		for p := 0; p < n; p++ {
			order = append(order, p)
		}
		if k < n {
			sort.SliceStable(order, func(a, b int) bool { return scores[order[a]] > scores[order[b]] })
		}
		chosen := order[:k]
		sort.Ints(chosen)
		o := 0
		for _, p := range chosen {
			for x := 0; x < c.KPool; x++ {
				row[o] = int32(p*c.KPool + x)
				o++
			}
		}
		if c.SelectTail {
			for pos := n * c.KPool; pos <= pos0+j; pos++ {
				row[o] = int32(pos)
				o++
			}
		}
	}
}

// TestSelectMatchesLegacy compares the GEMM-shaped Select with the scalar
// one row for row (random data has no near-ties the summation order could
// flip), for prefill chunks, decode steps, and with ties: duplicated pools
// and queries whose every score is an exact ReLU zero.
func TestSelectMatchesLegacy(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 8))
	for _, tc := range []struct{ H, D, kpool, topk, L, split int }{
		{4, 16, 4, 32, 300, 300}, {4, 16, 4, 32, 300, 1}, {4, 16, 4, 32, 300, 13},
		{8, 64, 4, 256, 2100, 700}, {3, 5, 2, 6, 90, 9}, {2, 8, 4, 16, 77, 77},
	} {
		c := &Config{Heads: tc.H, Dim: tc.D, KPool: tc.kpool, TopK: tc.topk, SelectTail: true, APE: rnd(r, tc.kpool*tc.D)}
		k, g, q, w := rnd(r, tc.L*tc.D), rnd(r, tc.L*tc.D), rnd(r, tc.L*tc.H*tc.D), rnd(r, tc.L*tc.H)
		// ties: pools 3 and 5 get the keys of pools 1 and 2, and every
		// tenth query's heads all point away from every key (all scores 0)
		for x := 0; x < tc.kpool*tc.D; x++ {
			k[3*tc.kpool*tc.D+x], g[3*tc.kpool*tc.D+x] = k[tc.kpool*tc.D+x], g[tc.kpool*tc.D+x]
			k[5*tc.kpool*tc.D+x], g[5*tc.kpool*tc.D+x] = k[2*tc.kpool*tc.D+x], g[2*tc.kpool*tc.D+x]
		}
		for j := 0; j < tc.L; j += 10 {
			for i := j * tc.H * tc.D; i < (j+1)*tc.H*tc.D; i++ {
				q[i] = 0
			}
		}
		st := &State{}
		W := c.Width()
		for t0 := 0; t0 < tc.L; t0 += tc.split {
			n := min(tc.split, tc.L-t0)
			vis := make([]int, n)
			require.NoError(t, c.Append(st, t0, k[t0*tc.D:(t0+n)*tc.D], g[t0*tc.D:(t0+n)*tc.D], n, vis))
			got, want := make([]int32, n*W), make([]int32, n*W)
			qs, ws := q[t0*tc.H*tc.D:(t0+n)*tc.H*tc.D], w[t0*tc.H:(t0+n)*tc.H]
			c.Select(got, st, t0, qs, ws, n, vis)
			legacySelect(c, want, st, t0, qs, ws, n, vis)
			require.Equal(t, want, got, "%+v chunk at %d", tc, t0)
		}
	}
}

func TestTopPoolsMatchesStableSort(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for it := 0; it < 2000; it++ {
		n := r.IntN(70)
		k := r.IntN(n + 3)
		scores := make([]float32, n)
		levels := 1 + r.IntN(6) // few distinct values: many ties
		for i := range scores {
			switch r.IntN(20) {
			case 0:
				scores[i] = float32(math.NaN())
			case 1:
				scores[i] = float32(math.Inf(-1))
			default:
				scores[i] = float32(r.IntN(levels)) - 2
			}
		}
		order := make([]int, n)
		for i := range order {
			order[i] = i
		}
		key := func(i int) float64 { // NaN last
			if s := float64(scores[i]); s == s {
				return s
			}
			return math.Inf(-1)
		}
		sort.SliceStable(order, func(a, b int) bool {
			ka, kb := key(order[a]), key(order[b])
			if ka != kb {
				return ka > kb
			}
			// -Inf before NaN
			return !math.IsNaN(float64(scores[order[a]])) && math.IsNaN(float64(scores[order[b]]))
		})
		want := append([]int(nil), order[:min(k, n)]...)
		sort.Ints(want)
		got := TopPools(nil, scores, k)
		gi := make([]int, len(got))
		for i, p := range got {
			gi[i] = int(p)
		}
		if len(want) == 0 {
			want = []int{}
		}
		require.Equal(t, want, gi, "scores %v k %d", scores, k)
	}
}

func BenchmarkSelectDecode(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	// the bench preset's indexer: 8 heads of 64, top 256 tokens in pools of 4
	H, D := 8, 64
	c := &Config{Heads: H, Dim: D, KPool: 4, TopK: 256, SelectTail: true, APE: rnd(r, 4*D)}
	for _, ctx := range []int{1024, 8192} {
		st := &State{}
		require.NoError(b, c.Append(st, 0, rnd(r, (ctx-1)*D), rnd(r, (ctx-1)*D), ctx-1, nil))
		vis := make([]int, 1)
		require.NoError(b, c.Append(st, ctx-1, rnd(r, D), rnd(r, D), 1, vis))
		q, w := rnd(r, H*D), rnd(r, H)
		sel := make([]int32, c.Width())
		b.Run(fmt.Sprintf("ctx=%d/gemm", ctx), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				c.Select(sel, st, ctx-1, q, w, 1, vis)
			}
		})
		b.Run(fmt.Sprintf("ctx=%d/legacy", ctx), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				legacySelect(c, sel, st, ctx-1, q, w, 1, vis)
			}
		})
	}
}
