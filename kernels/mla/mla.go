// Package mla implements sparse NoPE multi-head latent attention over a
// cache of compressed c_kv latents. Each query attends only its selected
// positions, by one of two algebraically identical paths (architecture.md
// §5):
//
//   - expand: the union of the selected positions is expanded to per-head
//     keys and values through kv_b_proj (one GEMM), then every (query, head)
//     attends its positions in the expanded space;
//   - absorbed: the key half of kv_b_proj is absorbed into each query head
//     (q_lat[h] = W_UK[h]ᵀ·q_h, a Rank-dim query), the query attends the
//     cached latents themselves (MQA over one Rank-dim head with V = K =
//     c_kv), and the value half maps the latent output back per head
//     (o_h = W_UV[h]·o_lat[h]).
//
// Attend picks the cheaper path per call with the cost rule of Costs.
package mla

import (
	"math"
	"sync"

	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/kernels/paged"
	"github.com/glmflash/glmflash/kernels/parallel"
)

// Path selects how Attend computes attention.
type Path int

const (
	// PathAuto picks the path with fewer multiply-adds (Costs).
	PathAuto Path = iota
	// PathExpand always expands the selected latents through kv_b_proj.
	PathExpand
	// PathAbsorb always attends in the latent space.
	PathAbsorb
)

// String names the path.
func (p Path) String() string {
	switch p {
	case PathExpand:
		return "expand"
	case PathAbsorb:
		return "absorb"
	}
	return "auto"
}

// Force, when not PathAuto, overrides every Config's Path (tests and
// benchmarks use it to run one path through a whole model).
var Force = PathAuto

// Config is the attention geometry.
type Config struct {
	Heads  int // num_attention_heads
	QKDim  int // qk_nope_head_dim (+ rope, which is 0 for this model)
	VDim   int // v_head_dim
	Rank   int // kv_lora_rank
	Scale  float32
	KVBW   []float32 // kv_b_proj [Heads·(QKDim+VDim)][Rank]
	Params gemm.Params
	Path   Path // PathAuto (the zero value) applies the cost rule
}

// Costs returns the multiply-adds each path spends on T queries whose
// selection rows list sel positions in all over union distinct positions:
//
//	expand = union·Rank·Heads·(QKDim+VDim)   expand K and V of the union
//	       + sel·Heads·(QKDim+VDim)          logits and weighted sum per head
//	absorb = T·Heads·QKDim·Rank              absorb W_UK into the queries
//	       + sel·Heads·2·Rank                logits and weighted sum of latents
//	       + T·Heads·VDim·Rank               W_UV on the latent outputs
//
// Decode (T = 1, union = sel) always favours absorb, by about
// union·(QKDim+VDim)/(2·Rank)× less work once the context is a few tokens
// long; a long prefill chunk, whose union is about T and whose rows hold many
// positions each, favours expand whenever QKDim+VDim < 2·Rank (it expands
// each key once instead of attending Rank-wide latents).
//
// A chunk of a long context is different: its queries select positions all
// over the cache, so the union grows with the context (about the whole cache
// once each query's pools are spread over it) while T and sel stay fixed.
func (c *Config) Costs(T, sel, union int) (expand, absorb int) {
	H, dq, dv, R := c.Heads, c.QKDim, c.VDim, c.Rank
	expand = union*R*H*(dq+dv) + sel*H*(dq+dv)
	absorb = T*H*(dq+dv)*R + sel*H*2*R
	return expand, absorb
}

// Scratch returns the floats each path holds for one call, beyond the
// per-worker temporaries (see Workspace):
//
//	expand = union·(Rank + Heads·(QKDim+VDim))   the gathered latents and their expansion
//	absorb = 2·T·Heads·Rank                      the absorbed queries and the latent outputs
//
// Expand's grows with the union, which for a chunk of a long context grows
// with the context; absorb's depends on T only.
func (c *Config) Scratch(T, union int) (expand, absorb int) {
	H, dq, dv, R := c.Heads, c.QKDim, c.VDim, c.Rank
	return union * (R + H*(dq+dv)), 2 * T * H * R
}

