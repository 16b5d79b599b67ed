package ir

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every registered op's attributes are well declared: a name, a doc, a
// known type, a default of that type, no name twice (with the traits').
func TestOpAttributesAreDeclared(t *testing.T) {
	for _, op := range OpNames() {
		d, _ := Lookup(op)
		seen := map[string]bool{}
		for _, a := range d.AttrDefs() {
			require.NoError(t, a.check(), "%s.%s", op, a.Name)
			require.False(t, seen[a.Name], "%s declares %s twice", op, a.Name)
			seen[a.Name] = true
			got, ok := d.Attr(a.Name)
			require.True(t, ok)
			require.Equal(t, a, got)
		}
		require.True(t, seen[AttrStream.Name], "%s: every op takes %s", op, AttrStream.Name)
		_, tuned := d.Attr(AttrTuneBuckets.Name)
		require.Equal(t, d.GEMM != nil, tuned, "%s: the tune attributes come with the GEMM trait", op)
		_, lens := d.Attr(AttrLengthsFrom.Name)
		require.Equal(t, d.ReadsLengths, lens, "%s: lengths_from comes with the ReadsLengths trait", op)
	}
	for _, a := range GraphAttrs {
		require.NoError(t, a.check(), a.Name)
	}
}

// A definition with a bad attribute declaration is refused.
func TestRegisterRefusesBadAttributeDeclarations(t *testing.T) {
	for name, as := range map[string][]AttrDef{
		"declares attribute \"x\" twice": {Attr[int]{"x"}.Default(1, "a"), Attr[int]{"x"}.Default(2, "b")},
		"a trait declares it":            {AttrStream.Default(0, "mine")},
		"needs a name and a doc":         {Attr[int]{"x"}.Optional("")},
		"the attribute is int":           {{Name: "x", Type: IntAttr, Default: 1.5, Doc: "d"}},
		"unknown type":                   {{Name: "x", Doc: "d"}},
	} {
		err := Register(OpDef{Name: "t_attrs", Infer: inferSame, Attrs: as})
		require.ErrorContains(t, err, name)
	}
	_, ok := Lookup("t_attrs")
	require.False(t, ok)
}

// Get returns the node's value or the default its op declares (per op:
// eps is required on rmsnorm, 1e-5 on gated_rmsnorm); Lookup tells absent
// from set; an int stands for a float; reading an attribute the op does
// not declare panics.
func TestAttrGetReturnsTheDeclaredDefault(t *testing.T) {
	n := func(op string, kvs ...KV) *Node { return &Node{Op: op, Attrs: NewAttrs(kvs...)} }
	require.Equal(t, 1e-5, AttrEps.Get(n(OpGatedRMSNorm)))
	require.Equal(t, 1e-5, AttrEps.Get(n(OpMHCPre)))
	require.Equal(t, 0.0, AttrEps.Get(n(OpRMSNorm)), "required: absent reads as 0, which shape inference refuses")
	require.Equal(t, 20, AttrIters.Get(n(OpMHCPostPre)))
	require.Equal(t, 1e-6, AttrHCEps.Get(n(OpMHCPre)))
	require.Equal(t, 1, AttrGroups.Get(n(OpMoERoute)))
	require.Equal(t, 1.0, AttrScaling.Get(n(OpMoERoute)))
	require.Equal(t, LengthsBatch, AttrLengthsFrom.Get(n(OpKDAConv)))
	require.Equal(t, 0, AttrStream.Get(n(OpAdd)))
	require.Nil(t, AttrTuneBuckets.Get(n(OpLinear)))

	require.Equal(t, 3e-6, AttrEps.Get(n(OpRMSNorm, AttrEps.Is(3e-6))))
	require.Equal(t, 2.0, AttrEps.Get(&Node{Op: OpRMSNorm, Attrs: Attrs{"eps": 2}}), "an int stands for a float")
	require.Equal(t, 1e-5, AttrEps.Get(&Node{Op: OpGatedRMSNorm, Attrs: Attrs{"eps": "x"}}), "a wrong-typed value reads as the default (the verifier reports it)")
	_, ok := AttrLowerBound.Lookup(n(OpKDAGate))
	require.False(t, ok)
	v, ok := AttrLowerBound.Lookup(n(OpKDAGate, AttrLowerBound.Is(-5)))
	require.True(t, ok)
	require.Equal(t, -5.0, v)

	m := n(OpAdd)
	AttrStream.Set(m, 1)
	require.Equal(t, 1, AttrStream.Get(m))
	require.PanicsWithValue(t, `ir: op "add" declares no attribute "eps"`, func() { AttrEps.Get(m) })
	require.Panics(t, func() { AttrTuneBuckets.Get(n(OpAdd)) }, "the tune attributes are the GEMM trait's")
	require.Equal(t, FloatAttr, AttrEps.Type())
	require.Equal(t, IntsAttr, AttrSplits.Type())
	require.Equal(t, "int list", IntsAttr.String())
	require.Equal(t, "eps", fmt.Sprint(AttrEps), "an attribute prints as its name")
}

