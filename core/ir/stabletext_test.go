package ir

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// StableText names values by input name, weight tensor, name hint or
// producing op, never by position.
func TestStableTextNamesValuesByWhatTheyAre(t *testing.T) {
	g := tinyGraph()
	want := `graph t
  input %tokens : i32[T]
  weight %emb : f32[10,4]
  weight %head : f32[10,4]
  %streams : f32[T,2,4] = embed(%tokens, %emb) {streams=2}
  %mean : f32[T,4] = stream_mean(%streams)
  %logits : f32[T,10] = linear @L0(%mean, %head)
  output logits = %logits
`
	require.Equal(t, want, g.StableText())
	require.Equal(t, g.StableText(), tinyGraph().StableText())

	// unnamed values by op and ordinal, a name given twice by its ordinal,
	// a stacked weight with its tensor, odd characters quoted
	g = New("u")
	x := g.AddInput("x", F32, DimT, 4)
	g.AddStackedWeight("experts.{e}.w", 2, 4, 4)
	a := g.Op1(OpSigmoid, 0, nil, x)
	a.Name = ""
	b := g.Op1(OpSigmoid, 0, nil, a).Named("same")
	c := g.Op1(OpSigmoid, 1, nil, b).Named("same")
	d := g.Op1(OpSigmoid, 1, nil, c)
	d.Name = ""
	q := g.Op1(OpSigmoid, 1, nil, d).Named("a b")
	g.Outputs["y"] = q
	want = `graph u
  input %x : f32[T,4]
  weight %experts.{e}.w = stack("experts.{e}.w", 2) : f32[2,4,4]
  %sigmoid#1 : f32[T,4] = sigmoid @L0(%x)
  %same : f32[T,4] = sigmoid @L0(%sigmoid#1)
  %same#2 : f32[T,4] = sigmoid @L1(%same)
  %sigmoid#2 : f32[T,4] = sigmoid @L1(%same#2)
  %"a b" : f32[T,4] = sigmoid @L1(%sigmoid#2)
  output y = %"a b"
`
	require.Equal(t, want, g.StableText())
}

// A rewrite changes the lines it touches, not the names of every value
// after it (Text renumbers them).
func TestStableTextDiffIsTheRewrite(t *testing.T) {
	build := func(extra bool) *Graph {
		g := New("d")
		v := g.AddInput("x", F32, DimT, 4)
		for i := range 6 {
			v = g.Op1(OpSigmoid, i, nil, v).Named("s" + string(rune('0'+i)))
			if extra && i == 1 {
				v = g.Op1(OpSigmoid, i, nil, v).Named("inserted")
			}
		}
		g.Outputs["y"] = v
		return g
	}
	changed := func(a, b string) int {
		al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
		n := 0
		for i := range min(len(al), len(bl)) {
			if al[i] != bl[i] {
				n++
			}
		}
		return n + max(len(al), len(bl)) - min(len(al), len(bl))
	}
	before, after := build(false), build(true)
	require.Equal(t, 7, changed(before.Text(), after.Text()), "Text renumbers every later value: every line from the insertion on differs")
	// one line added, one reader changed: lines after the insertion shift
	// by one, so compare as sets
	bs, as := map[string]bool{}, map[string]bool{}
	for _, l := range strings.Split(before.StableText(), "\n") {
		bs[l] = true
	}
	var added []string
	for _, l := range strings.Split(after.StableText(), "\n") {
		as[l] = true
		if !bs[l] {
			added = append(added, l)
		}
	}
	var removed []string
	for l := range bs {
		if !as[l] {
			removed = append(removed, l)
		}
	}
	require.Equal(t, []string{
		"  %inserted : f32[T,4] = sigmoid @L1(%s1)",
		"  %s2 : f32[T,4] = sigmoid @L2(%inserted)",
	}, added)
	require.Equal(t, []string{"  %s2 : f32[T,4] = sigmoid @L2(%s1)"}, removed)
}
