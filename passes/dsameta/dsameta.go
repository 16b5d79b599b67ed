// Package dsameta is the dsa-pooled-metadata pass: instead of every DSA
// layer deriving its own batch metadata (key lengths, visible complete
// pools per query, tails, the write plan of pools this batch completes),
// one metadata node per DSA geometry is hoisted to the batch prologue and
// read by every DSA layer.
package dsameta

import (
	"fmt"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
)

// Name is the pass's YAML name.
const Name = "dsa-pooled-metadata"

// Description is the pass as the registry, the report and `glmflash passes list`
// know it.
var Description = pass.Description{Name: Name, Version: "1.0.0",
	Summary: "build the DSA/k-pool batch metadata once per batch and share it across DSA layers",
	Verify:  "eligible: a verify span's keys and visible pools are the batch's like any span's (what its rejected drafts write is cut back by the store), so one metadata node serves every DSA layer",
	Draft:   "eligible: the MTP layer is the graph's only DSA layer and attends over the MTP store's own lengths, which are its batch's; it never shares metadata with the trunk's layers; a DFlash draft graph has no DSA layer: no sites"}

func init() { pass.Register(Description, func() pass.Pass { return &Pass{} }) }

// Pass implements pass.Pass.
type Pass struct{}

// Stats are the pass's statistics.
type Stats struct {
	Removed int `stat:"meta_nodes_removed" doc:"per-layer dsa_meta nodes replaced by the shared one"`
}

type geometry struct {
	kpool, topk int
	source      *ir.Value
}

func (g geometry) String() string { return fmt.Sprintf("kpool %d, top-k %d", g.kpool, g.topk) }

// Eligible implements pass.Pass: one site per DSA layer's metadata node.
func (*Pass) Eligible(g *ir.Graph, a *pass.Analyses, env *pass.Env) []pass.Site {
	var sites []pass.Site
	var first *geometry
	for _, n := range g.Nodes {
		if n.Op != ir.OpDSAMeta || n.Layer < 0 {
			continue
		}
		l := n.Layer
		where := fmt.Sprintf("layer %d", l)
		geo := geometry{kpool: ir.AttrKPool.Get(n), topk: ir.AttrTopK.Get(n), source: n.Inputs[0]}
		switch {
		case geo.kpool <= 1:
			sites = append(sites, pass.Skip(where, l, "kpool %d ≤ 1: no pools to share", geo.kpool))
			continue
		case geo.topk%geo.kpool != 0:
			sites = append(sites, pass.Skip(where, l, "top-k %d not divisible by kpool %d", geo.topk, geo.kpool))
			continue
		case ir.AttrLengthsFrom.Get(n) != ir.LengthsBatch:
			sites = append(sites, pass.Skip(where, l, "attends over different lengths (%s)", ir.AttrLengthsFrom.Get(n)))
			continue
		}
		if first == nil {
			first = &geo
		} else if geo.kpool != first.kpool || geo.topk != first.topk || geo.source != first.source {
			sites = append(sites, pass.Skip(where, l, "geometry (%s) differs from the hoisted metadata (%s)", geo, first))
			continue
		}
		sites = append(sites, pass.Site{Where: where, Layer: l, OK: true, Nodes: []*ir.Node{n}})
	}
	return sites
}

// Apply implements pass.Pass.
func (*Pass) Apply(g *ir.Graph, sites []pass.Site) (pass.Result, error) {
	first := sites[0].Nodes[0]
	hoisted, err := g.NewNode(ir.OpDSAMeta, -1, first.Attrs.Clone(), first.Inputs[0])
	if err != nil {
		return pass.Result{}, err
	}
	hoisted.Outputs[0].Named("dsa_meta.shared")
	var old []*ir.Node
	for _, s := range sites {
		n := s.Nodes[0]
		g.ReplaceUses(n.Outputs[0], hoisted.Outputs[0])
		old = append(old, n)
	}
	// prologue: right after the lengths source is defined
	at := 0
	if p := first.Inputs[0].Producer; p != nil {
		at = g.Index(p) + 1
	}
	g.InsertAt(at, hoisted)
	g.Remove(old...)
	return pass.Result{Fired: len(sites), Notes: []string{fmt.Sprintf("one metadata node serves %d DSA layers", len(sites))},
		Stats: pass.Counters(&Stats{Removed: len(old) - 1})}, nil
}
