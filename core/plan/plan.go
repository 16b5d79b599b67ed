// Package plan is the backend-neutral half of compilation: it verifies a
// graph, loads its weights and folds derived weights (concat_rows, stack)
// once, orders the executable steps and computes each value's last use
// and lifetime (liveness: LastUse, and Liveness, the births and deaths the
// backends plan their arenas from), and records what every backend needs
// to know about the graph's inputs and outputs. A backend
// (core/backend/cpu, core/backend/cuda) then binds every step to one of its
// kernels.
package plan

import (
	"fmt"
	"math"
	"sync"

	"github.com/glmflash/glmflash/core/ir"
)

// Weights provides checkpoint tensors as float32 (model.Checkpoint does).
type Weights interface {
	Float32(name string, shape ...int) ([]float32, error)
}

// Options tune the neutral compile step.
type Options struct {
	// MaxPositions bounds sequence length (0: no bound).
	MaxPositions int
	// Vocab bounds token ids; taken from the logits width when 0.
	Vocab int
	// Lazy leaves constants unloaded until Const asks for one (a device
	// backend that uploads checkpoint bytes as stored, through Raw, never
	// needs the float32 copy of its large weights). Consts is then empty:
	// use IsConst and Const.
	Lazy bool
}

// Plan is a verified graph with its constants loaded, ready for a backend.
type Plan struct {
	Graph *ir.Graph
	// Consts holds every weight and every folded derived weight.
	Consts map[*ir.Value][]float32
	// Steps are the executable (non-const) nodes in graph order.
	Steps []*ir.Node
	// LastUse is the index of the last step that reads a value (MaxInt for
	// graph outputs); values absent here are never read.
	LastUse map[*ir.Value]int
	// Life is the same liveness as the values' births and deaths per step
	// (the event list the backends plan their arenas from).
	Life *Liveness
	// Logits is the logits output; Hidden maps captured-stream outputs to
	// their names.
	Logits *ir.Value
	Hidden map[*ir.Value]string
	// Vocab and MaxPositions bound token ids and sequence lengths.
	Vocab, MaxPositions int
	// HostLengths: no step reads executor-produced lengths (seq_lengths),
	// so a batch may be prepared while another executes.
	HostLengths bool

	cache  *WeightCache
	src    Weights
	lazy   bool
	consts map[*ir.Value]bool // every constant value (weights and folded)
	mu     sync.Mutex         // guards Consts and bf16s in lazy mode
	bf16s  map[*ir.Value][]uint16
}

