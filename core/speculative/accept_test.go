package speculative

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/glmflash/glmflash/core/sample"
	"github.com/stretchr/testify/require"
)

// chiSquarePValue is P(X ≥ x) for X chi-square with k degrees of freedom
// (Wilson–Hilferty: accurate to a few 1e-3 in p for k ≥ 3).
func chiSquarePValue(x float64, k int) float64 {
	kf := float64(k)
	z := (math.Cbrt(x/kf) - (1 - 2/(9*kf))) / math.Sqrt(2/(9*kf))
	return 0.5 * math.Erfc(z/math.Sqrt2)
}

// chiSquare compares counts with probabilities (over n trials); cells
// whose expected count is under 5 are pooled. It returns the statistic
// and the degrees of freedom.
func chiSquare(counts map[int32]int, probs map[int32]float64, n int) (float64, int) {
	var x, poolE float64
	poolO, cells := 0, 0
	for id, p := range probs {
		e := p * float64(n)
		if e < 5 {
			poolE += e
			poolO += counts[id]
			continue
		}
		d := float64(counts[id]) - e
		x += d * d / e
		cells++
	}
	for id, c := range counts {
		if _, ok := probs[id]; !ok {
			poolO += c // outside the support: expected 0
		}
	}
	if poolE > 0 || poolO > 0 {
		if poolE < 1e-9 {
			return math.Inf(1), cells // a token outside the target's support
		}
		d := float64(poolO) - poolE
		x += d * d / poolE
		cells++
	}
	return x, cells - 1
}

func dist(row []float32, p sample.Params) map[int32]float64 {
	ids, probs := sample.Dist(row, p)
	m := map[int32]float64{}
	for i, id := range ids {
		m[int32(id)] = probs[i]
	}
	return m
}

func draw(r *rand.Rand, d Dist) int32 {
	u := r.Float64()
	for i, p := range d.Probs {
		u -= p
		if u < 0 {
			return d.IDs[i]
		}
	}
	return d.IDs[len(d.IDs)-1]
}

// Speculative sampling reproduces the target distribution: over 60,000
// seeded trials of a two-draft span (drafts drawn from the drafter's q, or
// deterministic), the first token is distributed as the first row's p and
// the second, after an accepted first draft, as the second row's, for
// temperature, top-k, top-p and min-p settings (chi-square, significance
// 1e-3; fixed seeds, so the test is deterministic). A rule that accepts
// every draft in the target's support is rejected by the same test.
func TestAcceptPreservesTargetDistribution(t *testing.T) {
	rows := [][]float32{
		{2.0, 1.1, 0.3, -0.4, 1.6, 0.9, -1.2, 0.0},
		{0.2, 1.8, 1.5, 0.1, -0.7, 0.6, 0.9, -0.2},
		{1.0, 0.4, 0.8, 2.2, 0.0, -0.5, 0.7, 1.3},
	}
	row := func(j int) []float32 { return rows[j] }
	qs := []Dist{
		{IDs: []int32{0, 1, 4, 6}, Probs: []float64{0.2, 0.3, 0.4, 0.1}},
		{IDs: []int32{1, 2, 5}, Probs: []float64{0.5, 0.25, 0.25}},
	}
	params := []sample.Params{
		{Temperature: 1, TopP: 1},
		{Temperature: 0.7, TopP: 0.85},
		{Temperature: 1.3, TopK: 4, TopP: 1},
		{Temperature: 0.9, TopP: 1, MinP: 0.2},
	}
	const n = 60000
	for pi, p := range params {
		for _, deterministic := range []bool{false, true} {
			r := rand.New(rand.NewPCG(uint64(pi+1), 77))
			first, second := map[int32]int{}, map[int32]int{}
			nsecond := 0
			for range n {
				var drafts []int32
				var q []Dist
				if deterministic {
					drafts = []int32{1, 2} // fixed drafts: q one-hot
				} else {
					drafts, q = []int32{draw(r, qs[0]), draw(r, qs[1])}, qs
				}
				acc, next := Accept(row, drafts, q, p, r.Float64)
				out := append(append([]int32(nil), drafts[:acc]...), next)
				first[out[0]]++
				if acc >= 1 {
					second[out[1]]++
					nsecond++
				}
			}
			x, df := chiSquare(first, dist(rows[0], p), n)
			require.Greater(t, chiSquarePValue(x, df), 1e-3, "params %+v deterministic %v: first token χ²=%.1f (df %d)", p, deterministic, x, df)
			if deterministic {
				// the second row is the target after draft 1, which plain decoding reaches only through it
				x, df = chiSquare(second, dist(rows[1], p), nsecond)
				require.Greater(t, chiSquarePValue(x, df), 1e-3, "params %+v: second token χ²=%.1f (df %d, %d trials)", p, x, df, nsecond)
			}
		}
	}
	// power: accepting every draft the target can produce is not the target distribution
	r := rand.New(rand.NewPCG(5, 5))
	p := params[0]
	naive := map[int32]int{}
	for range n {
		d := draw(r, qs[0])
		naive[d]++ // always accepted
	}
	x, df := chiSquare(naive, dist(rows[0], p), n)
	require.Less(t, chiSquarePValue(x, df), 1e-6, "the test must detect a rule that ignores p/q")
}

// Greedy acceptance keeps drafts while they equal the target's argmax and
// uses no randomness.
func TestAcceptGreedy(t *testing.T) {
	acc, next := AcceptGreedy([]int32{5, 7, 9, 2}, []int32{5, 7, 1})
	require.Equal(t, 2, acc)
	require.Equal(t, int32(9), next)
	acc, next = AcceptGreedy([]int32{5, 7, 9, 2}, []int32{5, 7, 9})
	require.Equal(t, 3, acc)
	require.Equal(t, int32(2), next)
	acc, next = AcceptGreedy([]int32{4}, nil)
	require.Equal(t, 0, acc)
	require.Equal(t, int32(4), next)
	rows := [][]float32{{0, 3, 1}, {2, 0, 1}, {0, 0, 5}}
	acc, next = Accept(func(j int) []float32 { return rows[j] }, []int32{1, 0}, nil, sample.Greedy(), func() float64 {
		t.Fatal("greedy acceptance drew randomness")
		return 0
	})
	require.Equal(t, 2, acc)
	require.Equal(t, int32(2), next)
}

// The oracle's wrong rate spoils drafts independently at the asked rate,
// the same way for the same sequence.
func TestWrongRate(t *testing.T) {
	w := WrongRate(0.8, 3)
	h := History{Prompt: []int32{1, 2, 3}}
	bad := 0
	for i := range 20000 {
		if w(h, i) {
			bad++
		}
		require.Equal(t, w(h, i), w(h, i))
	}
	require.InDelta(t, 0.2, float64(bad)/20000, 0.01)
}
