package speculative

import "github.com/glmflash/glmflash/core/sample"

// AcceptGreedy decides a greedy verify span from the target's argmax
// tokens: targets[j] is the target's token after the span's j-th token
// ([last, d1, …, dK]: K+1 entries for K drafts). Drafts are accepted while
// they equal the target's token; the target's token at the first mismatch
// (or after the last draft) follows them. The emitted tokens are exactly
// what greedy decoding one token at a time produces.
func AcceptGreedy(targets, drafts []int32) (accepted int, next int32) {
	for accepted < len(drafts) && drafts[accepted] == targets[accepted] {
		accepted++
	}
	return accepted, targets[accepted]
}

// Accept decides a verify span with the standard speculative sampling rule
// (Leviathan et al. 2023; Chen et al. 2023), which keeps the output
// distribution exactly the target's: row(j) is the target's logits after
// the span's j-th token ([last, d1, …, dK]), p the request's sampling
// parameters (the target distribution is sample.Dist's: the one plain
// sampling draws from, after top-k, temperature, min-p and top-p), q the
// drafts' distributions (nil: deterministic drafts, q one-hot on each) and
// draw the request's seeded uniform stream.
//
// Draft d_j is accepted with probability min(1, p(d_j)/q(d_j)). At the first
// rejection the target's token is drawn from norm(max(0, p − q)), and the
// span ends; when every draft is accepted the bonus token is drawn from the
// last row's p (as sample.Pick draws). At temperature 0 p is one-hot on the
// argmax and the rule is AcceptGreedy (no randomness used).
func Accept(row func(j int) []float32, drafts []int32, q []Dist, p sample.Params, draw func() float64) (accepted int, next int32) {
	if p.Temperature == 0 {
		targets := make([]int32, 0, len(drafts)+1)
		for j := 0; j <= len(drafts); j++ {
			targets = append(targets, int32(sample.Argmax(row(j))))
			if j < len(drafts) && targets[j] != drafts[j] {
				break
			}
		}
		return AcceptGreedy(targets, drafts[:len(targets)-1])
	}
	for j, d := range drafts {
		ids, probs := sample.Dist(row(j), p)
		pd := 0.0
		for i, id := range ids {
			if int32(id) == d {
				pd = probs[i]
				break
			}
		}
		qd := 1.0
		if q != nil {
			qd = q[j].P(d)
		}
		if u := draw(); qd > 0 && u*qd < pd { // u < p/q without dividing
			continue
		}
		return j, residual(ids, probs, q, j, d, draw())
	}
	return len(drafts), int32(sample.Pick(row(len(drafts)), p, draw()))
}

// residual draws the target's token at a rejected draft d of span row j
// from norm(max(0, p − q)) (p: the row's ids and probs; q: the drafts'
// distributions, nil for one-hot on d) with the uniform u.
func residual(ids []int, probs []float64, q []Dist, j int, d int32, u float64) int32 {
	res := make([]float64, len(ids))
	var sum float64
	for i, id := range ids {
		qx := 0.0
		switch {
		case q != nil:
			qx = q[j].P(int32(id))
		case int32(id) == d:
			qx = 1
		}
		if r := probs[i] - qx; r > 0 {
			res[i] = r
			sum += r
		}
	}
	if sum <= 0 { // p == q up to rounding: the residual is empty, p itself is exact
		res, sum = probs, 1
	}
	u *= sum
	for i, r := range res {
		u -= r
		if u < 0 && r > 0 {
			return int32(ids[i])
		}
	}
	for i := len(res) - 1; i >= 0; i-- { // rounding left u ≥ 0: the last token with mass
		if res[i] > 0 {
			return int32(ids[i])
		}
	}
	return int32(ids[len(ids)-1]) // unreachable: probs has mass
}
