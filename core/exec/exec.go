// Package exec compiles an IR graph against a checkpoint into a Program
// (weights loaded and derived weights folded once, every node bound to a
// kernel, buffers reused by liveness) and runs it on ragged batches of
// sequences whose state lives in a cache.Store.
package exec

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/glmflash/glmflash/core/build"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/kernels/gemm"
)

// Weights provides checkpoint tensors as float32 (model.Checkpoint does).
type Weights interface {
	Float32(name string, shape ...int) ([]float32, error)
}

// Seq is one sequence of a batch: its cache slot and its new tokens.
type Seq struct {
	Slot   int
	Tokens []int32
}

// Batch is a ragged batch: sequences of any lengths, run in one pass.
type Batch struct {
	Seqs []Seq
}

// Result holds a run's outputs.
type Result struct {
	// Logits is [Rows][Vocab]: one row per token (AllLogits graphs) or one
	// per sequence (LastLogits graphs), in batch order.
	Logits []float32
	Rows   int
	Vocab  int
	// Hidden holds captured residual streams ([T][H][D]) by output name,
	// when the graph was built with CaptureHidden.
	Hidden map[string][]float32
}

// Row returns logits row i.
func (r *Result) Row(i int) []float32 { return r.Logits[i*r.Vocab : (i+1)*r.Vocab] }

// Options tune compilation.
type Options struct {
	// GEMM maps a linear node's name (output value name) to tuned
	// parameters; absent nodes use defaults.
	GEMM map[string]gemm.Params
	// MaxPositions bounds sequence length (0: no bound).
	MaxPositions int
	// Vocab bounds token ids; taken from the embedding weight when 0.
	Vocab int
	// FP32Weights keeps every GEMM weight in float32 even when it is exactly
	// representable in bfloat16 (by default such weights are stored as
	// bf16, halving the bytes decode reads, with identical results).
	FP32Weights bool
	// PoisonDeviceLengths makes seq_lengths nodes produce wrong values, so a
	// test can prove that a graph never reads the executor's copy.
	PoisonDeviceLengths bool
}

// Program is a compiled graph. Run calls are serialized.
type Program struct {
	g        *ir.Graph
	opts     Options
	consts   map[*ir.Value][]float32
	steps    []step
	lastUse  map[*ir.Value]int
	mu       sync.Mutex
	pool     map[int][][]float32 // free float buffers by capacity
	vocab    int
	maxPos   int
	hiddenOf map[*ir.Value]string
	// deviceReads counts reads of executor-produced lengths (seq_lengths).
	deviceReads atomic.Int64
	bf16s       map[*ir.Value][]uint16
	cache       *WeightCache
	// hostLengths: no node reads executor-produced lengths (seq_lengths).
	hostLengths bool
	// fusedMHC counts mhc_post_pre executions that took the fused path.
	fusedMHC atomic.Int64
}

// FusedMHCRuns is how many mhc_post_pre executions ran fused (not declined
// by their token cap).
func (p *Program) FusedMHCRuns() int64 { return p.fusedMHC.Load() }

// DeviceLengthReads is how many times a node read the executor-produced
// sequence lengths instead of the host metadata.
func (p *Program) DeviceLengthReads() int64 { return p.deviceReads.Load() }

type step struct {
	node *ir.Node
	run  func(rc *runCtx) error
}

// Graph returns the graph the program was compiled from.
func (p *Program) Graph() *ir.Graph { return p.g }

// Compile loads the graph's weights, folds const subgraphs and binds
// kernels. Weight shape mismatches and unknown ops are errors.
func Compile(g *ir.Graph, w Weights, opts Options) (*Program, error) {
	if err := g.Verify(); err != nil {
		return nil, fmt.Errorf("exec: graph does not verify: %w", err)
	}
	p := &Program{g: g, opts: opts, consts: map[*ir.Value][]float32{}, lastUse: map[*ir.Value]int{}, pool: map[int][][]float32{}, hiddenOf: map[*ir.Value]string{}, bf16s: map[*ir.Value][]uint16{}}
	p.cache, _ = w.(*WeightCache)
	for _, wv := range g.Weights {
		data, err := loadWeight(w, wv)
		if err != nil {
			return nil, err
		}
		p.consts[wv] = data
	}
	for _, n := range g.Nodes {
		def, _ := ir.Lookup(n.Op)
		if def.Const {
			if err := p.fold(n); err != nil {
				return nil, err
			}
			continue
		}
		fn, err := p.bind(n)
		if err != nil {
			return nil, fmt.Errorf("exec: %s (layer %d): %w", n.Op, n.Layer, err)
		}
		for _, in := range n.Inputs {
			p.lastUse[in] = len(p.steps)
		}
		p.steps = append(p.steps, step{node: n, run: fn})
	}
	for name, v := range g.Outputs {
		p.lastUse[v] = math.MaxInt
		if name != build.OutputLogit {
			p.hiddenOf[v] = name
		}
	}
	p.hostLengths = true
	for _, n := range g.Nodes {
		if n.Op == "seq_lengths" {
			p.hostLengths = false
		}
	}
	logits, ok := g.Outputs[build.OutputLogit]
	if !ok {
		return nil, fmt.Errorf("exec: graph has no %q output", build.OutputLogit)
	}
	p.vocab = logits.Shape[1]
	if opts.Vocab > 0 {
		p.vocab = opts.Vocab
	}
	p.maxPos = opts.MaxPositions
	return p, nil
}

