// Package fusion is the shared-expert-fusion pass, shipped as the example
// pass plugin (binary glmflash-pass-shared-expert-fusion, main package one
// folder up). Per MoE layer, the shared expert (a SwiGLU MLP every token
// goes through: three linear nodes and a swiglu, then add(routed, shared))
// becomes one more routed expert that every token selects with weight 1.0:
//
//	gate' = concat_rows(experts.gate [E,I,D], stack(shared.gate) [1,I,D])  → [E+1,I,D]
//	up'   = concat_rows(experts.up   [E,I,D], stack(shared.up)   [1,I,D])  → [E+1,I,D]
//	down' = concat_rows(experts.down [E,D,I], stack(shared.down) [1,D,I])  → [E+1,D,I]
//	idx', w' = moe_append_expert(idx, w) {expert=E}                        → [T,K+1]
//	out = moe_experts(h, idx', w', gate', up', down')
//
// The weights change only through derived-weight const ops (folded once at
// load); no bytes cross the plugin boundary. moe_experts adds a token's
// contributions in ascending expert order (the router sorts each token's
// experts and E is the largest id), so the shared expert is added last,
// exactly like the unfused routed-sum-then-add.
package fusion

import (
	"fmt"
	"slices"
	"strings"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model/safetensors"
)

// Name is the pass's YAML name.
const Name = "shared-expert-fusion"

// Description is what the plugin answers Describe with (its options come
// from the Options struct's tags). The protocol carries no speculation
// statements (Verify, Draft): the engine reports a plugin's pass as stating
// nothing about verify and draft graphs.
var Description = pass.Description{Name: Name, Version: "1.0.0",
	Summary: "fuse each MoE layer's shared expert into the routed experts as an always-selected expert with weight 1.0"}

// Options are the pass's options (declared once: the schema the engine
// shows and checks comes from the tags).
type Options struct {
	Layers []int `option:"layers" doc:"restrict to these MoE layers (empty: every MoE layer)"`
}

// Validate implements pass.Validator.
func (o *Options) Validate() error {
	for _, l := range o.Layers {
		if l < 0 {
			return fmt.Errorf("option layers: layer %d is negative", l)
		}
	}
	return nil
}

// Stats are the pass's statistics.
type Stats struct {
	Layers int `stat:"layers_fused" doc:"MoE layers whose shared expert became a routed one"`
	Nodes  int `stat:"nodes_removed" doc:"shared-expert nodes (linear, swiglu, add) removed"`
}

// Pass implements pass.Pass.
type Pass struct{ opts Options }

// Options implements pass.WithOptions.
func (p *Pass) Options() any { return &p.opts }

// New makes a fresh instance.
func New() pass.Pass { return &Pass{} }

// layer reports whether option layers selects layer l.
func (p *Pass) layer(l int) bool {
	return len(p.opts.Layers) == 0 || slices.Contains(p.opts.Layers, l)
}

// projections of the shared expert.
var projs = []string{"gate_proj", "up_proj", "down_proj"}

// site is one MoE layer's matched pattern.
type site struct {
	experts *ir.Node            // moe_experts
	add     *ir.Node            // add(routed, shared)
	shared  map[string]*ir.Node // gate_proj/up_proj/down_proj linear nodes
	act     *ir.Node            // swiglu
}

