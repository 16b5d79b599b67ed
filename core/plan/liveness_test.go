package plan

import (
	"math"
	"testing"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/stretchr/testify/require"
)

// The event list: each step's outputs are born before it runs; a value
// dies after its last reader (once, however often that step reads it), an
// output no step reads after its own step; graph inputs, constants and
// graph outputs never die.
func TestLiveness(t *testing.T) {
	g := ir.New("life")
	h := g.AddInput("h", ir.F32, ir.DimT, 4)
	w := g.AddWeight("w.weight", 4, 4)
	var steps []*ir.Node
	add := func(in ...*ir.Value) *ir.Value {
		n, err := g.NewNode(ir.OpSigmoid, 0, nil, in[0])
		require.NoError(t, err)
		n.Inputs = in
		steps = append(steps, n)
		return n.Outputs[0]
	}
	a := add(h, w)    // 0
	b := add(a)       // 1
	unused := add(b)  // 2: never read
	c := add(a, b, a) // 3: a read twice, its last reader
	out := add(c)     // 4: the graph output
	lastUse := map[*ir.Value]int{}
	for si, n := range steps {
		for _, in := range n.Inputs {
			lastUse[in] = si
		}
	}
	lastUse[out] = math.MaxInt
	l := NewLiveness(steps, lastUse)
	vals := func(es []Event) []*ir.Value {
		var vs []*ir.Value
		for _, e := range es {
			vs = append(vs, e.Value)
		}
		return vs
	}
	require.Equal(t, len(steps), l.Steps())
	want := []struct{ born, dies []*ir.Value }{
		{[]*ir.Value{a}, nil},
		{[]*ir.Value{b}, nil},
		{[]*ir.Value{unused}, []*ir.Value{unused}},
		{[]*ir.Value{c}, []*ir.Value{a, b}},
		{[]*ir.Value{out}, []*ir.Value{c}},
	}
	for si, w := range want {
		require.Equal(t, w.born, vals(l.Born(si)), "step %d born", si)
		require.Equal(t, w.dies, vals(l.Dies(si)), "step %d dies", si)
		for _, e := range l.Born(si) {
			require.Equal(t, Event{Step: si, Value: e.Value}, e)
		}
		for _, e := range l.Dies(si) {
			require.Equal(t, Event{Step: si, Value: e.Value, Dies: true}, e)
		}
	}
	// the flat list is the steps' events in order
	var all []Event
	for si := range steps {
		all = append(all, l.Born(si)...)
		all = append(all, l.Dies(si)...)
	}
	require.Equal(t, all, l.Events)
}
