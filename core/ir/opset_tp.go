package ir

import "fmt"

// Tensor-parallel ops (docs/tensor-parallel.md): the collectives a sharded
// graph meets its other ranks at, and the derived weight that cuts a rank's
// shard out of a checkpoint tensor. A graph built for one rank of N
// (graph.Options.TP) holds them; a graph built for one device holds none.
const (
	// OpAllReduce sums its input over the ranks (a partial attention
	// output, MLP or MoE output, or an embedding shard's rows).
	OpAllReduce = "all_reduce"
	// OpAllGatherCols concatenates the ranks' column blocks of a [R, C]
	// input into [R, ranks·C] (the vocabulary-parallel logits).
	OpAllGatherCols = "all_gather_cols"
	// OpSliceDim is a derived weight: indices [start, end) of one axis of
	// a weight (a rank's shard of a checkpoint tensor), folded at load.
	OpSliceDim = "slice_dim"
)

var (
	collectiveAttrs = []AttrDef{AttrRanks.Required("the ranks of the tensor-parallel group (≥ 2)")}
	sliceDimAttrs   = []AttrDef{
		AttrAxis.Required("the axis sliced"),
		AttrStart.Required("the first index kept"),
		AttrEnd.Required("one past the last index kept"),
	}
)

func init() {
	for _, d := range []OpDef{
		// Collectives are side effects: every rank must run each one, in
		// the same order, even where a pass would find its output unused.
		{Name: OpAllReduce, Doc: "sum over the tensor-parallel ranks (in rank order: every rank gets the same bits)", MinInputs: 1, MaxInputs: 1, Infer: inferAllReduce, SideEffects: true, Attrs: collectiveAttrs},
		{Name: OpAllGatherCols, Doc: "the ranks' [R,C] column blocks side by side: [R, ranks·C]", MinInputs: 1, MaxInputs: 1, Infer: inferAllGatherCols, SideEffects: true, Attrs: collectiveAttrs},
		{Name: OpSliceDim, Doc: "derived weight: indices [start, end) along one axis of a weight (a tensor-parallel shard)", MinInputs: 1, MaxInputs: 1, Infer: inferSliceDim, Fold: foldSliceDim, Attrs: sliceDimAttrs},
	} {
		MustRegister(d)
	}
}

func ranksAttr(n *Node) (int, error) {
	r, ok := AttrRanks.Lookup(n)
	if !ok || r < 2 {
		return 0, fmt.Errorf("attribute ranks must be ≥ 2, got %d", r)
	}
	return r, nil
}

func inferAllReduce(n *Node) ([]OutType, error) {
	if _, err := ranksAttr(n); err != nil {
		return nil, err
	}
	x := n.Inputs[0]
	if x == nil || x.DType != F32 || x.Kind == Weight {
		return nil, fmt.Errorf("input 0 must be an f32 activation")
	}
	return []OutType{out("sum", F32, x.Shape...)}, nil
}

func inferAllGatherCols(n *Node) ([]OutType, error) {
	r, err := ranksAttr(n)
	if err != nil {
		return nil, err
	}
	x, err := need(n, 0, F32, 2)
	if err != nil {
		return nil, err
	}
	return []OutType{out("gathered", F32, x.Shape[0], r*x.Shape[1])}, nil
}

func inferSliceDim(n *Node) ([]OutType, error) {
	w := n.Inputs[0]
	if w == nil || w.Kind != Weight {
		return nil, fmt.Errorf("input 0 must be a weight")
	}
	axis, lo, hi := colAttr(n, AttrAxis), colAttr(n, AttrStart), colAttr(n, AttrEnd)
	if axis < 0 || axis >= len(w.Shape) {
		return nil, fmt.Errorf("axis %d is not an axis of %v", axis, w.Shape)
	}
	if lo < 0 || hi <= lo || hi > w.Shape[axis] {
		return nil, fmt.Errorf("[%d, %d) is not a non-empty range of axis %d (%d)", lo, hi, axis, w.Shape[axis])
	}
	shape := append([]int(nil), w.Shape...)
	shape[axis] = hi - lo
	return []OutType{out("w", F32, shape...)}, nil
}

func foldSliceDim(n *Node, in [][]float32) ([][]float32, error) {
	shape := n.Inputs[0].Shape
	axis, lo, hi := AttrAxis.Get(n), AttrStart.Get(n), AttrEnd.Get(n)
	if len(in[0]) != prod(shape) {
		return nil, fmt.Errorf("weight has %d values, want %d", len(in[0]), prod(shape))
	}
	outer, inner := prod(shape[:axis]), prod(shape[axis+1:])
	span := shape[axis] * inner
	out := make([]float32, 0, outer*(hi-lo)*inner)
	for o := range outer {
		out = append(out, in[0][o*span+lo*inner:o*span+hi*inner]...)
	}
	return [][]float32{out}, nil
}

// prod is the product of dims (1 for none).
func prod(dims []int) int {
	p := 1
	for _, d := range dims {
		p *= d
	}
	return p
}
