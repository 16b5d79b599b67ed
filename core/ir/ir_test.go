package ir

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func tinyGraph() *Graph {
	g := New("t")
	x := g.AddInput("tokens", I32, DimT)
	w := g.AddWeight("emb", 10, 4)
	s := g.Op1(OpEmbed, -1, Attrs{"streams": 2}, x, w).Named("streams")
	m := g.Op1(OpStreamMean, -1, nil, s).Named("mean")
	y := g.Op1(OpLinear, 0, nil, m, g.AddWeight("head", 10, 4)).Named("logits")
	g.Outputs["logits"] = y
	return g
}

func TestTextIsStableAndReadable(t *testing.T) {
	g := tinyGraph()
	require.NoError(t, g.Verify())
	want := `graph t
  input %0 tokens : i32[T]
  weight %1 = "emb" : f32[10,4]
  weight %2 = "head" : f32[10,4]
  %3 streams : f32[T,2,4] = embed(%0, %1) {streams=2}
  %4 mean : f32[T,4] = stream_mean(%3)
  %5 logits : f32[T,10] = linear @L0(%4, %2)
  output logits = %5
`
	require.Equal(t, want, g.Text())
	require.Equal(t, g.Text(), tinyGraph().Text())
	require.Contains(t, g.Summary(), "linear")
}

func TestVerifierFindsProblems(t *testing.T) {
	g := tinyGraph()
	g.Nodes[1].Inputs[0] = g.Nodes[2].Outputs[0] // use before definition
	require.ErrorContains(t, g.Verify(), "used before definition")

	g = tinyGraph()
	g.Nodes[0].Op = "no_such_op"
	require.ErrorContains(t, g.Verify(), "unknown op")

	g = tinyGraph()
	g.Nodes[2].Outputs[0].Shape = []int{DimT, 11}
	require.ErrorContains(t, g.Verify(), "shape inference says")

	g = tinyGraph()
	g.Nodes[0].Attrs["bad"] = struct{}{}
	require.ErrorContains(t, g.Verify(), "unsupported type")

	g = tinyGraph()
	g.Outputs["dangling"] = &Value{ID: 99}
	require.ErrorContains(t, g.Verify(), "dangling")

	g = tinyGraph()
	g.Nodes[2].Inputs = g.Nodes[2].Inputs[:1]
	require.True(t, strings.Contains(g.Verify().Error(), "inputs, want"))
}

func TestRewriteHelpers(t *testing.T) {
	g := tinyGraph()
	mean := g.Nodes[1].Outputs[0]
	require.Len(t, g.Users(mean), 1)
	n, err := g.NewNode(OpStreamMean, -1, nil, g.Nodes[0].Outputs[0])
	require.NoError(t, err)
	g.Nodes = append(g.Nodes[:2], append([]*Node{n}, g.Nodes[2:]...)...)
	g.ReplaceUses(mean, n.Outputs[0])
	require.Equal(t, 1, g.RemoveDead())
	require.NoError(t, g.Verify())
	require.Len(t, g.Nodes, 3)
}

func TestAttrsFormatSorted(t *testing.T) {
	a := Attrs{"z": 1, "a": "x", "m": []int{1, 2}, "f": 0.5, "b": true}
	require.Equal(t, `{a="x", b=true, f=0.5, m=[1,2], z=1}`, a.Format())
}

func TestLeafNames(t *testing.T) {
	g := New("t")
	w := g.AddWeight("model.norm.weight", 4)
	require.Equal(t, []string{"model.norm.weight"}, w.LeafNames())
	s := g.AddStackedWeight("layers.1.mlp.experts.{e}.up_proj.weight", 3, 2, 4)
	require.Equal(t, []string{"layers.1.mlp.experts.0.up_proj.weight", "layers.1.mlp.experts.1.up_proj.weight", "layers.1.mlp.experts.2.up_proj.weight"}, s.LeafNames())
}

