// Package ir is glmflash's graph intermediate representation: typed values
// (activations with a symbolic token dimension, weights referenced by
// checkpoint name, host-side batch metadata, integer tensors), nodes (an op
// name, inputs, outputs, attributes), a verifier and a stable text printer.
//
// The IR knows nothing about kernels or buffers: each backend (core/backend/*)
// binds ops to kernels, passes (core/pass) rewrite graphs.
package ir

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Symbolic dimensions. A shape entry ≥ 0 is static.
const (
	DimT = -1 // tokens in the batch
	DimS = -2 // sequences in the batch
	// DimR is the selected rows of a batch: per sequence its last r rows,
	// r set by the batch (1 for a plain sequence, the last token and its
	// drafts for a speculative verify span); see OpSpanRows.
	DimR = -3
	// DimC is the context rows of a DFlash draft batch: per sequence its
	// c_s ≥ 0 new context rows (the target's captured hidden rows of the
	// positions it committed since the sequence's last draft), in batch
	// order; see OpDFlashAttn.
	DimC = -4
)

// DType is a value's element type.
type DType string

// Element types.
const (
	F32  DType = "f32"
	I32  DType = "i32"
	Host DType = "host" // host-side metadata (no tensor payload)
)

// Kind says where a value comes from.
type Kind int

// Value kinds.
const (
	Activation Kind = iota // produced by a node at run time
	Input                  // graph input (token ids, batch metadata)
	Weight                 // constant from the checkpoint, or folded from a const subgraph
)