// Choose returns the path Attend takes for these counts (see Costs): Force
// or Path when set, else expand when it is at most as costly as absorb
// (Costs) and needs no more scratch than absorb (Scratch), else absorb.
// The scratch condition bounds the attention's memory by the chunk's size
// whatever the context: expand is kept for dense prefill chunks, whose
// union is about T, and refused where a chunk's union spans a long context.
func (c *Config) Choose(T, sel, union int) Path {
	if Force != PathAuto {
		return Force
	}
	if c.Path != PathAuto {
		return c.Path
	}
	if e, a := c.Costs(T, sel, union); a < e {
		return PathAbsorb
	}
	if e, a := c.Scratch(T, union); e > a {
		return PathAbsorb
	}
	return PathExpand
}

// Workspace is the scratch of Attend calls made one at a time: the position
// marks, the expand path's row map, gathered latents and expanded keys and
// values, or the absorbed path's queries and latent outputs (one buffer:
// a call takes one path). A caller that runs many attentions in turn (a
// program's layers) keeps one Workspace for all of them, so their scratch
// is the largest call's, held once, and a call of a size seen before
// allocates nothing. The zero value is ready to use; a Workspace is not for
// concurrent calls. The per-worker temporaries of the parallel steps stay
// in pools.
type Workspace struct {
	mark  []bool
	rowOf []int32
	buf   []float32
}

// wsPool serves the calls that bring no Workspace.
var wsPool = sync.Pool{New: func() any { return new(Workspace) }}

// floats returns n floats of ws.buf (contents undefined), growing it to
// exactly n when shorter: the largest call sets the size.
func (ws *Workspace) floats(n int) []float32 {
	if cap(ws.buf) < n {
		ws.buf = nil // let the old one go before the new one is made
		ws.buf = make([]float32, n)
	}
	return ws.buf[:n]
}

// Attend computes o ([T][Heads·VDim]) for T queries q ([T][Heads·QKDim]) of
// one sequence whose latents are ckv ([L][Rank], the whole cache including
// the new tokens). sel ([T][width]) lists each query's positions (−1 =
// unused). A query with no position gets a zero output. The path follows
// Choose. Its scratch comes from a pooled Workspace (see AttendWith).
func (c *Config) Attend(o, q, ckv []float32, sel []int32, T, width int) {
	ws := wsPool.Get().(*Workspace)
	defer wsPool.Put(ws)
	c.AttendWith(ws, o, q, ckv, sel, T, width)
}

// AttendWith is Attend with its scratch in ws.
func (c *Config) AttendWith(ws *Workspace, o, q, ckv []float32, sel []int32, T, width int) {
	lat := paged.Flat(c.Rank, ckv)
	c.AttendPaged(ws, o, q, &lat, sel, T, width)
}

// AttendPaged is AttendWith over latents held in pages (ckv.Len rows of
// Rank floats, the whole cache including the new tokens): the same
// arithmetic, each selected row read where its page holds it. FP8 latents
// (ckv.FP8) are dequantized as they are gathered; the arithmetic on them
// is the same.
func (c *Config) AttendPaged(ws *Workspace, o, q []float32, ckv *paged.Rows, sel []int32, T, width int) {
	L := ckv.Len
	if cap(ws.mark) < L {
		ws.mark = make([]bool, 2*L) // headroom: L grows by a token per step
	}
	mark := ws.mark[:L]
	clear(mark)
	s, u := 0, 0
	for _, p := range sel[:T*width] {
		if p >= 0 {
			s++
			if !mark[p] {
				mark[p] = true
				u++
			}
		}
	}
	if c.Choose(T, s, u) == PathAbsorb {
		c.attendAbsorbed(ws, o, q, ckv, sel, T, width)
		return
	}
	c.attendExpand(ws, o, q, ckv, sel, T, width)
}