// Compile verifies g, loads its weights from w (shared through w when it is
// a *WeightCache), folds const subgraphs and computes liveness.
func Compile(g *ir.Graph, w Weights, opts Options) (*Plan, error) {
	if err := g.Verify(); err != nil {
		return nil, fmt.Errorf("plan: graph does not verify: %w", err)
	}
	p := &Plan{Graph: g, Consts: map[*ir.Value][]float32{}, LastUse: map[*ir.Value]int{}, Hidden: map[*ir.Value]string{},
		bf16s: map[*ir.Value][]uint16{}, src: w, lazy: opts.Lazy, consts: map[*ir.Value]bool{}}
	p.cache, _ = w.(*WeightCache)
	for _, wv := range g.Weights {
		p.consts[wv] = true
		if opts.Lazy {
			continue
		}
		data, err := loadWeight(w, wv)
		if err != nil {
			return nil, err
		}
		p.Consts[wv] = data
	}
	p.HostLengths = true
	for _, n := range g.Nodes {
		def, ok := ir.Lookup(n.Op)
		if !ok {
			return nil, fmt.Errorf("plan: unknown op %q", n.Op)
		}
		if def.Const() {
			for _, in := range n.Inputs {
				if !p.consts[in] {
					return nil, fmt.Errorf("plan: %s input %s is not constant", n.Op, in.Name)
				}
			}
			for _, o := range n.Outputs {
				p.consts[o] = true
			}
			if opts.Lazy {
				continue
			}
			if err := p.fold(n); err != nil {
				return nil, err
			}
			continue
		}
		if n.Op == ir.OpSeqLengths {
			p.HostLengths = false
		}
		for _, in := range n.Inputs {
			p.LastUse[in] = len(p.Steps)
		}
		p.Steps = append(p.Steps, n)
	}
	for name, v := range g.Outputs {
		p.LastUse[v] = math.MaxInt
		if name != ir.OutputLogits {
			p.Hidden[v] = name
		}
	}
	p.Life = NewLiveness(p.Steps, p.LastUse)
	logits, ok := g.Outputs[ir.OutputLogits]
	if !ok {
		return nil, fmt.Errorf("plan: graph has no %q output", ir.OutputLogits)
	}
	p.Logits = logits
	p.Vocab = logits.Shape[1]
	if opts.Vocab > 0 {
		p.Vocab = opts.Vocab
	}
	p.MaxPositions = opts.MaxPositions
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

// fold computes a constant node's outputs with its op's Fold trait (in
// lazy mode loading its inputs first; p.mu held).
func (p *Plan) fold(n *ir.Node) error {
	in := make([][]float32, len(n.Inputs))
	for i, v := range n.Inputs {
		d, ok := p.Consts[v]
		if !ok && p.lazy && p.consts[v] {
			var err error
			if d, err = p.loadLocked(v); err != nil {
				return err
			}
			ok = true
		}
		if !ok {
			return fmt.Errorf("plan: %s input %s is not constant", n.Op, v.Name)
		}
		in[i] = d
	}
	outs, err := n.Def().Fold(n, in)
	if err != nil {
		return fmt.Errorf("plan: folding %s (layer %d): %w", n.Op, n.Layer, err)
	}
	if len(outs) != len(n.Outputs) {
		return fmt.Errorf("plan: folding %s gave %d outputs, want %d", n.Op, len(outs), len(n.Outputs))
	}
	for i, o := range n.Outputs {
		p.Consts[o] = outs[i]
	}
	return nil
}

// Source identifies where the plan's constants came from: plans of one
// WeightCache share it (device backends share uploaded weights by it).
func (p *Plan) Source() any {
	if p.cache != nil {
		return p.cache
	}
	return p
}

// IsConst says whether v is a constant (a weight or a folded derived
// weight), loaded or not.
func (p *Plan) IsConst(v *ir.Value) bool { return p.consts[v] }

// Const returns a constant's values (nil when v is not constant), loading
// (and folding) it on first use in lazy mode; ConstErr says why it could not.
func (p *Plan) Const(v *ir.Value) []float32 {
	d, _ := p.ConstErr(v)
	return d
}

// ConstErr is Const with the loading error.
func (p *Plan) ConstErr(v *ir.Value) ([]float32, error) {
	if !p.lazy {
		return p.Consts[v], nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.loadLocked(v)
}

// loadLocked loads or folds a constant of a lazy plan (p.mu held).
func (p *Plan) loadLocked(v *ir.Value) ([]float32, error) {
	if d, ok := p.Consts[v]; ok {
		return d, nil
	}
	if !p.consts[v] {
		return nil, nil
	}
	if v.Producer == nil {
		d, err := loadWeight(p.src, v)
		if err != nil {
			return nil, err
		}
		p.Consts[v] = d
		return d, nil
	}
	if err := p.fold(v.Producer); err != nil {
		return nil, err
	}
	return p.Consts[v], nil
}

// BF16 returns a bfloat16 copy of a constant when every value is exactly
// representable in bfloat16 (true of BF16 checkpoints and of FP8 weights
// with power-of-two block scales), else nil. Copies of checkpoint weights
// are shared by every plan of one WeightCache.
func (p *Plan) BF16(v *ir.Value) []uint16 {
	w := p.Const(v)
	if p.lazy {
		p.mu.Lock()
		defer p.mu.Unlock()
	}
	if b, ok := p.bf16s[v]; ok {
		return b
	}
	if w == nil {
		return nil
	}
	var b []uint16
	if v.Producer == nil && p.cache != nil && v.Ref != "" {
		b = p.cache.bf16(v.Ref, v.Stack, w)
	} else {
		b = ToBF16Exact(w)
	}
	p.bf16s[v] = b
	return b
}

// ToBF16Exact converts w if every value is bf16-representable, else nil.
func ToBF16Exact(w []float32) []uint16 {
	for _, x := range w {
		if math.Float32bits(x)&0xFFFF != 0 {
			return nil
		}
	}
	b := make([]uint16, len(w))
	for i, x := range w {
		b[i] = uint16(math.Float32bits(x) >> 16)
	}
	return b
}
