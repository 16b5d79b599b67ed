package ir

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func dflashNode(g *Graph, attrs Attrs, q, kb, vb, kc, vc, qn, kn *Value) (*Node, error) {
	return g.NewNode(OpDFlashAttn, 0, attrs, g.Input(InputBatch), q, kb, vb, kc, vc, qn, kn)
}

// dflash_attn: q and the block's k/v have the token dimension (T = S·B),
// the context's k/v the context dimension C; the output is [T, Hq·hd]; the
// op has side effects (it appends to the draft cache); every attribute is
// checked, and a shape or weight of the wrong size is refused naming it.
func TestDFlashAttnShapes(t *testing.T) {
	g := New("t")
	g.AddInput(InputBatch, Host)
	const Hq, Hkv, hd = 4, 2, 8
	q := g.AddInput("q", F32, DimT, Hq*hd)
	kb := g.AddInput("kb", F32, DimT, Hkv*hd)
	vb := g.AddInput("vb", F32, DimT, Hkv*hd)
	kc := g.AddInput("kc", F32, DimC, Hkv*hd)
	vc := g.AddInput("vc", F32, DimC, Hkv*hd)
	qn := g.AddWeight("q_norm", hd)
	kn := g.AddWeight("k_norm", hd)
	attrs := func(kv ...KV) Attrs {
		a := NewAttrs(AttrHeads.Is(Hq), AttrKVHeads.Is(Hkv), AttrHeadDim.Is(hd), AttrEps.Is(1e-6), AttrRopeTheta.Is(1e6), AttrBlock.Is(4))
		return a.Put(kv...)
	}
	n, err := dflashNode(g, attrs(), q, kb, vb, kc, vc, qn, kn)
	require.NoError(t, err)
	require.Equal(t, []int{DimT, Hq * hd}, n.Outputs[0].Shape)
	require.True(t, n.Def().SideEffects)
	require.False(t, n.Def().ReadsLengths)
	g.Nodes = append(g.Nodes, n)
	require.NoError(t, g.Verify())
	require.Contains(t, g.Text(), "f32[C,16]")

	for _, c := range []struct {
		attrs Attrs
		want  string
	}{
		{attrs(AttrKVHeads.Is(3)), "kv_heads (3) must divide heads (4)"},
		{attrs(AttrHeadDim.Is(7)), "head_dim"},
		{attrs(AttrEps.Is(0.0)), "eps must be > 0"},
		{attrs(AttrRopeTheta.Is(-1.0)), "rope_theta must be > 0"},
		{attrs(AttrBlock.Is(0)), "block must be ≥ 1"},
	} {
		_, err := dflashNode(g, c.attrs, q, kb, vb, kc, vc, qn, kn)
		require.ErrorContains(t, err, c.want)
	}
	_, err = dflashNode(g, attrs(), q, kb, vb, kb, vc, qn, kn)
	require.ErrorContains(t, err, "input 4 (k (context), kb) is f32[T,16], want f32[C,16]")
	_, err = dflashNode(g, attrs(), q, kc, vb, kc, vc, qn, kn)
	require.ErrorContains(t, err, "input 2 (k (block), kc) is f32[C,16], want f32[T,16]")
	_, err = dflashNode(g, attrs(), q, kb, vb, kc, vc, g.AddWeight("bad", hd+1), kn)
	require.ErrorContains(t, err, "input 6 (q_norm weight bad) has 9 elements, want head_dim 8")
	_, err = g.NewNode(OpDFlashAttn, 0, attrs(), q, q, kb, vb, kc, vc, qn, kn)
	require.ErrorContains(t, err, "input 0 (q) is f32, want host")
	d := NewAttrs(AttrHeads.Is(Hq), AttrKVHeads.Is(Hkv), AttrHeadDim.Is(hd), AttrEps.Is(1e-6), AttrBlock.Is(4))
	_, err = dflashNode(g, d, q, kb, vb, kc, vc, qn, kn)
	require.ErrorContains(t, err, "rope_theta") // required: absent reads as 0, refused
}

// concat_cols joins activations of equal rows along the last dim.
func TestConcatCols(t *testing.T) {
	g := New("t")
	a := g.AddInput("a", F32, DimT, 3)
	b := g.AddInput("b", F32, DimT, 5)
	require.Equal(t, []int{DimT, 8}, g.Op1(OpConcatCols, -1, nil, a, b).Shape)
	require.Equal(t, []int{DimT, 3}, g.Op1(OpConcatCols, -1, nil, a).Shape)
	_, err := g.NewNode(OpConcatCols, -1, nil, a, g.AddInput("c", F32, DimC, 3))
	require.ErrorContains(t, err, "rows must match")
	require.NoError(t, g.Verify())
}

// The DFlash property is typed: it round-trips through the header
// attributes, is refused as a plain attribute, and excludes the MTP layer.
func TestDFlashGraphProperty(t *testing.T) {
	g := New("t")
	require.False(t, g.DFlash())
	g.SetDFlash()
	g.SetMode(ModeVerify)
	h := g.HeaderAttrs()
	require.Equal(t, true, h[GraphAttrDFlash])
	g2 := New("t2")
	require.NoError(t, g2.SetHeaderAttrs(h))
	require.True(t, g2.DFlash())
	require.Equal(t, ModeVerify, g2.Mode())
	require.ErrorContains(t, g2.SetHeaderAttrs(Attrs{GraphAttrDFlash: 1}), "want true")
	require.ErrorContains(t, g2.SetHeaderAttrs(Attrs{GraphAttrDFlash: true, GraphAttrMTPLayer: 3}), "not both")
	g3 := New("t3")
	g3.Attrs[GraphAttrDFlash] = true
	require.ErrorContains(t, g3.Verify(), "typed property")
}