// match finds the shared-expert pattern around a moe_experts node.
func match(a *pass.Analyses, ex *ir.Node) (*site, string) {
	routed := ex.Outputs[0]
	us := a.Users(routed)
	if len(us) != 1 || us[0].Op != ir.OpAdd {
		return nil, "no shared expert is added to the routed experts (n_shared_experts = 0, or already fused)"
	}
	add := us[0]
	other := add.Inputs[0]
	if other == routed {
		other = add.Inputs[1]
	}
	s := &site{experts: ex, add: add, shared: map[string]*ir.Node{}}
	down := other.Producer
	if down == nil || down.Op != ir.OpLinear || !isShared(down, "down_proj") || len(a.Users(other)) != 1 {
		return nil, "the other addend is not the shared expert's down_proj"
	}
	s.shared["down_proj"] = down
	act := down.Inputs[0].Producer
	if act == nil || act.Op != ir.OpSwiGLU || len(a.Users(down.Inputs[0])) != 1 {
		return nil, "the shared expert's down_proj does not read a swiglu"
	}
	s.act = act
	for i, pr := range []string{"gate_proj", "up_proj"} {
		n := act.Inputs[i].Producer
		if n == nil || n.Op != ir.OpLinear || !isShared(n, pr) || len(a.Users(act.Inputs[i])) != 1 {
			return nil, fmt.Sprintf("the shared expert's swiglu input %d is not its %s", i, pr)
		}
		if n.Inputs[0] != ex.Inputs[0] {
			return nil, "the shared expert reads a different input than the routed experts"
		}
		s.shared[pr] = n
	}
	return s, ""
}

func isShared(n *ir.Node, proj string) bool {
	return strings.HasSuffix(n.Inputs[1].WeightRef(), ".mlp.shared_experts."+proj+".weight")
}

// quantClass groups dtypes the way kernels care about (FP8 vs the rest by name).
func quantClass(dt safetensors.DType) string {
	if dt == safetensors.F8E4M3 {
		return "FP8"
	}
	return dt.String()
}

// loraHit reports a LoRA target on one of the shared expert's modules:
// "shared_experts" / "mlp.shared_experts" (every projection), a qualified
// "shared_experts.gate_proj", or a bare "gate_proj" (PEFT applies bare
// names to every module with that name, the shared expert's included).
func loraHit(env *pass.Env, l int) (pass.LoRATarget, string, bool) {
	for _, t := range env.LoRA {
		inLayer := len(t.Layers) == 0
		for _, x := range t.Layers {
			inLayer = inLayer || x == l
		}
		if !inLayer {
			continue
		}
		m := strings.TrimPrefix(t.Module, "mlp.")
		if m == "shared_experts" {
			return t, "shared_experts", true
		}
		for _, pr := range projs {
			if m == pr || m == "shared_experts."+pr {
				return t, "shared_experts." + pr, true
			}
		}
	}
	return pass.LoRATarget{}, "", false
}

// Eligible implements pass.Pass: one site per MoE layer.
func (p *Pass) Eligible(g *ir.Graph, a *pass.Analyses, env *pass.Env) []pass.Site {
	var sites []pass.Site
	for _, n := range g.Nodes {
		if n.Op != ir.OpMoEExperts {
			continue
		}
		l := n.Layer
		where := fmt.Sprintf("layer %d", l)
		if !p.layer(l) {
			sites = append(sites, pass.Skip(where, l, "layer %d is not in option layers", l))
			continue
		}
		s, why := match(a, n)
		if s == nil {
			sites = append(sites, pass.Skip(where, l, "%s", why))
			continue
		}
		E, I := n.Inputs[3].Shape[0], n.Inputs[3].Shape[1]
		if si := s.shared["gate_proj"].Inputs[1].Shape[0]; si != I {
			msg := fmt.Sprintf("shared expert width %d differs from a routed expert's %d", si, I)
			if env.Model != nil {
				msg = fmt.Sprintf("shared expert width %d (n_shared_experts %d × moe_intermediate_size %d) differs from a routed expert's %d",
					si, env.Model.NSharedExperts, env.Model.MoEIntermediateSize, I)
			}
			sites = append(sites, pass.Skip(where, l, "%s", msg))
			continue
		}
		if ir.AttrLimit.Get(s.act) != ir.AttrLimit.Get(n) {
			sites = append(sites, pass.Skip(where, l, "the shared expert's SwiGLU clamp %g differs from the routed experts' %g", ir.AttrLimit.Get(s.act), ir.AttrLimit.Get(n)))
			continue
		}
		if t, mod, hit := loraHit(env, l); hit {
			sites = append(sites, pass.Skip(where, l, "LoRA adapter %q targets %s", t.Adapter, mod))
			continue
		}
		if why := quantMismatch(env, n, s); why != "" {
			sites = append(sites, pass.Skip(where, l, "%s", why))
			continue
		}
		sites = append(sites, pass.Site{Where: where, Layer: l, OK: true, Note: fmt.Sprintf("shared expert appended as expert %d", E),
			Nodes: []*ir.Node{n, s.add, s.shared["gate_proj"], s.shared["up_proj"], s.act, s.shared["down_proj"]}, Data: s})
	}
	return sites
}