// Traits: constant ops fold, GEMM ops report their shape and weight, ops
// that read the batch lengths take either lengths source, and a definition
// with contradictory traits is refused.
func TestOpTraits(t *testing.T) {
	g := New("t")
	a := g.AddWeight("a", 2, 3)
	b := g.AddWeight("b", 1, 3)
	cat := g.Op1(OpConcatRows, 0, nil, a, b)
	require.True(t, cat.Producer.Def().Const())
	got, err := cat.Producer.Def().Fold(cat.Producer, [][]float32{{1, 2, 3, 4, 5, 6}, {7, 8, 9}})
	require.NoError(t, err)
	require.Equal(t, [][]float32{{1, 2, 3, 4, 5, 6, 7, 8, 9}}, got)

	x := g.AddInput("x", F32, DimT, 3)
	y := g.Op1(OpLinear, 0, nil, x, cat)
	gs := y.Producer.Def().GEMM(y.Producer)
	require.Equal(t, GEMMShape{N: 3, K: 3, Weight: cat}, gs)
	require.Nil(t, (&Node{Op: OpAdd}).Def().GEMM)

	batch := g.AddInput(InputBatch, Host)
	lens := g.Op1(OpSeqLengths, -1, nil, batch)
	for _, src := range []*Value{batch, lens} {
		m := g.Op1(OpDSAMeta, 0, Attrs{"kpool": 2}, src)
		require.True(t, m.Producer.Def().ReadsLengths)
	}
	var readers []string
	for _, op := range OpNames() {
		if d, _ := Lookup(op); d.ReadsLengths {
			readers = append(readers, op)
		}
	}
	require.Equal(t, []string{OpDSAMeta, OpKDAAttn, OpKDAConv}, readers)

	require.ErrorContains(t, Register(OpDef{Name: "t_bad", Infer: inferSame, Fold: foldConcat, SideEffects: true}), "constant op")
	require.ErrorContains(t, Register(OpDef{Name: OpAdd, Infer: inferSame}), "registered twice")
	require.NotContains(t, KernelOps(), OpStack)
	require.Contains(t, KernelOps(), OpMoEAppendExpert)
}

// embed without a streams attribute gives plain embedding rows f32[T,D];
// streams, when given, must be ≥ 1.
func TestEmbedRows(t *testing.T) {
	g := New("t")
	x := g.AddInput(InputTokens, I32, DimT)
	w := g.AddWeight("emb", 10, 4)
	e := g.Op1(OpEmbed, -1, nil, x, w)
	require.Equal(t, []int{DimT, 4}, e.Shape)
	require.Equal(t, []int{DimT, 3, 4}, g.Op1(OpEmbed, -1, Attrs{"streams": 3}, x, w).Shape)
	_, err := g.NewNode(OpEmbed, -1, Attrs{"streams": 0}, x, w)
	require.ErrorContains(t, err, "streams must be ≥ 1")
	require.NoError(t, g.Verify())
}

// slice_cols is a constant op: the columns [start, end) of a weight, folded
// at compile time; a bad range or an activation input is refused.
func TestSliceCols(t *testing.T) {
	g := New("t")
	w := g.AddWeight("w", 2, 5)
	s := g.Op1(OpSliceCols, 0, Attrs{"start": 1, "end": 4}, w)
	require.Equal(t, []int{2, 3}, s.Shape)
	require.Equal(t, Weight, s.Kind)
	require.True(t, s.Producer.Def().Const())
	require.NotContains(t, KernelOps(), OpSliceCols)
	got, err := s.Producer.Def().Fold(s.Producer, [][]float32{{0, 1, 2, 3, 4, 10, 11, 12, 13, 14}})
	require.NoError(t, err)
	require.Equal(t, [][]float32{{1, 2, 3, 11, 12, 13}}, got)
	_, err = s.Producer.Def().Fold(s.Producer, [][]float32{{1, 2}})
	require.ErrorContains(t, err, "weight has 2 values, want 10")
	for _, a := range []Attrs{{"start": 3, "end": 3}, {"start": -1, "end": 2}, {"start": 0, "end": 6}, {"end": 2}} {
		_, err := g.NewNode(OpSliceCols, 0, a, w)
		require.ErrorContains(t, err, "not a non-empty range of 5", "%v", a)
	}
	x := g.AddInput("x", F32, DimT, 5)
	_, err = g.NewNode(OpSliceCols, 0, Attrs{"start": 0, "end": 2}, x)
	require.ErrorContains(t, err, "must be a weight")
	y := g.Op1(OpLinear, 0, nil, g.AddInput("h", F32, DimT, 3), s)
	require.Equal(t, []int{DimT, 2}, y.Shape)
	require.NoError(t, g.Verify())
}

// swiglu_packed halves its input's width: g and u side by side.
func TestSwiGLUPackedShape(t *testing.T) {
	g := New("t")
	x := g.AddInput("x", F32, DimT, 8)
	require.Equal(t, []int{DimT, 4}, g.Op1(OpSwiGLUPacked, 0, Attrs{"limit": 7.0}, x).Shape)
	_, err := g.NewNode(OpSwiGLUPacked, 0, nil, g.AddInput("odd", F32, DimT, 5))
	require.ErrorContains(t, err, "not g and u of equal widths")
}
