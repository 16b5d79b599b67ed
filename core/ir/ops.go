package ir

import (
	"fmt"
	"sort"
	"sync"
)

// OutType is what shape inference says about one output.
type OutType struct {
	Name  string
	DType DType
	Shape []int
}

// OpDef declares an op once: its name, arity, shape inference and traits.
// Passes, the plan and the backends ask traits (is it constant? a tunable
// GEMM? does it read the batch lengths?), never lists of op names; every
// backend binds each op that is not constant to a kernel, and a test in
// core/backend checks that no backend misses one.
type OpDef struct {
	Name string
	Doc  string
	// MinInputs/MaxInputs bound the number of inputs (MaxInputs < 0: any).
	MinInputs, MaxInputs int
	// Infer checks the inputs and attributes and returns the outputs' types.
	Infer func(n *Node) ([]OutType, error)

	// Fold makes the op constant: its outputs are derived weights, computed
	// from its inputs' values (weights, or other folded outputs) by Fold,
	// once, when a plan is compiled. Backends bind no kernel to it.
	Fold func(n *Node, in [][]float32) ([][]float32, error)
	// SideEffects ops update sequence state (caches) and are never removed
	// as dead code.
	SideEffects bool
	// GEMM marks a tunable matrix multiplication: it returns the node's GEMM
	// shape (output width N, reduction depth K, and the weight operand). A
	// tuning pass sets the node's kernel parameters per token-count bucket
	// (AttrTuneBuckets, AttrTuneColGrain, AttrTuneRowBlock), and the CPU
	// backend's binding of every GEMM op reads them.
	GEMM func(n *Node) GEMMShape
	// ReadsLengths says input 0 is the per-sequence lengths source: the
	// host batch metadata (InputBatch) or the executor's copy (OpSeqLengths).
	ReadsLengths bool

	// Attrs declares the op's own attributes (name, type, default, doc);
	// its traits add theirs (every op: AttrStream; GEMM: the AttrTune*
	// ones; ReadsLengths: AttrLengths, AttrLengthsFrom). The verifier
	// rejects a node with an attribute its op does not declare, of another
	// type, or without a required one; Attr.Get returns the declared default.
	Attrs []AttrDef
}

// Attr finds the declaration of the attribute name: the op's own, or one
// its traits give it.
func (d OpDef) Attr(name string) (AttrDef, bool) {
	for _, a := range d.Attrs {
		if a.Name == name {
			return a, true
		}
	}
	for _, as := range traitAttrs(d) {
		for _, a := range as {
			if a.Name == name {
				return a, true
			}
		}
	}
	return AttrDef{}, false
}

// AttrDefs lists every attribute the op takes: its own, then its traits'.
func (d OpDef) AttrDefs() []AttrDef {
	out := append([]AttrDef(nil), d.Attrs...)
	for _, as := range traitAttrs(d) {
		out = append(out, as...)
	}
	return out
}

// Const reports whether the op is folded at compile time (it has Fold).
func (d OpDef) Const() bool { return d.Fold != nil }

// GEMMShape is the matrix multiplication a GEMM-trait node performs:
// y[T,N] = x[T,K] · Weightᵀ.
type GEMMShape struct {
	N, K   int
	Weight *Value
}

// TuneBucket is the index of the bucket a batch of rows rows uses: the
// smallest bucket ≥ rows, else the largest (buckets ascending, not empty).
func TuneBucket(buckets []int, rows int) int {
	for j, b := range buckets {
		if rows <= b {
			return j
		}
	}
	return len(buckets) - 1
}

// Well-known graph input and output names, shared by the graph builder, the
// backends (which provide the inputs) and plugins.
const (
	InputTokens = "tokens" // i32[T]: the batch's token ids
	InputBatch  = "batch"  // host: the batch's sequences (slots, positions, lengths)
	// InputHidden is f32[T,D]: one hidden row per token, given by the caller
	// (the MTP graph's h: the trunk's final hidden, or the MTP's own).
	InputHidden = "hidden"
	// InputContext is f32[C,W] (DimC): a DFlash draft batch's new context
	// rows, per sequence the target's hidden rows captured after each of
	// the drafter's target layers (W = layers·D, concatenated in the
	// drafter's target_layer_ids order) at the positions it committed.
	InputContext = "context"
	OutputLogits = "logits" // f32[rows, vocab]
	// OutputFinalHidden is f32[T,D]: for every token the normalized hidden
	// state that feeds lm_head (the trunk's after the stream mean and final
	// norm; the MTP's after shared_head.norm), what the MTP layer reads.
	OutputFinalHidden = "final_hidden"
	// OutputTargetHidden is f32[T,layers·D]: for every token the trunk's
	// hidden rows after each of a DFlash drafter's target layers (the
	// residual streams collapsed by their mean, as before the final norm),
	// concatenated in target_layer_ids order: the drafter's context rows.
	OutputTargetHidden = "target_hidden"
)

// HiddenOutput names the graph output holding the residual streams after
// decoder layer l (hidden-state capture).
func HiddenOutput(l int) string { return fmt.Sprintf("hidden.%d", l) }

var (
	regMu sync.RWMutex
	ops   = map[string]OpDef{}
)

// Register adds an op definition; registering a name twice is an error.
func Register(d OpDef) error {
	regMu.Lock()
	defer regMu.Unlock()
	if d.Name == "" || d.Infer == nil {
		return fmt.Errorf("ir: op definition needs a name and Infer")
	}
	if d.Const() && (d.SideEffects || d.GEMM != nil) {
		return fmt.Errorf("ir: op %q: a constant op has no side effects and is not a GEMM", d.Name)
	}
	seen := map[string]bool{}
	for _, a := range d.AttrDefs() {
		if err := a.check(); err != nil {
			return fmt.Errorf("ir: op %q: %w", d.Name, err)
		}
		if seen[a.Name] {
			return fmt.Errorf("ir: op %q declares attribute %q twice (or a trait declares it)", d.Name, a.Name)
		}
		seen[a.Name] = true
	}
	if _, dup := ops[d.Name]; dup {
		return fmt.Errorf("ir: op %q registered twice", d.Name)
	}
	ops[d.Name] = d
	return nil
}

// MustRegister is Register that panics (for package init).
func MustRegister(d OpDef) {
	if err := Register(d); err != nil {
		panic(err)
	}
}

// Lookup finds an op definition.
func Lookup(name string) (OpDef, bool) {
	regMu.RLock()
	defer regMu.RUnlock()
	d, ok := ops[name]
	return d, ok
}

// Def returns the definition of a node's op (the zero OpDef, which has no
// traits, for an unknown op: the verifier reports those).
func (n *Node) Def() OpDef {
	d, _ := Lookup(n.Op)
	return d
}

// OpNames lists the registered ops, sorted.
func OpNames() []string {
	regMu.RLock()
	defer regMu.RUnlock()
	n := make([]string, 0, len(ops))
	for k := range ops {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// KernelOps lists the registered ops a backend must bind (every op that is
// not constant), sorted.
func KernelOps() []string {
	var out []string
	for _, name := range OpNames() {
		if d, _ := Lookup(name); !d.Const() {
			out = append(out, name)
		}
	}
	return out
}
