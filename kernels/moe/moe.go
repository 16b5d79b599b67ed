// Package moe implements GLM's sigmoid-scored, bias-corrected, optionally
// group-limited expert routing and the routed-expert computation.
package moe

import (
	"math"
	"sort"

	"github.com/glmflash/glmflash/kernels/act"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/kernels/parallel"
)

// Router holds the routing hyper-parameters.
type Router struct {
	Experts   int       // n_routed_experts
	TopK      int       // num_experts_per_tok
	Groups    int       // n_group (1 = no group stage)
	TopKGroup int       // topk_group
	Normalize bool      // norm_topk_prob
	Scaling   float32   // routed_scaling_factor
	Bias      []float32 // e_score_correction_bias [Experts]
}

// Route selects, for each of T tokens with router logits ([T][Experts]),
// TopK experts by sigmoid(logit)+bias (restricted to the TopKGroup best
// groups, a group scored by the sum of its two best biased scores), and
// weights them by the unbiased sigmoid scores, renormalized (+1e−20) and
// scaled. Ties go to the lower index. idx and w are [T][TopK]; idx is sorted
// ascending within a token.
func (r *Router) Route(idx []int32, w []float32, logits []float32, T int) {
	r.RouteWith(new(Workspace), idx, w, logits, T)
}

// RouteWith is Route with its scratch taken from ws.
func (r *Router) RouteWith(ws *Workspace, idx []int32, w []float32, logits []float32, T int) {
	E, K := r.Experts, r.TopK
	s := grow(&ws.s, E)
	choice := grow(&ws.choice, E)
	per := E / r.Groups
	gs := grow(&ws.gs, r.Groups)
	for t := 0; t < T; t++ {
		lt := logits[t*E : (t+1)*E]
		for e, v := range lt {
			s[e] = act.Sigmoid(v)
			choice[e] = s[e] + r.Bias[e]
		}
		if r.Groups > 1 {
			for g := 0; g < r.Groups; g++ {
				a, b := float32(math.Inf(-1)), float32(math.Inf(-1))
				for _, v := range choice[g*per : (g+1)*per] {
					if v > a {
						a, b = v, a
					} else if v > b {
						b = v
					}
				}
				gs[g] = a + b
			}
			keep := ws.topK(gs, r.TopKGroup)
			allowed := grow(&ws.allowed, r.Groups)
			clear(allowed)
			for _, g := range keep {
				allowed[g] = true
			}
			for e := range choice {
				if !allowed[e/per] {
					choice[e] = float32(math.Inf(-1))
				}
			}
		}
		sel := ws.topK(choice, K)
		sort.Ints(sel)
		var sum float32
		for k, e := range sel {
			idx[t*K+k] = int32(e)
			w[t*K+k] = s[e]
			sum += s[e]
		}
		for k := 0; k < K; k++ {
			if r.Normalize {
				w[t*K+k] /= sum + 1e-20
			}
			w[t*K+k] *= r.Scaling
		}
	}
}

// Workspace is the scratch memory of Router.RouteWith and
// Experts.ForwardWith. Calls through one Workspace reuse its memory,
// growing it only when a call needs more, so a steady stream of calls
// allocates nothing. The zero value is ready to use; a Workspace serves one
// call at a time.
type Workspace struct {
	// routing
	s, choice, gs []float32
	allowed       []bool
	order         byDesc
	// experts: slots per expert, the active experts, each slot's row in
	// the blocks, and every active expert's x rows (then its weighted down
	// rows, which overwrite them), gate and up rows
	tokens   [][]int
	active   []int
	base     []int
	slotRow  []int
	xs, g, u []float32
	// the call in progress, read by expert (each is ws.expert, made once)
	ex   *Experts
	x, w []float32
	K    int
	each func(int)
}

// grow returns (*b)[:n], reallocating when the capacity is short (contents
// undefined).
func grow[E any](b *[]E, n int) []E {
	if cap(*b) < n {
		*b = make([]E, n)
	}
	return (*b)[:n]
}

// byDesc orders indices by descending value (sort.Stable keeps ties in
// index order).
type byDesc struct {
	idx []int
	v   []float32
}

func (b *byDesc) Len() int           { return len(b.idx) }
func (b *byDesc) Less(i, j int) bool { return b.v[b.idx[i]] > b.v[b.idx[j]] }
func (b *byDesc) Swap(i, j int)      { b.idx[i], b.idx[j] = b.idx[j], b.idx[i] }

// topK returns the indices of the k largest values (ties: lower index
// first), in ws's memory (valid until the next topK). sort.Stable runs the
// same comparisons and swaps as sort.SliceStable did, so the choice is
// unchanged even where comparisons are not a strict order (NaN).
func (ws *Workspace) topK(v []float32, k int) []int {
	o := &ws.order
	o.idx, o.v = grow(&o.idx, len(v)), v
	for i := range o.idx {
		o.idx[i] = i
	}
	sort.Stable(o)
	o.v = nil
	return o.idx[:k]
}