// AttendExpand is Attend by the expand path: the union of the selected
// positions is expanded through kv_b_proj once, then each (query, head)
// attends its positions.
func (c *Config) AttendExpand(o, q, ckv []float32, sel []int32, T, width int) {
	ws := wsPool.Get().(*Workspace)
	defer wsPool.Put(ws)
	lat := paged.Flat(c.Rank, ckv)
	c.attendExpand(ws, o, q, &lat, sel, T, width)
}

func (c *Config) attendExpand(ws *Workspace, o, q []float32, ckv *paged.Rows, sel []int32, T, width int) {
	H, dq, dv, R := c.Heads, c.QKDim, c.VDim, c.Rank
	L := ckv.Len
	// rowOf[p] = the row of position p among the expanded union (ascending
	// positions), −1 when no query selects p
	if cap(ws.rowOf) < L {
		ws.rowOf = make([]int32, 2*L) // headroom, as for the marks
	}
	rowOf := ws.rowOf[:L]
	for i := range rowOf {
		rowOf[i] = -1
	}
	for _, p := range sel[:T*width] {
		if p >= 0 {
			rowOf[p] = 0
		}
	}
	n := 0
	for p, r := range rowOf {
		if r == 0 {
			rowOf[p] = int32(n)
			n++
		}
	}
	row := H * (dq + dv)
	buf := ws.floats(n*R + n*row)
	lat, kv := buf[:n*R], buf[n*R:]
	for p, r := range rowOf {
		if r >= 0 {
			ckv.ReadRow(lat[int(r)*R:int(r+1)*R], p)
		}
	}
	gemm.MatMulTWith(c.Params, kv, lat, n, R, c.KVBW, row)
	ex := expandPool.Get().(*expandRun)
	ex.c, ex.o, ex.q, ex.kv, ex.sel, ex.rowOf, ex.T, ex.width, ex.n = c, o, q, kv, sel, rowOf, T, width, n
	blocks := (T + expandRows - 1) / expandRows
	parallel.For(blocks*H, 1, ex.fn)
	ex.c, ex.o, ex.q, ex.kv, ex.sel, ex.rowOf = nil, nil, nil, nil, nil, nil
	expandPool.Put(ex)
}

// expandRows is the number of queries AttendExpand takes together per head:
// their logits against the union of their positions are one product, and
// so is their weighted sum of values.
const expandRows = 16

// expandRun is one AttendExpand call's operands; fn (made once per pooled
// run) computes tasks [lo, hi), task = head·blocks + query block.
type expandRun struct {
	c           *Config
	o, q, kv    []float32
	sel, rowOf  []int32
	T, width, n int
	fn          func(lo, hi int)
}

var expandPool = sync.Pool{New: func() any {
	ex := new(expandRun)
	ex.fn = ex.tasks
	return ex
}}

// expandScratch holds a worker's temporaries for expandRun.tasks.
type expandScratch struct {
	col          []int32 // by expanded row: its column in the block's union, −1 when none
	cols         []int32 // the union's expanded rows, in order of first use
	kb, vb, s, p []float32
	qb, ob       []float32
}

var expandScratches = sync.Pool{New: func() any { return new(expandScratch) }}

func growI(b []int32, n int) []int32 {
	if cap(b) < n {
		return make([]int32, n)
	}
	return b[:n]
}

