// Package sample turns a logits row into a token: greedy, or seeded
// sampling with temperature, top-k, top-p and min-p.
package sample

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
)

// Params choose the sampling rule. Temperature 0 means greedy.
type Params struct {
	Temperature float64 // ≥ 0; 0 = greedy
	TopK        int     // 0 = off
	TopP        float64 // (0, 1]; 1 = off
	MinP        float64 // [0, 1); 0 = off
	Seed        uint64
}

// Validate checks ranges and names the bad field.
func (p Params) Validate() error {
	switch {
	case p.Temperature < 0 || math.IsNaN(p.Temperature) || math.IsInf(p.Temperature, 0):
		return fmt.Errorf("temperature must be a finite value ≥ 0, got %v", p.Temperature)
	case p.TopK < 0:
		return fmt.Errorf("top_k must be ≥ 0, got %d", p.TopK)
	case !(p.TopP > 0 && p.TopP <= 1):
		return fmt.Errorf("top_p must be in (0, 1], got %v", p.TopP)
	case !(p.MinP >= 0 && p.MinP < 1):
		return fmt.Errorf("min_p must be in [0, 1), got %v", p.MinP)
	}
	return nil
}

// Greedy returns Params for argmax decoding.
func Greedy() Params { return Params{TopP: 1} }

// Sampler draws tokens for one sequence; it is deterministic for a seed.
type Sampler struct {
	p   Params
	rng *rand.Rand
}

// New returns a sampler (p must be valid).
func New(p Params) *Sampler {
	return &Sampler{p: p, rng: rand.New(rand.NewPCG(p.Seed, p.Seed^0x9e3779b97f4a7c15))}
}

// Argmax returns the index of the largest logit (lowest index on ties).
func Argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

// Draw returns the uniform number in [0, 1) that the next pick uses (0,
// without consuming randomness, when the parameters are greedy). Next is
// Pick(logits, params, Draw()).
func (s *Sampler) Draw() float64 {
	if s.p.Temperature == 0 {
		return 0
	}
	return s.rng.Float64()
}

// Params returns the sampler's parameters.
func (s *Sampler) Params() Params { return s.p }

// Next picks a token from logits.
func (s *Sampler) Next(logits []float32) int { return Pick(logits, s.p, s.Draw()) }

// Pick chooses a token from logits with parameters p and the uniform draw
// u: greedy (lowest index on ties) at temperature 0; otherwise the tokens
// sorted by logit (ties: lower index first) are cut to top_k, turned into
// probabilities at the temperature, cut by min_p (relative to the most
// likely) and top_p (the shortest prefix whose mass reaches it), and the
// token where the cumulative mass first reaches u times the kept mass is
// returned. Device samplers implement the same rule.
func Pick(logits []float32, p Params, u float64) int {
	if p.Temperature == 0 {
		return Argmax(logits)
	}
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	idx, pr, total := kept(logits, p, sc)
	u *= total
	for i, v := range pr {
		u -= v
		if u <= 0 {
			return idx[i]
		}
	}
	return idx[len(idx)-1]
}

// scratch is kept's working memory (a vocabulary's ids and
// probabilities), pooled so that sampling a row allocates nothing in the
// steady state.
type scratch struct {
	idx []int
	pr  []float64
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// kept is the sampling rule's kept tokens for p (temperature > 0): ids by
// logit (ties lower id first) cut to top_k, then by min_p and top_p, with
// their probabilities at the temperature (normalised over the top_k tokens)
// and the kept mass. The slices are sc's: valid until sc is reused.
func kept(logits []float32, p Params, sc *scratch) (idx []int, pr []float64, total float64) {
	if cap(sc.idx) < len(logits) {
		sc.idx = make([]int, len(logits))
	}
	idx = sc.idx[:len(logits)]
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return logits[idx[a]] > logits[idx[b]] })
	n := len(idx)
	if p.TopK > 0 && p.TopK < n {
		n = p.TopK
	}
	mx := float64(logits[idx[0]])
	pr = sc.pr[:0]
	var sum float64
	for _, i := range idx[:n] {
		e := expNeg((float64(logits[i]) - mx) / p.Temperature)
		pr = append(pr, e)
		sum += e
	}
	for i := range pr {
		pr[i] /= sum
	}
	// Tokens of probability 0 (banned ones, sample.Banned, or logits so far
	// below the top that exp underflows) are never kept: the draw's
	// fall-through pick (Pick's last kept token) must be a possible one.
	for n > 1 && pr[n-1] == 0 {
		n--
	}
	if p.MinP > 0 {
		cut := p.MinP * pr[0]
		for n > 1 && pr[n-1] < cut {
			n--
		}
	}
	if p.TopP < 1 {
		var c float64
		for i := 0; i < n; i++ {
			c += pr[i]
			if c >= p.TopP {
				n = i + 1
				break
			}
		}
	}
	for _, v := range pr[:n] {
		total += v
	}
	sc.pr = pr
	return idx[:n], pr[:n], total
}

