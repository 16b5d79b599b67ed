package ir

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// FormatShape prints a shape with symbolic dimensions: "f32[T,4,64]".
func FormatShape(dt DType, shape []int) string {
	if dt == Host {
		return "host"
	}
	parts := make([]string, len(shape))
	for i, d := range shape {
		switch d {
		case DimT:
			parts[i] = "T"
		case DimS:
			parts[i] = "S"
		case DimR:
			parts[i] = "R"
		case DimC:
			parts[i] = "C"
		default:
			parts[i] = strconv.Itoa(d)
		}
	}
	return string(dt) + "[" + strings.Join(parts, ",") + "]"
}

// Text renders the graph as stable text: value numbers are assigned in
// order of appearance (not internal ids), so two structurally equal graphs
// print the same. Used by golden tests and --dump-graph.
func (g *Graph) Text() string {
	var b strings.Builder
	num := map[*Value]int{}
	name := func(v *Value) string {
		if v == nil {
			return "<nil>"
		}
		n, ok := num[v]
		if !ok {
			n = len(num)
			num[v] = n
		}
		return "%" + strconv.Itoa(n)
	}
	fmt.Fprintf(&b, "graph %s%s\n", g.Name, spaceIf(g.HeaderAttrs().Format()))
	for _, v := range g.Inputs {
		fmt.Fprintf(&b, "  input %s %s : %s\n", name(v), v.Name, FormatShape(v.DType, v.Shape))
	}
	for _, w := range g.Weights {
		if w.Stack > 0 {
			fmt.Fprintf(&b, "  weight %s = stack(%q, %d) : %s\n", name(w), w.Ref, w.Stack, FormatShape(w.DType, w.Shape))
		} else {
			fmt.Fprintf(&b, "  weight %s = %q : %s\n", name(w), w.Ref, FormatShape(w.DType, w.Shape))
		}
	}
	for _, n := range g.Nodes {
		outs := make([]string, len(n.Outputs))
		for i, o := range n.Outputs {
			outs[i] = name(o) + " " + o.Name + " : " + FormatShape(o.DType, o.Shape)
		}
		ins := make([]string, len(n.Inputs))
		for i, in := range n.Inputs {
			ins[i] = name(in)
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
		fmt.Fprintf(&b, "  output %s = %s\n", k, name(g.Outputs[k]))
	}
	return b.String()
}

func spaceIf(s string) string {
	if s == "" {
		return ""
	}
	return " " + s
}

// Summary returns one line per op with its node count, and totals.
func (g *Graph) Summary() string {
	counts := map[string]int{}
	for _, n := range g.Nodes {
		counts[n.Op]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "graph %s: %d nodes, %d weights, %d inputs\n", g.Name, len(g.Nodes), len(g.Weights), len(g.Inputs))
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-22s %d\n", k, counts[k])
	}
	return b.String()
}