func (ex *expandRun) tasks(lo, hi int) {
	c, T, width, kv := ex.c, ex.T, ex.width, ex.kv
	H, dq, dv := c.Heads, c.QKDim, c.VDim
	row := H * (dq + dv)
	blocks := (T + expandRows - 1) / expandRows
	sc := expandScratches.Get().(*expandScratch)
	defer expandScratches.Put(sc)
	col := growI(sc.col, ex.n)
	sc.col = col
	for i := range col {
		col[i] = -1
	}
	for task := lo; task < hi; task++ {
		h, b := task/blocks, task%blocks
		t0 := b * expandRows
		nb := min(expandRows, T-t0)
		// the union of the block's positions (as expanded rows)
		cols := sc.cols[:0]
		for t := t0; t < t0+nb; t++ {
			for _, p := range ex.sel[t*width : (t+1)*width] {
				if p < 0 {
					continue
				}
				if r := ex.rowOf[p]; col[r] < 0 {
					col[r] = int32(len(cols))
					cols = append(cols, r)
				}
			}
		}
		sc.cols = cols
		U := len(cols)
		kb, vb := grow(&sc.kb, U*dq), grow(&sc.vb, U*dv)
		for u, r := range cols {
			base := int(r)*row + h*(dq+dv)
			copy(kb[u*dq:(u+1)*dq], kv[base:base+dq])
			copy(vb[u*dv:(u+1)*dv], kv[base+dq:base+dq+dv])
		}
		qb, ob := grow(&sc.qb, nb*dq), grow(&sc.ob, nb*dv)
		for i := 0; i < nb; i++ {
			t := t0 + i
			copy(qb[i*dq:(i+1)*dq], ex.q[t*H*dq+h*dq:t*H*dq+(h+1)*dq])
		}
		s, pm := grow(&sc.s, nb*U), grow(&sc.p, nb*U)
		if U > 0 {
			gemm.MatMulTSerial(s, qb, nb, dq, kb, U)
		}
		// softmax over each query's own positions; the others weigh 0
		clear(pm)
		for i := 0; i < nb; i++ {
			t := t0 + i
			si, pi := s[i*U:(i+1)*U], pm[i*U:(i+1)*U]
			srow := ex.sel[t*width : (t+1)*width]
			mx := float32(math.Inf(-1))
			has := false
			for _, p := range srow {
				if p >= 0 {
					has = true
					if l := si[col[ex.rowOf[p]]] * c.Scale; l > mx {
						mx = l
					}
				}
			}
			if !has {
				continue
			}
			var sum float32
			for _, p := range srow {
				if p >= 0 {
					u := col[ex.rowOf[p]]
					e := float32(math.Exp(float64(si[u]*c.Scale - mx)))
					pi[u] += e // a position listed twice weighs twice
					sum += e
				}
			}
			for u := range pi {
				pi[u] /= sum
			}
		}
		if U > 0 {
			gemm.MatMul(ob, pm, nb, U, vb, dv) // skips the zero weights
		} else {
			clear(ob)
		}
		for i := 0; i < nb; i++ {
			t := t0 + i
			copy(ex.o[t*H*dv+h*dv:t*H*dv+(h+1)*dv], ob[i*dv:(i+1)*dv])
		}
		for _, r := range cols {
			col[r] = -1
		}
	}
}

// AttendAbsorbed is Attend by the absorbed path, in three steps:
//
//  1. qa[t][h] = W_UK[h]ᵀ·q[t][h] ([Rank]; per head, a GEMM over the T
//     queries, parallel over heads);
//  2. per query, the logits of all heads against the gathered latents of
//     its positions (one GEMM [Heads×Rank]·[n×Rank]ᵀ), softmax per head,
//     and the latent outputs ol[t][h] = Σ_p a_p·c_p (parallel over queries,
//     or within the query over positions and heads when there are fewer
//     queries than workers, as at decode);
//  3. o[t][h] = W_UV[h]·ol[t][h] (per head, a GEMM over the T queries).
func (c *Config) AttendAbsorbed(o, q, ckv []float32, sel []int32, T, width int) {
	ws := wsPool.Get().(*Workspace)
	defer wsPool.Put(ws)
	lat := paged.Flat(c.Rank, ckv)
	c.attendAbsorbed(ws, o, q, &lat, sel, T, width)
}

