package ir

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// StableText renders the graph like Text, but names every value by what it
// is rather than by where it appears: a graph input by its name
// (%tokens), a weight leaf by its checkpoint tensor
// (%model.layers.0.mlp.up_proj.weight), an activation by its name hint
// (%l3.self_attn.q_proj) or, without one, by its producing op and an
// ordinal among that op's unnamed values (%linear#4). A name met a second
// time is told apart by its ordinal in order of appearance (%x, %x#2). A
// rewrite of three nodes then changes those lines and the lines that read
// their outputs, not the number of every value after them: pass goldens
// print this, so that their diff against the unrewritten graph is what the
// pass changed. Like Text, two structurally equal graphs print the same.
// Nothing parses it back.
func (g *Graph) StableText() string {
	nm := stableNames{name: map[*Value]string{}, used: map[string]int{}, anon: map[string]int{}}
	var b strings.Builder
	fmt.Fprintf(&b, "graph %s%s\n", g.Name, spaceIf(g.HeaderAttrs().Format()))
	for _, v := range g.Inputs {
		fmt.Fprintf(&b, "  input %s : %s\n", nm.def(v, v.Name, ""), FormatShape(v.DType, v.Shape))
	}
	for _, w := range g.Weights {
		hint := w.Name
		if hint == "" {
			hint = w.Ref
		}
		n := nm.def(w, hint, "weight")
		switch {
		case w.Stack > 0:
			fmt.Fprintf(&b, "  weight %s = stack(%q, %d) : %s\n", n, w.Ref, w.Stack, FormatShape(w.DType, w.Shape))
		case w.Ref != hint:
			fmt.Fprintf(&b, "  weight %s = %q : %s\n", n, w.Ref, FormatShape(w.DType, w.Shape))
		default:
			fmt.Fprintf(&b, "  weight %s : %s\n", n, FormatShape(w.DType, w.Shape))
		}
	}
	for _, n := range g.Nodes {
		// inputs first: a value read before it is defined (a graph that
		// does not verify) still prints
		ins := make([]string, len(n.Inputs))
		for i, in := range n.Inputs {
			ins[i] = nm.use(in)
		}
		outs := make([]string, len(n.Outputs))
		for i, o := range n.Outputs {
			outs[i] = nm.def(o, o.Name, n.Op) + " : " + FormatShape(o.DType, o.Shape)
		}
		layer := ""
		if n.Layer >= 0 {
			layer = fmt.Sprintf(" @L%d", n.Layer)
		}
		fmt.Fprintf(&b, "  %s = %s%s(%s)%s\n", strings.Join(outs, ", "), n.Op, layer, strings.Join(ins, ", "), spaceIf(n.Attrs.Format()))
	}
	keys := make([]string, 0, len(g.Outputs))
	for k := range g.Outputs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "  output %s = %s\n", k, nm.use(g.Outputs[k]))
	}
	return b.String()
}

// stableNames assigns StableText's value names.
type stableNames struct {
	name map[*Value]string
	used map[string]int // times a name was given
	anon map[string]int // unnamed values per kind
}

// def names v from its hint, or from kind and an ordinal when it has none.
func (s *stableNames) def(v *Value, hint, kind string) string {
	if n, ok := s.name[v]; ok {
		return n
	}
	base := hint
	if base == "" {
		if kind == "" {
			kind = "value"
		}
		s.anon[kind]++
		base = kind + "#" + strconv.Itoa(s.anon[kind])
	}
	n := base
	for s.used[n] > 0 {
		s.used[base]++
		n = base + "#" + strconv.Itoa(s.used[base])
	}
	s.used[n]++
	n = "%" + quoteName(n)
	s.name[v] = n
	return n
}

// use is v's name where it is read: its own, or (a value no input, weight
// or earlier node defines) a name from its hint.
func (s *stableNames) use(v *Value) string {
	if v == nil {
		return "<nil>"
	}
	if n, ok := s.name[v]; ok {
		return n
	}
	return s.def(v, v.Name, "undefined")
}

// quoteName quotes a name that has characters other than letters, digits
// and . _ - # { } : /.
func quoteName(n string) string {
	for _, r := range n {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case strings.ContainsRune("._-#{}:/", r):
		default:
			return strconv.Quote(n)
		}
	}
	return n
}
