package ir

import (
	"errors"
	"fmt"
	"slices"
)

// Verify checks the graph's structural invariants: known ops with valid
// arity and attributes, every input defined before use (inputs, weights or
// earlier nodes' outputs), every value defined once, output types equal to
// what shape inference says, and every graph output defined. It returns all
// problems found, joined.
func (g *Graph) Verify() error {
	var errs []error
	defined := map[*Value]bool{}
	ids := map[int]bool{}
	def := func(v *Value, where string) {
		if defined[v] {
			errs = append(errs, fmt.Errorf("%s: value %%%d (%s) defined twice", where, v.ID, v.Name))
		}
		if ids[v.ID] {
			errs = append(errs, fmt.Errorf("%s: value id %%%d reused", where, v.ID))
		}
		defined[v], ids[v.ID] = true, true
	}
	for _, v := range g.Inputs {
		if v.Kind != Input {
			errs = append(errs, fmt.Errorf("input %%%d (%s) has kind %s", v.ID, v.Name, v.Kind))
		}
		def(v, "inputs")
	}
	for _, w := range g.Weights {
		if w.Kind != Weight || w.Ref == "" {
			errs = append(errs, fmt.Errorf("weight %%%d (%s) lacks a checkpoint reference", w.ID, w.Name))
		}
		def(w, "weights")
	}
	for i, n := range g.Nodes {
		where := fmt.Sprintf("node %d (%s, layer %d)", i, n.Op, n.Layer)
		d, ok := Lookup(n.Op)
		if !ok {
			errs = append(errs, fmt.Errorf("%s: unknown op %q", where, n.Op))
			continue
		}
		if len(n.Inputs) < d.MinInputs || (d.MaxInputs >= 0 && len(n.Inputs) > d.MaxInputs) {
			errs = append(errs, fmt.Errorf("%s: %d inputs, want %d..%d", where, len(n.Inputs), d.MinInputs, d.MaxInputs))
			continue
		}
		for k, v := range n.Attrs {
			if !validAttr(v) {
				errs = append(errs, fmt.Errorf("%s: attribute %q has unsupported type %T", where, k, v))
			}
		}
		bad := false
		for j, in := range n.Inputs {
			if in == nil {
				errs = append(errs, fmt.Errorf("%s: input %d is nil", where, j))
				bad = true
			} else if !defined[in] {
				errs = append(errs, fmt.Errorf("%s: input %d (%%%d %s) used before definition", where, j, in.ID, in.Name))
				bad = true
			}
		}
		if bad {
			continue
		}
		outs, err := d.Infer(n)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		if len(outs) != len(n.Outputs) {
			errs = append(errs, fmt.Errorf("%s: %d outputs, shape inference says %d", where, len(n.Outputs), len(outs)))
			continue
		}
		for j, o := range n.Outputs {
			if o.DType != outs[j].DType || !slices.Equal(o.Shape, outs[j].Shape) {
				errs = append(errs, fmt.Errorf("%s: output %d is %s%v, shape inference says %s%v", where, j, o.DType, o.Shape, outs[j].DType, outs[j].Shape))
			}
			if o.Producer != n {
				errs = append(errs, fmt.Errorf("%s: output %d's producer is not this node", where, j))
			}
			def(o, where)
		}
	}
	for name, v := range g.Outputs {
		if v == nil || !defined[v] {
			errs = append(errs, fmt.Errorf("graph output %q is not defined", name))
		}
	}
	return errors.Join(errs...)
}