// Dist returns the distribution Pick draws from for p: the kept token ids
// in Pick's order (by logit, ties lower id first: top_k, then min_p and
// top_p cut at the temperature) and their probabilities, normalised over
// the kept tokens. Temperature 0 keeps the argmax with probability 1.
// Speculative sampling's acceptance rule reads the target's distribution
// here, so that it preserves exactly the distribution plain sampling draws
// from.
func Dist(logits []float32, p Params) ([]int, []float64) {
	if p.Temperature == 0 {
		return []int{Argmax(logits)}, []float64{1}
	}
	var sc scratch // the ids are returned: not pooled
	idx, pr, total := kept(logits, p, &sc)
	for i := range pr {
		pr[i] /= total
	}
	return idx, pr
}

// expNeg is math.Exp(x), 0 without calling it where the result is 0
// anyway (x < −746: below half the smallest subnormal): math.Exp takes a
// slow path there, which a row of banned tokens (Banned − max) hits on
// every one of them.
func expNeg(x float64) float64 {
	if x < -746 {
		return 0
	}
	return math.Exp(x)
}

// TokenLogprob is one alternative token and its log-probability.
type TokenLogprob struct {
	ID      int32
	Logprob float32
}

// Logprobs returns the log-softmax of tok and the n most likely tokens
// (ties: lower id first).
func Logprobs(row []float32, tok int32, n int) (float32, []TokenLogprob) {
	mx := float32(math.Inf(-1))
	for _, v := range row {
		mx = max(mx, v)
	}
	var sum float64
	for _, v := range row {
		sum += expNeg(float64(v - mx))
	}
	lse := float64(mx) + math.Log(sum)
	lp := float32(float64(row[tok]) - lse)
	if n <= 0 {
		return lp, nil
	}
	top := make([]TokenLogprob, 0, n+1)
	for i, v := range row {
		if len(top) == n && v <= top[n-1].Logprob {
			continue
		}
		j := len(top)
		for j > 0 && top[j-1].Logprob < v {
			j--
		}
		top = slices.Insert(top, j, TokenLogprob{ID: int32(i), Logprob: v})
		if len(top) > n {
			top = top[:n]
		}
	}
	for i := range top {
		top[i].Logprob = float32(float64(top[i].Logprob) - lse)
	}
	return lp, top
}

// CheckFinite returns an error naming the first NaN or infinite logit:
// such a row has no distribution to sample from (greedy would silently
// pick token 0), so the request must end with an error instead.
func CheckFinite(logits []float32) error {
	for i, v := range logits {
		if v != v || v > math.MaxFloat32 || v < -math.MaxFloat32 {
			n := 0
			for _, w := range logits[i:] {
				if w != w || w > math.MaxFloat32 || w < -math.MaxFloat32 {
					n++
				}
			}
			return NonFinite(n, len(logits), i, v)
		}
	}
	return nil
}

// NonFinite is the error for a logits row with n non-finite values of
// total, the first at token first with value v (device samplers report
// these counts).
func NonFinite(n, total, first int, v float32) error {
	return fmt.Errorf("non-finite logits: %d of %d values (the first, token %d, is %v): the model's weights or activations overflowed", n, total, first, v)
}
