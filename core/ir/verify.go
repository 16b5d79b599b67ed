package ir

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Verify checks the graph's structural invariants: known ops with valid
// arity and attributes (each declared by the op or its traits, of the
// declared type, the required ones set; graph attributes declared by
// GraphAttrs), every input defined before use (inputs, weights or
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
	ga := g.Attrs.Clone()
	for _, k := range []string{GraphAttrMode, GraphAttrMTPLayer, GraphAttrDFlash} {
		if _, ok := ga[k]; ok {
			errs = append(errs, fmt.Errorf("graph: attribute %q is a typed property of the graph (Graph.SetMode, Graph.SetMTPLayer, Graph.SetDFlash), not an attribute", k))
			delete(ga, k)
		}
	}
	for _, e := range checkAttrs(ga, GraphAttrs, "graphs", true) {
		errs = append(errs, fmt.Errorf("graph: %w", e))
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
		if aerrs := checkAttrs(n.Attrs, d.AttrDefs(), fmt.Sprintf("op %s", n.Op), true); len(aerrs) > 0 {
			for _, e := range aerrs {
				errs = append(errs, fmt.Errorf("%s: %w", where, e))
			}
			for _, o := range n.Outputs { // defined, so that readers do not report it again
				def(o, where)
			}
			continue
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

// checkAttrs checks attributes against their declarations (owner: "op
// rmsnorm", "graphs"), in key order: a value of a supported type, declared,
// of the declared type; with required, every required attribute set.
func checkAttrs(a Attrs, decls []AttrDef, owner string, required bool) []error {
	var errs []error
	keys := make([]string, 0, len(a))
	for k := range a {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := a[k]
		if !validAttr(v) {
			errs = append(errs, fmt.Errorf("attribute %q has unsupported type %T", k, v))
			continue
		}
		i := slices.IndexFunc(decls, func(d AttrDef) bool { return d.Name == k })
		if i < 0 {
			names := make([]string, len(decls))
			for j, d := range decls {
				names[j] = d.Name
			}
			errs = append(errs, fmt.Errorf("attribute %q (%s) is not declared for %s (declared: %s)", k, formatAttr(v), owner, strings.Join(names, ", ")))
			continue
		}
		if t := typeOfValue(v); t != decls[i].Type {
			errs = append(errs, fmt.Errorf("attribute %q is %s %s, %s declares it %s", k, t, formatAttr(v), owner, decls[i].Type))
		}
	}
	for _, d := range decls {
		if _, ok := a[d.Name]; required && d.Required && !ok {
			errs = append(errs, fmt.Errorf("required attribute %q (%s) is missing", d.Name, d.Type))
		}
	}
	return errs
}