// The verifier names the node, its op and the attribute of an undeclared
// attribute, a wrong-typed value or a missing required one; and refuses
// undeclared graph attributes and the typed properties as attributes.
func TestVerifierRejectsBadAttributes(t *testing.T) {
	for _, c := range []struct {
		attrs Attrs
		want  string
	}{
		{Attrs{"streams": 2, "epsilon": 1e-5}, `node 0 (embed, layer -1): attribute "epsilon" (1e-05) is not declared for op embed (declared: streams, vocab_start, stream)`},
		{Attrs{"streams": 2.0}, `node 0 (embed, layer -1): attribute "streams" is float 2, op embed declares it int`},
		{Attrs{"streams": "2"}, `attribute "streams" is string "2", op embed declares it int`},
		{Attrs{"streams": 2, "stream": true}, `attribute "stream" is bool true, op embed declares it int`},
	} {
		g := tinyGraph()
		g.Nodes[0].Attrs = c.attrs
		err := g.Verify()
		require.ErrorContains(t, err, c.want)
		require.NotContains(t, err.Error(), "used before definition", "a node with bad attributes still defines its outputs")
	}

	g := New("t")
	x := g.AddInput("x", F32, DimT, 4)
	y := g.Op1(OpRMSNorm, 0, NewAttrs(AttrEps.Is(1e-5)), x, g.AddWeight("w", 4))
	g.Outputs["y"] = y
	require.NoError(t, g.Verify())
	delete(y.Producer.Attrs, AttrEps.Name)
	require.ErrorContains(t, g.Verify(), `node 0 (rmsnorm, layer 0): required attribute "eps" (float) is missing`)
	y.Producer.Attrs = NewAttrs(AttrEps.Is(1e-5), AttrTuneKind.Is("x"))
	require.ErrorContains(t, g.Verify(), `attribute "tune_kind" ("x") is not declared for op rmsnorm`)

	g = tinyGraph()
	g.Attrs["layers"] = 2
	require.NoError(t, g.Verify())
	g.Attrs["layers"] = "two"
	require.ErrorContains(t, g.Verify(), `graph: attribute "layers" is string "two", graphs declares it int`)
	g.Attrs = Attrs{"colour": "red"}
	require.ErrorContains(t, g.Verify(), `graph: attribute "colour" ("red") is not declared for graphs`)
	g.Attrs = Attrs{"mode": "decode"}
	require.ErrorContains(t, g.Verify(), `graph: attribute "mode" is a typed property`)
}

// A plugin's op declares its attributes as the built-in ones do.
func TestPluginOpDeclaresAttributes(t *testing.T) {
	d, ok := Lookup(OpMoEAppendExpert)
	require.True(t, ok)
	a, ok := d.Attr(AttrExpert.Name)
	require.True(t, ok)
	require.True(t, a.Required)
	require.Equal(t, IntAttr, a.Type)

	gain := Attr[float64]{"t_gain"}
	require.NoError(t, Register(OpDef{Name: "t_scaled", Doc: "x·gain", MinInputs: 1, MaxInputs: 1, Infer: inferSame,
		Attrs: []AttrDef{gain.Default(1, "the gain")}}))
	g := New("t")
	x := g.AddInput("x", F32, DimT, 4)
	y := g.Op1("t_scaled", 0, nil, x)
	require.Equal(t, 1.0, gain.Get(y.Producer))
	g.Outputs["y"] = g.Op1("t_scaled", 0, NewAttrs(gain.Is(2)), y)
	require.Equal(t, 2.0, gain.Get(g.Outputs["y"].Producer))
	require.NoError(t, g.Verify())
	g.Outputs["y"].Producer.Attrs["t_gain"] = true
	require.ErrorContains(t, g.Verify(), `attribute "t_gain" is bool true, op t_scaled declares it float`)
}