func loadWeight(w Weights, v *ir.Value) ([]float32, error) {
	if v.Stack == 0 {
		return w.Float32(v.Ref, v.Shape...)
	}
	if c, ok := w.(*WeightCache); ok {
		return c.stacked(v)
	}
	return stackWeights(w, v)
}

// stackWeights loads the Stack tensors of a stacked weight into one slice.
func stackWeights(w Weights, v *ir.Value) ([]float32, error) {
	per := 1
	for _, d := range v.Shape[1:] {
		per *= d
	}
	out := make([]float32, 0, per*v.Stack)
	for _, name := range v.LeafNames() {
		t, err := w.Float32(name, v.Shape[1:]...)
		if err != nil {
			return nil, err
		}
		out = append(out, t...)
	}
	return out, nil
}

func (p *Program) fold(n *ir.Node) error {
	switch n.Op {
	case "concat_rows":
		var out []float32
		for _, in := range n.Inputs {
			d, ok := p.consts[in]
			if !ok {
				return fmt.Errorf("exec: concat_rows input %s is not constant", in.Name)
			}
			out = append(out, d...)
		}
		p.consts[n.Outputs[0]] = out
		return nil
	case "stack":
		var out []float32
		for _, in := range n.Inputs {
			d, ok := p.consts[in]
			if !ok {
				return fmt.Errorf("exec: stack input %s is not constant", in.Name)
			}
			out = append(out, d...)
		}
		p.consts[n.Outputs[0]] = out
		return nil
	}
	return fmt.Errorf("exec: no folding rule for const op %q", n.Op)
}

// alloc returns a zero-length-agnostic buffer of exactly n floats.
func (p *Program) alloc(n int) []float32 {
	best, bi := -1, -1
	for c, list := range p.pool {
		if c >= n && len(list) > 0 && (best < 0 || c < best) {
			best = c
		}
	}
	if best >= 0 {
		list := p.pool[best]
		bi = len(list) - 1
		b := list[bi]
		p.pool[best] = list[:bi]
		return b[:n]
	}
	return make([]float32, n)
}

func (p *Program) release(b []float32) {
	if cap(b) == 0 {
		return
	}
	p.pool[cap(b)] = append(p.pool[cap(b)], b[:cap(b)])
}

// WeightCache memoizes a Weights source so that several programs (one per
// batch mode) share one copy of every tensor. It is safe for concurrent use.
type WeightCache struct {
	src Weights
	mu  sync.Mutex
	m   map[string][]float32
	b   map[string][]uint16
}

// NewWeightCache wraps src.
func NewWeightCache(src Weights) *WeightCache {
	return &WeightCache{src: src, m: map[string][]float32{}, b: map[string][]uint16{}}
}

// stacked returns the shared stacked copy of a stacked weight (one per
// reference, whichever program asks). The per-expert tensors it was built
// from are not kept.
func (c *WeightCache) stacked(v *ir.Value) ([]float32, error) {
	key := fmt.Sprintf("%s#%d", v.Ref, v.Stack)
	c.mu.Lock()
	if t, ok := c.m[key]; ok {
		c.mu.Unlock()
		return t, nil
	}
	c.mu.Unlock()
	t, err := stackWeights(c.src, v)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev, ok := c.m[key]; ok {
		return prev, nil
	}
	c.m[key] = t
	return t, nil
}

// bf16 returns the shared bfloat16 copy of a leaf weight (nil when it is
// not exactly representable).
func (c *WeightCache) bf16(ref string, stack int, w []float32) []uint16 {
	key := fmt.Sprintf("%s#%d", ref, stack)
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.b[key]; ok {
		return b
	}
	b := toBF16Exact(w)
	c.b[key] = b
	return b
}

// Float32 returns the cached tensor, loading it on first use. The shape is
// checked on every call.
func (c *WeightCache) Float32(name string, shape ...int) ([]float32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t, ok := c.m[name]; ok {
		n := 1
		for _, d := range shape {
			n *= d
		}
		if len(shape) > 0 && n != len(t) {
			return nil, fmt.Errorf("tensor %s: %d elements cached, want shape %v", name, len(t), shape)
		}
		return t, nil
	}
	t, err := c.src.Float32(name, shape...)
	if err != nil {
		return nil, err
	}
	c.m[name] = t
	return t, nil
}

// Bytes is the memory held by cached tensors.
func (c *WeightCache) Bytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, t := range c.m {
		n += int64(4 * len(t))
	}
	for _, t := range c.b {
		n += int64(2 * len(t))
	}
	return n
}