func (c *Config) attendAbsorbed(ws *Workspace, o, q []float32, ckv *paged.Rows, sel []int32, T, width int) {
	H, R := c.Heads, c.Rank
	ab, _ := absorbedPool.Get().(*absorbed)
	if ab == nil {
		ab = new(absorbed)
		ab.absorbFn, ab.queriesFn, ab.outFn = ab.absorb, ab.queries, ab.out
	}
	defer func() {
		ab.c, ab.o, ab.q, ab.ckv, ab.sel, ab.qa, ab.ol = nil, nil, nil, nil, nil, nil, nil
		absorbedPool.Put(ab)
	}()
	ab.c, ab.o, ab.q, ab.ckv, ab.sel, ab.T, ab.width = c, o, q, ckv, sel, T, width
	// qa ([T][H][R], the absorbed queries) and ol ([H][T][R], the latent
	// outputs) share the workspace's buffer
	buf := ws.floats(2 * T * H * R)
	ab.qa, ab.ol = buf[:T*H*R], buf[T*H*R:]
	// 1. absorb W_UK ([dq][R] per head) into the queries
	parallel.For(H, 1, ab.absorbFn)
	// 2. attend the latents
	if T >= parallel.Workers {
		parallel.For(T, 1, ab.queriesFn)
	} else {
		b := newLatentBuf(H, R, width)
		for t := 0; t < T; t++ {
			c.attendLatent(b, ab.ol, ab.qa, ckv, sel[t*width:(t+1)*width], t, T, true)
		}
		putLatentBuf(b)
	}
	// 3. W_UV ([dv][R] per head, already in MatMulT form) on the latent outputs
	parallel.For(H, 1, ab.outFn)
}

// absorbed is one AttendAbsorbed call's operands (qa and ol in the call's
// Workspace), pooled with its parallel bodies (method values made once): a
// call allocates nothing in the steady state.
type absorbed struct {
	c                          *Config
	o, q                       []float32
	ckv                        *paged.Rows
	sel                        []int32
	T, width                   int
	qa, ol                     []float32
	absorbFn, queriesFn, outFn func(lo, hi int)
}

var absorbedPool sync.Pool

// scratch holds the workers' per-call temporaries of the absorbed path
// (steps 1 and 3).
var scratch = sync.Pool{New: func() any { return new([]float32) }}

func grow(b *[]float32, n int) []float32 {
	if cap(*b) < n {
		*b = make([]float32, n)
	}
	*b = (*b)[:n]
	return *b
}

// tempLen is the size of the absorbed path's per-worker temporaries: one
// size for steps 1 and 3, so that a pooled buffer fits either.
func (c *Config) tempLen(T int) int { return T * max(c.QKDim+c.Rank, c.VDim) }

// absorb is step 1 for heads [lo, hi).
func (ab *absorbed) absorb(lo, hi int) {
	c, T, q, qa := ab.c, ab.T, ab.q, ab.qa
	H, dq, dv, R := c.Heads, c.QKDim, c.VDim, c.Rank
	stride := (dq + dv) * R
	sb := scratch.Get().(*[]float32)
	defer scratch.Put(sb)
	buf := grow(sb, c.tempLen(T))
	qh, tmp := buf[:T*dq], buf[T*dq:T*dq+T*R]
	for h := lo; h < hi; h++ {
		for t := 0; t < T; t++ {
			copy(qh[t*dq:(t+1)*dq], q[t*H*dq+h*dq:t*H*dq+(h+1)*dq])
		}
		gemm.MatMul(tmp, qh, T, dq, c.KVBW[h*stride:h*stride+dq*R], R)
		for t := 0; t < T; t++ {
			copy(qa[(t*H+h)*R:(t*H+h+1)*R], tmp[t*R:(t+1)*R])
		}
	}
}

// queries is step 2 for queries [lo, hi), one query per worker.
func (ab *absorbed) queries(lo, hi int) {
	c := ab.c
	b := newLatentBuf(c.Heads, c.Rank, ab.width)
	for t := lo; t < hi; t++ {
		c.attendLatent(b, ab.ol, ab.qa, ab.ckv, ab.sel[t*ab.width:(t+1)*ab.width], t, ab.T, false)
	}
	putLatentBuf(b)
}

// out is step 3 for heads [lo, hi).
func (ab *absorbed) out(lo, hi int) {
	c, T, o, ol := ab.c, ab.T, ab.o, ab.ol
	H, dq, dv, R := c.Heads, c.QKDim, c.VDim, c.Rank
	stride := (dq + dv) * R
	sb := scratch.Get().(*[]float32)
	defer scratch.Put(sb)
	tmp := grow(sb, c.tempLen(T))[:T*dv]
	for h := lo; h < hi; h++ {
		gemm.MatMulTSerial(tmp, ol[h*T*R:(h+1)*T*R], T, R, c.KVBW[h*stride+dq*R:(h+1)*stride], dv)
		for t := 0; t < T; t++ {
			copy(o[t*H*dv+h*dv:t*H*dv+(h+1)*dv], tmp[t*dv:(t+1)*dv])
		}
	}
}