// The mode and the MTP layer are typed properties, printed and carried
// as the graph attributes mode and mtp_layer.
func TestGraphModeAndMTPLayer(t *testing.T) {
	for m := ModePrefill; m <= ModeVerify; m++ {
		p, err := ParseMode(m.String())
		require.NoError(t, err)
		require.Equal(t, m, p)
		require.True(t, m.Valid())
		b, err := json.Marshal(m)
		require.NoError(t, err)
		var back Mode
		require.NoError(t, json.Unmarshal(b, &back))
		require.Equal(t, m, back)
	}
	require.False(t, ModeUnset.Valid())
	require.False(t, Mode(99).Valid())
	require.Equal(t, "mode(99)", Mode(99).String())
	_, err := ParseMode("sideways")
	require.ErrorContains(t, err, `unknown mode "sideways"`)
	_, err = ParseMode("")
	require.Error(t, err)

	g := tinyGraph()
	require.Equal(t, ModeUnset, g.Mode())
	_, mtp := g.MTPLayer()
	require.False(t, mtp)
	g.SetMode(ModeDecode)
	g.SetMTPLayer(8)
	g.Attrs.Put(GraphAttrLogits.Is("last"))
	require.NoError(t, g.Verify())
	require.Contains(t, g.Text(), "graph t {logits=\"last\", mode=\"decode\", mtp_layer=8}\n")
	h := g.HeaderAttrs()
	require.Equal(t, Attrs{"logits": "last", "mode": "decode", "mtp_layer": 8}, h)
	require.Equal(t, Attrs{"logits": "last"}, g.Attrs, "HeaderAttrs copies")

	f := New("t")
	require.NoError(t, f.SetHeaderAttrs(h))
	require.Equal(t, ModeDecode, f.Mode())
	l, mtp := f.MTPLayer()
	require.True(t, mtp)
	require.Equal(t, 8, l)
	require.Equal(t, Attrs{"logits": "last"}, f.Attrs)
	for _, bad := range []Attrs{{"mode": "sideways"}, {"mode": 1}, {"mtp_layer": -1}, {"mtp_layer": "8"}} {
		require.Error(t, New("t").SetHeaderAttrs(bad), "%v", bad)
	}
}

// Arbitrary attributes on a node never make the verifier panic, and it
// accepts them exactly when every one is declared by the op with its type
// and the required ones are set.
func FuzzVerifyAttributes(f *testing.F) {
	f.Add("streams", byte(0), int64(2), "x")
	f.Add("streams", byte(1), int64(2), "x")
	f.Add("epsilon", byte(1), int64(0), "")
	f.Add("stream", byte(3), int64(1), "")
	f.Add("stream", byte(4), int64(1), "")
	f.Fuzz(func(t *testing.T, key string, kind byte, i int64, s string) {
		var v any
		switch kind % 6 {
		case 0:
			v = int(i)
		case 1:
			v = float64(i) / 3
		case 2:
			v = s
		case 3:
			v = i%2 == 0
		case 4:
			v = []int{int(i), 1}
		default:
			v = struct{}{}
		}
		g := tinyGraph()
		g.Nodes[0].Attrs[key] = v
		err := g.Verify()
		d, declared := g.Nodes[0].Def().Attr(key)
		ok := declared && typeOfValue(v) == d.Type
		if key == AttrStreams.Name && ok {
			ok = v.(int) >= 1 // shape inference: streams ≥ 1, and the outputs' types follow it
			ok = ok && v.(int) == 2
		}
		require.Equal(t, ok, err == nil, "%q=%v: %v", key, v, err)
	})
}