// Experts are the routed experts' weights: per expert gate and up
// [I][D] and down [D][I], clamped-SwiGLU activation.
type Experts struct {
	N, D, I int
	Gate    [][]float32
	Up      [][]float32
	Down    [][]float32
	// GateB/UpB/DownB, when set, hold the same weights as bfloat16 bits
	// (used instead of Gate/Up/Down).
	GateB, UpB, DownB [][]uint16
	// GateF8/UpF8/DownF8, when set (and GateB nil), hold the weights as
	// FP8 e4m3 codes with block scales, dequantized a tile at a time
	// inside the GEMMs (gemm.MatMulTFP8Serial): the results are those of
	// the dequantized weights.
	GateF8, UpF8, DownF8 []*gemm.FP8
	// BF16Act rounds the activations of the bf16-weight GEMMs to bfloat16
	// (gemm.MatMulTBF16Act: the precision bf16 mode); fp32 weights are
	// unaffected.
	BF16Act bool
	Limit   float32
	GEMM    gemm.Params
}

// Forward computes dst[t] = Σ_k w[t][k]·Expert_{idx[t][k]}(x[t]) for T tokens
// (overwriting dst). Tokens are grouped per expert so that each expert runs
// one GEMM over its tokens; contributions are summed per token in ascending
// expert order, so results do not depend on scheduling.
func (ex *Experts) Forward(dst, x []float32, idx []int32, w []float32, T, K int) {
	ex.ForwardWith(new(Workspace), dst, x, idx, w, T, K)
}

// ForwardWith is Forward with its scratch taken from ws.
func (ex *Experts) ForwardWith(ws *Workspace, dst, x []float32, idx []int32, w []float32, T, K int) {
	D, I := ex.D, ex.I
	tokens := grow(&ws.tokens, ex.N) // per expert: flat (t*K+k) slots
	for e := range tokens {
		tokens[e] = tokens[e][:0]
	}
	for s := 0; s < T*K; s++ {
		e := idx[s]
		tokens[e] = append(tokens[e], s)
	}
	slotRow := grow(&ws.slotRow, T*K) // each slot's row in its expert's block
	active := grow(&ws.active, ex.N)[:0]
	base := grow(&ws.base, ex.N)[:0] // first row of each active expert's blocks
	rows := 0
	for e := range tokens {
		if len(tokens[e]) > 0 {
			active = append(active, e)
			base = append(base, rows)
			rows += len(tokens[e])
		}
	}
	ws.active, ws.base = active, base
	for ai, e := range active {
		for i, s := range tokens[e] {
			slotRow[s] = base[ai] + i
		}
	}
	grow(&ws.xs, rows*D) // the gathered inputs, then the weighted outputs
	grow(&ws.g, rows*I)
	grow(&ws.u, rows*I)
	ws.ex, ws.x, ws.w, ws.K = ex, x, w, K
	if ws.each == nil { // made once: a run allocates no closure
		ws.each = ws.expert
	}
	parallel.Each(len(active), ws.each)
	ws.ex, ws.x, ws.w = nil, nil, nil
	for t := 0; t < T; t++ {
		dt := dst[t*D : (t+1)*D]
		for d := range dt {
			dt[d] = 0
		}
		for k := 0; k < K; k++ { // idx is ascending within a token
			r := slotRow[t*K+k]
			gemm.Axpy(dt, 1, ws.xs[r*D:(r+1)*D])
		}
	}
}

// expert runs the ai-th active expert of the call in progress over its
// tokens and writes their weighted contributions.
func (ws *Workspace) expert(ai int) {
	ex, x, w, K := ws.ex, ws.x, ws.w, ws.K
	D, I := ex.D, ex.I
	e := ws.active[ai]
	slots := ws.tokens[e]
	n, b := len(slots), ws.base[ai]
	xs := ws.xs[b*D : (b+n)*D]
	for i, s := range slots {
		copy(xs[i*D:(i+1)*D], x[(s/K)*D:(s/K+1)*D])
	}
	g := ws.g[b*I : (b+n)*I]
	u := ws.u[b*I : (b+n)*I]
	y := xs // the inputs are dead once gate and up have run
	if ex.GateB == nil && ex.GateF8 != nil {
		mm := gemm.MatMulTFP8Serial
		if ex.BF16Act {
			mm = gemm.MatMulTFP8ActSerial
		}
		mm(g, xs, n, D, ex.GateF8[e], I)
		mm(u, xs, n, D, ex.UpF8[e], I)
		act.SwiGLUSerial(g, g, u, ex.Limit)
		mm(y, g, n, I, ex.DownF8[e], D)
	} else if ex.GateB != nil {
		mm := gemm.MatMulTBF16Serial
		if ex.BF16Act {
			mm = gemm.MatMulTBF16ActSerial
		}
		mm(g, xs, n, D, ex.GateB[e], I)
		mm(u, xs, n, D, ex.UpB[e], I)
		act.SwiGLUSerial(g, g, u, ex.Limit)
		mm(y, g, n, I, ex.DownB[e], D)
	} else {
		serialMatMulT(g, xs, n, D, ex.Gate[e], I)
		serialMatMulT(u, xs, n, D, ex.Up[e], I)
		act.SwiGLUSerial(g, g, u, ex.Limit)
		serialMatMulT(y, g, n, I, ex.Down[e], D)
	}
	for i, s := range slots { // weighted in place: the reduction adds them
		ws := w[s]
		c := y[i*D : (i+1)*D]
		for d, v := range c {
			c[d] = ws * v
		}
	}
}

// serialMatMulT runs a GEMM on the calling goroutine (experts are already
// spread across workers).
func serialMatMulT(dst, x []float32, T, K int, w []float32, N int) {
	gemm.MatMulTSerial(dst, x, T, K, w, N)
}