// latentBuf is one worker's scratch for attendLatent.
type latentBuf struct {
	lat    []float32 // [width][R] gathered latents
	logits []float32 // [H][width]
}

// latentBufs recycles latentBufs between calls (a decode step would
// otherwise allocate and clear width·Rank floats per layer).
var latentBufs sync.Pool

// newLatentBuf takes a latentBuf from latentBufs, grown to the geometry;
// putLatentBuf returns it.
func newLatentBuf(H, R, width int) *latentBuf {
	b, _ := latentBufs.Get().(*latentBuf)
	if b == nil {
		b = &latentBuf{}
	}
	if cap(b.lat) < width*R {
		b.lat = make([]float32, width*R)
	}
	if cap(b.logits) < H*width {
		b.logits = make([]float32, H*width)
	}
	b.lat, b.logits = b.lat[:width*R], b.logits[:H*width]
	return b
}

func putLatentBuf(b *latentBuf) { latentBufs.Put(b) }

// attendLatent runs step 2 of AttendAbsorbed for query t, whose selection
// row is srow, writing ol[h][t] for every head; inner spreads the work over
// the workers.
func (c *Config) attendLatent(b *latentBuf, ol, qa []float32, ckv *paged.Rows, srow []int32, t, T int, inner bool) {
	H, R := c.Heads, c.Rank
	// the query's latents, in row order: a contiguous ascending run (the
	// dense causal case) is used in place, anything else is gathered
	n, p0, run := 0, int32(0), true
	for _, p := range srow {
		if p >= 0 {
			if n == 0 {
				p0 = p
			} else if p != p0+int32(n) {
				run = false
			}
			n++
		}
	}
	if n == 0 {
		for h := 0; h < H; h++ {
			clear(ol[(h*T+t)*R : (h*T+t+1)*R])
		}
		return
	}
	var lat []float32
	if run && !ckv.FP8 && ckv.SpanRows(int(p0), int(p0)+n) == n {
		lat = ckv.Span(int(p0), int(p0)+n)
	} else {
		lat = b.lat[:n*R]
		i := 0
		for _, p := range srow {
			if p >= 0 {
				ckv.ReadRow(lat[i*R:(i+1)*R], int(p))
				i++
			}
		}
	}
	lg := b.logits[:H*n]
	qt := qa[t*H*R : (t+1)*H*R]
	if inner {
		gemm.MatMulTWith(c.Params, lg, qt, H, R, lat, n)
	} else {
		gemm.MatMulTSerial(lg, qt, H, R, lat, n)
	}
	ha := headArgs{c, lg, lat, ol, n, t, T}
	if inner {
		parallel.ForArgs(&headPool, H, 1, ha)
	} else {
		ha.Run(0, H)
	}
}

// headArgs is attendLatent's softmax and value sum for one query.
type headArgs struct {
	c           *Config
	lg, lat, ol []float32
	n, t, T     int
}

var headPool parallel.Pool[headArgs]

// Run does heads [lo, hi).
func (a *headArgs) Run(lo, hi int) {
	c, lg, n, R := a.c, a.lg, a.n, a.c.Rank
	for h := lo; h < hi; h++ {
		l := lg[h*n : (h+1)*n]
		mx := float32(math.Inf(-1))
		for i := range l {
			l[i] *= c.Scale
			if l[i] > mx {
				mx = l[i]
			}
		}
		var s float32
		for i, v := range l {
			e := float32(math.Exp(float64(v - mx)))
			l[i] = e
			s += e
		}
		for i := range l {
			l[i] /= s
		}
		gemm.MatMul(a.ol[(h*a.T+a.t)*R:(h*a.T+a.t+1)*R], l, 1, n, a.lat, R)
	}
}