func (k Kind) String() string {
	switch k {
	case Activation:
		return "act"
	case Input:
		return "input"
	case Weight:
		return "weight"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Value is an SSA value of the graph.
type Value struct {
	ID    int
	Name  string // human hint, e.g. "l3.q_res"
	Kind  Kind
	DType DType
	Shape []int
	// Ref names the checkpoint tensor of a Weight leaf. A stacked weight
	// (one tensor per expert) uses a "{e}" placeholder and Stack > 0.
	Ref   string
	Stack int
	// Producer is the node that defines an Activation or a derived Weight.
	Producer *Node
}

// Node is one operation.
type Node struct {
	ID      int
	Op      string
	Layer   int // decoder layer, −1 for whole-model nodes
	Inputs  []*Value
	Outputs []*Value
	Attrs   Attrs
}

// Graph is a forward pass for one batch shape.
type Graph struct {
	Name    string
	Attrs   Attrs
	Inputs  []*Value
	Weights []*Value // leaf weights (checkpoint tensors)
	Nodes   []*Node  // in execution order
	Outputs map[string]*Value
	nextID  int
	// Typed properties (Mode, MTPLayer), printed and sent to plugins as
	// graph attributes (HeaderAttrs).
	mode     Mode
	mtpLayer int
	isMTP    bool
	isDFlash bool
}

// New returns an empty graph.
func New(name string) *Graph {
	return &Graph{Name: name, Attrs: Attrs{}, Outputs: map[string]*Value{}}
}

func (g *Graph) newValue(name string, k Kind, dt DType, shape []int) *Value {
	v := &Value{ID: g.nextID, Name: name, Kind: k, DType: dt, Shape: append([]int(nil), shape...)}
	g.nextID++
	return v
}

// AddInput declares a graph input.
func (g *Graph) AddInput(name string, dt DType, shape ...int) *Value {
	v := g.newValue(name, Input, dt, shape)
	g.Inputs = append(g.Inputs, v)
	return v
}

// AddWeight declares a checkpoint tensor used by the graph. Asking twice for
// the same reference returns the same value.
func (g *Graph) AddWeight(ref string, shape ...int) *Value {
	for _, w := range g.Weights {
		if w.Ref == ref && w.Stack == 0 {
			return w
		}
	}
	v := g.newValue(ref, Weight, F32, shape)
	v.Ref = ref
	g.Weights = append(g.Weights, v)
	return v
}

// ExpertPlaceholder stands for the expert index in a stacked weight's Ref.
const ExpertPlaceholder = "{e}"

// WeightRef is the checkpoint name of the tensor a weight operand reads:
// its Ref, or, for a tensor-parallel shard (OpSliceDim of a weight), the
// sliced weight's — a shard keeps its tensor's module and dtype for a
// pass's eligibility. "" for other derived values.
func (v *Value) WeightRef() string {
	if n := v.Producer; v.Ref == "" && n != nil && n.Op == OpSliceDim && len(n.Inputs) == 1 {
		return n.Inputs[0].Ref
	}
	return v.Ref
}

// LeafNames lists the checkpoint tensors a weight leaf stands for: its Ref,
// or, for a stacked leaf, Ref with ExpertPlaceholder replaced by 0..Stack−1.
func (v *Value) LeafNames() []string {
	if v.Stack == 0 {
		return []string{v.Ref}
	}
	out := make([]string, v.Stack)
	for e := range out {
		out[e] = strings.Replace(v.Ref, ExpertPlaceholder, strconv.Itoa(e), 1)
	}
	return out
}

// AddStackedWeight declares n checkpoint tensors named by replacing "{e}" in
// ref with 0..n−1, stacked along a new leading dimension.
func (g *Graph) AddStackedWeight(ref string, n int, shape ...int) *Value {
	v := g.newValue(ref, Weight, F32, append([]int{n}, shape...))
	v.Ref, v.Stack = ref, n
	g.Weights = append(g.Weights, v)
	return v
}

// Op appends a node and returns its outputs, whose types come from the op's
// registered shape inference. Errors (unknown op, bad inputs) are returned
// by Verify; Op itself panics only on programmer errors in the builder.
func (g *Graph) Op(op string, layer int, attrs Attrs, inputs ...*Value) []*Value {
	def, ok := Lookup(op)
	if !ok {
		panic(fmt.Sprintf("ir: unknown op %q", op))
	}
	if attrs == nil {
		attrs = Attrs{}
	}
	if err := nodeAttrs(def, attrs); err != nil {
		panic(fmt.Sprintf("ir: %s (layer %d): %v", op, layer, err))
	}
	n := &Node{ID: g.nextID, Op: op, Layer: layer, Inputs: inputs, Attrs: attrs}
	g.nextID++
	outs, err := def.Infer(n)
	if err != nil {
		panic(fmt.Sprintf("ir: %s (layer %d): %v", op, layer, err))
	}
	kind := Activation
	if def.Const() {
		kind = Weight
	}
	for _, o := range outs {
		v := g.newValue(o.Name, kind, o.DType, o.Shape)
		v.Producer = n
		n.Outputs = append(n.Outputs, v)
	}
	g.Nodes = append(g.Nodes, n)
	return n.Outputs
}

// nodeAttrs checks a new node's attributes before shape inference reads
// them: each declared by the op, of the declared type (a missing required
// one is left to shape inference and the verifier).
func nodeAttrs(d OpDef, a Attrs) error {
	return errors.Join(checkAttrs(a, d.AttrDefs(), "op "+d.Name, false)...)
}

// Op1 is Op for single-output ops.
func (g *Graph) Op1(op string, layer int, attrs Attrs, inputs ...*Value) *Value {
	return g.Op(op, layer, attrs, inputs...)[0]
}

// Name sets a value's name hint and returns it (for chaining in builders).
func (v *Value) Named(name string) *Value { v.Name = name; return v }

// NewNode creates a node with fresh output values (typed by the op's shape
// inference) without inserting it; passes use it with Replace/InsertBefore.
func (g *Graph) NewNode(op string, layer int, attrs Attrs, inputs ...*Value) (*Node, error) {
	def, ok := Lookup(op)
	if !ok {
		return nil, fmt.Errorf("unknown op %q", op)
	}
	if attrs == nil {
		attrs = Attrs{}
	}
	if err := nodeAttrs(def, attrs); err != nil {
		return nil, fmt.Errorf("%s (layer %d): %w", op, layer, err)
	}
	n := &Node{ID: g.nextID, Op: op, Layer: layer, Inputs: inputs, Attrs: attrs}
	g.nextID++
	outs, err := def.Infer(n)
	if err != nil {
		return nil, fmt.Errorf("%s (layer %d): %w", op, layer, err)
	}
	kind := Activation
	if def.Const() {
		kind = Weight
	}
	for _, o := range outs {
		v := g.newValue(o.Name, kind, o.DType, o.Shape)
		v.Producer = n
		n.Outputs = append(n.Outputs, v)
	}
	return n, nil
}

// Index returns the position of n in g.Nodes, or −1.
func (g *Graph) Index(n *Node) int {
	for i, m := range g.Nodes {
		if m == n {
			return i
		}
	}
	return -1
}

// ReplaceUses makes every node input (and graph output) that reads old read
// repl instead.
func (g *Graph) ReplaceUses(old, repl *Value) {
	for _, n := range g.Nodes {
		for i, in := range n.Inputs {
			if in == old {
				n.Inputs[i] = repl
			}
		}
	}
	for k, v := range g.Outputs {
		if v == old {
			g.Outputs[k] = repl
		}
	}
}

// Users returns the nodes that read v.
func (g *Graph) Users(v *Value) []*Node {
	var us []*Node
	for _, n := range g.Nodes {
		for _, in := range n.Inputs {
			if in == v {
				us = append(us, n)
				break
			}
		}
	}
	return us
}

// RemoveDead deletes nodes none of whose outputs is used (transitively),
// keeping nodes of ops registered with side effects.
func (g *Graph) RemoveDead() int {
	removed := 0
	for {
		used := map[*Value]bool{}
		for _, n := range g.Nodes {
			for _, in := range n.Inputs {
				used[in] = true
			}
		}
		for _, v := range g.Outputs {
			used[v] = true
		}
		kept := g.Nodes[:0]
		changed := false
		for _, n := range g.Nodes {
			def, _ := Lookup(n.Op)
			live := def.SideEffects
			for _, o := range n.Outputs {
				if used[o] {
					live = true
				}
			}
			if live {
				kept = append(kept, n)
			} else {
				changed = true
				removed++
			}
		}
		g.Nodes = kept
		if !changed {
			break
		}
	}
	// drop unused weights
	used := map[*Value]bool{}
	for _, n := range g.Nodes {
		for _, in := range n.Inputs {
			used[in] = true
		}
	}
	ws := g.Weights[:0]
	for _, w := range g.Weights {
		if used[w] {
			ws = append(ws, w)
		}
	}
	g.Weights = ws
	return removed
}

// Snapshot is a restorable copy of a graph's structure (node list, weights,
// outputs and node inputs/attributes). Values are shared.
type Snapshot struct {
	nodes   []*Node
	inputs  map[*Node][]*Value
	attrs   map[*Node]Attrs
	weights []*Value
	outputs map[string]*Value
	nextID  int
}

// Snapshot records the graph's current structure.
func (g *Graph) Snapshot() *Snapshot {
	s := &Snapshot{nodes: append([]*Node(nil), g.Nodes...), inputs: map[*Node][]*Value{}, attrs: map[*Node]Attrs{},
		weights: append([]*Value(nil), g.Weights...), outputs: map[string]*Value{}, nextID: g.nextID}
	for _, n := range g.Nodes {
		s.inputs[n] = append([]*Value(nil), n.Inputs...)
		s.attrs[n] = n.Attrs.Clone()
	}
	for k, v := range g.Outputs {
		s.outputs[k] = v
	}
	return s
}

// Restore puts the graph back as it was when s was taken.
func (g *Graph) Restore(s *Snapshot) {
	g.Nodes = append([]*Node(nil), s.nodes...)
	for n, in := range s.inputs {
		n.Inputs = append([]*Value(nil), in...)
		n.Attrs = s.attrs[n].Clone()
	}
	g.Weights = append([]*Value(nil), s.weights...)
	g.Outputs = map[string]*Value{}
	for k, v := range s.outputs {
		g.Outputs[k] = v
	}
}

// InsertAt inserts nodes before position i of g.Nodes.
func (g *Graph) InsertAt(i int, nodes ...*Node) {
	g.Nodes = append(g.Nodes[:i], append(nodes, g.Nodes[i:]...)...)
}

// Remove deletes the given nodes from g.Nodes (their outputs must be unused).
func (g *Graph) Remove(nodes ...*Node) {
	drop := map[*Node]bool{}
	for _, n := range nodes {
		drop[n] = true
	}
	kept := g.Nodes[:0]
	for _, n := range g.Nodes {
		if !drop[n] {
			kept = append(kept, n)
		}
	}
	g.Nodes = kept
}

// Input returns the graph input with the given name, or nil.
func (g *Graph) Input(name string) *Value {
	for _, v := range g.Inputs {
		if v.Name == name {
			return v
		}
	}
	return nil
}
