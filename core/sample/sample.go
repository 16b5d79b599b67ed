// Package sample turns a logits row into a token: greedy, or seeded
// sampling with temperature, top-k, top-p and min-p.
package sample

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
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
	idx []int
	pr  []float64
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

// Next picks a token from logits.
func (s *Sampler) Next(logits []float32) int {
	p := s.p
	if p.Temperature == 0 {
		return Argmax(logits)
	}
	s.idx = s.idx[:0]
	for i := range logits {
		s.idx = append(s.idx, i)
	}
	sort.SliceStable(s.idx, func(a, b int) bool { return logits[s.idx[a]] > logits[s.idx[b]] })
	n := len(s.idx)
	if p.TopK > 0 && p.TopK < n {
		n = p.TopK
	}
	mx := float64(logits[s.idx[0]])
	s.pr = s.pr[:0]
	var sum float64
	for _, i := range s.idx[:n] {
		e := math.Exp((float64(logits[i]) - mx) / p.Temperature)
		s.pr = append(s.pr, e)
		sum += e
	}
	for i := range s.pr {
		s.pr[i] /= sum
	}
	if p.MinP > 0 {
		cut := p.MinP * s.pr[0]
		for n > 1 && s.pr[n-1] < cut {
			n--
		}
	}
	if p.TopP < 1 {
		var c float64
		for i := 0; i < n; i++ {
			c += s.pr[i]
			if c >= p.TopP {
				n = i + 1
				break
			}
		}
	}
	var total float64
	for _, v := range s.pr[:n] {
		total += v
	}
	u := s.rng.Float64() * total
	for i, v := range s.pr[:n] {
		u -= v
		if u <= 0 {
			return s.idx[i]
		}
	}
	return s.idx[n-1]
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
			return fmt.Errorf("non-finite logits: %d of %d values (the first, token %d, is %v): the model's weights or activations overflowed", n, len(logits), i, v)
		}
	}
	return nil
}
