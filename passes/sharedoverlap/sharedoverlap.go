// Package sharedoverlap is the moe-shared-overlap pass: in every MoE layer
// the shared expert (a SwiGLU MLP every token goes through) depends only on
// the layer's input h, not on the routing, so it is marked to run on a side
// stream (ir.AttrStream) and moved right after h's producer:
//
//	logits = linear(h, gate); idx, w = moe_route(logits); r = moe_experts(h, idx, w, …)
//	s = down(swiglu(gate(h), up(h)))                      (stream 1, issued first)
//	out = add(r, s)                                      (joins the side stream)
//
// On the CUDA backend the shared expert's GEMVs then run beside the router
// and the routed experts (at decode the router's top-k and the expert plan
// are one-block kernels that leave the GPU's bandwidth idle); captured into
// a CUDA graph, the branch becomes parallel graph nodes. Every node computes
// what it did before, from the same inputs, so results are bit for bit the
// same; backends without streams (cpu) run the nodes in the new order.
package sharedoverlap

import (
	"fmt"
	"strings"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
)

// Name is the pass's YAML name.
const Name = "moe-shared-overlap"

// Description is the pass as the registry, the report and `glmflash passes list`
// know it.
var Description = pass.Description{Name: Name, Version: "1.0.0",
	Summary: "run each MoE layer's shared expert on a side stream, beside the router and the routed experts (CUDA; same results)",
	Verify:  "eligible as on any batch: the shared expert reads the same rows as the router whatever the span",
	Draft:   "eligible for the MTP layer's MoE shared expert; a DFlash draft graph has no MoE: no sites"}

func init() { pass.Register(Description, func() pass.Pass { return &Pass{} }) }

// Stats are the pass's statistics.
type Stats struct {
	Layers int `stat:"layers_overlapped" doc:"MoE layers whose shared expert runs on the side stream"`
	Nodes  int `stat:"side_nodes" doc:"nodes marked for the side stream (linear, swiglu)"`
}

// Pass implements pass.Pass.
type Pass struct{}

// site is one MoE layer's shared expert: its nodes in graph order (the
// projections reading h, the activation, the down projection) and the
// derived-weight nodes they read.
type site struct {
	h      *ir.Value
	chain  []*ir.Node
	consts []*ir.Node
}

// Eligible implements pass.Pass: one site per MoE layer (moe_experts).
func (*Pass) Eligible(g *ir.Graph, a *pass.Analyses, env *pass.Env) []pass.Site {
	var sites []pass.Site
	for _, ex := range g.Nodes {
		if ex.Op != ir.OpMoEExperts {
			continue
		}
		l := ex.Layer
		where := fmt.Sprintf("layer %d moe", l)
		var down *ir.Node
		for _, u := range a.Users(ex.Outputs[0]) {
			if u.Op == ir.OpAdd && len(u.Inputs) == 2 && u.Inputs[0] == ex.Outputs[0] {
				if p := u.Inputs[1].Producer; p != nil && p.Op == ir.OpLinear && strings.Contains(p.Inputs[1].WeightRef(), "shared_experts.down_proj") {
					down = p
				}
			}
		}
		if down == nil {
			sites = append(sites, pass.Skip(where, l, "no separate shared expert (n_shared_experts is 0, or it was fused into the routed experts)"))
			continue
		}
		s, reason := match(g, a, ex.Inputs[0], down)
		if reason != "" {
			sites = append(sites, pass.Skip(where, l, "%s", reason))
			continue
		}
		sites = append(sites, pass.Site{Where: where, Layer: l, OK: true, Nodes: s.chain, Data: s,
			Note: fmt.Sprintf("%d nodes on the side stream", len(s.chain))})
	}
	return sites
}

// match walks the shared expert back from its down projection: the
// activation (swiglu of two linears, or swiglu_packed of one) whose
// projections read h, each node read only inside the expert.
func match(g *ir.Graph, a *pass.Analyses, h *ir.Value, down *ir.Node) (*site, string) {
	if h.Producer == nil {
		return nil, "the MoE input is a graph input"
	}
	act := down.Inputs[0].Producer
	if act == nil || (act.Op != ir.OpSwiGLU && act.Op != ir.OpSwiGLUPacked) {
		return nil, "the shared expert's down_proj does not read a swiglu"
	}
	var projs []*ir.Node
	for _, in := range act.Inputs {
		pr := in.Producer
		if pr == nil || pr.Op != ir.OpLinear || pr.Inputs[0] != h {
			return nil, "a shared-expert projection is not a linear of the MoE input"
		}
		projs = append(projs, pr)
	}
	s := &site{h: h}
	for _, n := range append(projs, act, down) {
		if ir.AttrStream.Get(n) != 0 {
			return nil, "already on a side stream"
		}
		s.chain = append(s.chain, n)
	}
	for _, n := range s.chain[:len(s.chain)-1] {
		for _, o := range n.Outputs {
			if a.IsOutput(o) {
				return nil, "a shared-expert value is a graph output"
			}
			for _, u := range a.Users(o) {
				if u != act && u != down {
					return nil, fmt.Sprintf("%s is read outside the shared expert", o.Name)
				}
			}
		}
	}
	for _, n := range projs {
		if w := n.Inputs[1]; w.Producer != nil {
			s.consts = append(s.consts, w.Producer)
		}
	}
	if g.Index(h.Producer) < 0 {
		return nil, "the MoE input's producer is not in the graph"
	}
	return s, ""
}

// Apply implements pass.Pass: the sites' nodes move right after h's
// producer (derived weights first) and are marked for stream 1.
func (*Pass) Apply(g *ir.Graph, sites []pass.Site) (pass.Result, error) {
	var st Stats
	for _, s := range sites {
		m := s.Data.(*site)
		moved := append(append([]*ir.Node{}, m.consts...), m.chain...)
		g.Remove(moved...)
		for _, n := range m.chain {
			n.Attrs = n.Attrs.Clone() // never a map another node shares
			ir.AttrStream.Set(n, 1)
		}
		g.InsertAt(g.Index(m.h.Producer)+1, moved...)
		st.Layers++
		st.Nodes += len(m.chain)
	}
	return pass.Result{Fired: st.Layers, Stats: pass.Counters(&st)}, nil
}