// quantMismatch says why the shared expert's weights are not stored like the
// routed experts' (empty when they all are).
func quantMismatch(env *pass.Env, ex *ir.Node, s *site) string {
	routed := ""
	routedName := ""
	for i := 3; i <= 5; i++ {
		for _, name := range ex.Inputs[i].LeafNames() {
			c := quantClass(env.WeightDType(name))
			if routed == "" {
				routed, routedName = c, name
			} else if c != routed {
				return fmt.Sprintf("routed experts are quantized differently (%s is %s, %s is %s)", routedName, routed, name, c)
			}
		}
	}
	for _, pr := range projs {
		if c := quantClass(env.WeightDType(s.shared[pr].Inputs[1].WeightRef())); c != routed {
			return fmt.Sprintf("shared_experts.%s is %s but the routed experts are %s", pr, c, routed)
		}
	}
	return ""
}

// Apply implements pass.Pass.
func (p *Pass) Apply(g *ir.Graph, sites []pass.Site) (pass.Result, error) {
	res := pass.Result{}
	for _, st := range sites {
		s, ok := st.Data.(*site)
		if !ok {
			return res, fmt.Errorf("%s: site data missing", st.Where)
		}
		if err := rewrite(g, st.Layer, s); err != nil {
			return res, fmt.Errorf("layer %d: %w", st.Layer, err)
		}
		res.Fired++
	}
	removed := g.RemoveDead()
	res.Stats = pass.Counters(&Stats{Layers: res.Fired, Nodes: removed})
	return res, nil
}

func rewrite(g *ir.Graph, l int, s *site) error {
	ex := s.experts
	E := ex.Inputs[3].Shape[0]
	var nodes []*ir.Node
	newNode := func(op string, attrs ir.Attrs, name string, in ...*ir.Value) (*ir.Node, error) {
		n, err := g.NewNode(op, l, attrs, in...)
		if err != nil {
			return nil, err
		}
		if name != "" {
			n.Outputs[0].Named(name)
		}
		nodes = append(nodes, n)
		return n, nil
	}
	var fused [3]*ir.Value
	for i, pr := range projs {
		st, err := newNode(ir.OpStack, nil, fmt.Sprintf("l%d.mlp.shared_experts.%s.stacked", l, pr), s.shared[pr].Inputs[1])
		if err != nil {
			return err
		}
		cat, err := newNode(ir.OpConcatRows, nil, fmt.Sprintf("l%d.mlp.experts+shared.%s", l, pr), ex.Inputs[3+i], st.Outputs[0])
		if err != nil {
			return err
		}
		fused[i] = cat.Outputs[0]
	}
	app, err := newNode(ir.OpMoEAppendExpert, ir.NewAttrs(ir.AttrExpert.Is(E)), "", ex.Inputs[1], ex.Inputs[2])
	if err != nil {
		return err
	}
	app.Outputs[0].Named(fmt.Sprintf("l%d.moe.idx+shared", l))
	app.Outputs[1].Named(fmt.Sprintf("l%d.moe.w+shared", l))
	out, err := newNode(ir.OpMoEExperts, ex.Attrs.Clone(), fmt.Sprintf("l%d.moe.out", l), ex.Inputs[0], app.Outputs[0], app.Outputs[1], fused[0], fused[1], fused[2])
	if err != nil {
		return err
	}
	g.ReplaceUses(s.add.Outputs[0], out.Outputs[0])
	// the new nodes read only values defined before the routed experts
	at := g.Index(ex)
	if at < 0 {
		return fmt.Errorf("moe_experts node not in the graph")
	}
	g.InsertAt(at, nodes...)
	return nil
}
