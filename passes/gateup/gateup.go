// Package gateup is the mlp-gate-up-fusion pass: in every SwiGLU MLP (the
// dense MLP layers and the MoE layers' shared experts), the gate and up
// projections, two GEMMs reading the same input, become one GEMM against
// their row-concatenated weights whose [T, 2I] output feeds swiglu_packed:
//
//	g = linear(h, W_gate); u = linear(h, W_up); a = swiglu(g, u)
//	→ gu = linear(h, concat_rows(W_gate, W_up)); a = swiglu_packed(gu)
//
// It is the worked example of ARCHITECTURE.md ("adding a pass"), and off in
// the built-in configuration.
package gateup

import (
	"fmt"
	"strings"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model/safetensors"
)

// Name is the pass's YAML name.
const Name = "mlp-gate-up-fusion"

// Description is the pass as the registry, the report and `glmflash passes list`
// know it.
var Description = pass.Description{Name: Name, Version: "1.0.0",
	Summary: "fuse each SwiGLU MLP's gate and up projections into one GEMM feeding swiglu_packed",
	Verify:  "eligible as on any batch: gate and up read the same rows whatever the span",
	Draft:   "eligible for the MTP layer's shared experts (with option shared_experts); the MTP layer has no dense MLP; eligible for every DFlash draft layer's SwiGLU MLP (z-lab's Qwen3MLP: gate_proj and up_proj read the same rows)"}

func init() { pass.Register(Description, func() pass.Pass { return &Pass{} }) }

// Options are the pass's options.
type Options struct {
	Shared bool `option:"shared_experts" default:"true" doc:"also fuse the MoE layers' shared experts (else dense MLP layers only)"`
}

// Stats are the pass's statistics.
type Stats struct {
	MLPs  int `stat:"mlps_fused" doc:"MLPs whose gate and up projections became one GEMM"`
	GEMMs int `stat:"gemms_removed" doc:"GEMM nodes removed"`
}

// Pass implements pass.Pass.
type Pass struct{ opts Options }

// Options implements pass.WithOptions.
func (p *Pass) Options() any { return &p.opts }

// site is one MLP: its gate and up linear nodes and their swiglu.
type site struct {
	gate, up, act *ir.Node
}

// module is the checkpoint module a projection's weight belongs to
// ("mlp" or "mlp.shared_experts"), and its projection ("gate_proj").
func module(n *ir.Node) (mod, proj string) {
	ref := strings.TrimSuffix(n.Inputs[1].WeightRef(), ".weight")
	i := strings.LastIndex(ref, ".")
	if i < 0 {
		return "", ""
	}
	j := strings.Index(ref, ".mlp")
	if j < 0 {
		return "", ref[i+1:]
	}
	return ref[j+1 : i], ref[i+1:]
}

// Eligible implements pass.Pass: one site per swiglu node.
func (p *Pass) Eligible(g *ir.Graph, a *pass.Analyses, env *pass.Env) []pass.Site {
	var sites []pass.Site
	for _, n := range g.Nodes {
		if n.Op != ir.OpSwiGLU {
			continue
		}
		l := n.Layer
		gate, up := n.Inputs[0].Producer, n.Inputs[1].Producer
		where := fmt.Sprintf("layer %d mlp", l)
		if gate == nil || up == nil || gate.Op != ir.OpLinear || up.Op != ir.OpLinear {
			sites = append(sites, pass.Skip(where, l, "gate and up are not separate linear nodes (already fused?)"))
			continue
		}
		mod, gp := module(gate)
		umod, upp := module(up)
		if mod != "" {
			where = fmt.Sprintf("layer %d %s", l, mod)
		}
		switch {
		case gp != "gate_proj" || upp != "up_proj" || mod != umod:
			sites = append(sites, pass.Skip(where, l, "the inputs are not one module's gate_proj and up_proj"))
		case strings.Contains(mod, "shared_experts") && !p.opts.Shared:
			sites = append(sites, pass.Skip(where, l, "shared expert (option shared_experts=false)"))
		case gate.Inputs[0] != up.Inputs[0]:
			sites = append(sites, pass.Skip(where, l, "gate and up read different inputs"))
		case len(a.Users(gate.Outputs[0])) != 1 || len(a.Users(up.Outputs[0])) != 1 || a.IsOutput(gate.Outputs[0]) || a.IsOutput(up.Outputs[0]):
			sites = append(sites, pass.Skip(where, l, "the gate or up projection has another reader"))
		case quant(env, gate) != quant(env, up):
			sites = append(sites, pass.Skip(where, l, "gate_proj is %s but up_proj is %s", quant(env, gate), quant(env, up)))
		case hitsLoRA(env, l, "gate_proj", "up_proj", mod+".gate_proj", mod+".up_proj"):
			sites = append(sites, pass.Skip(where, l, "a LoRA adapter targets gate_proj or up_proj"))
		default:
			sites = append(sites, pass.Site{Where: where, Layer: l, OK: true, Nodes: []*ir.Node{gate, up, n}, Data: &site{gate: gate, up: up, act: n}})
		}
	}
	return sites
}

// quant is how a projection's weight is stored (FP8 and BF16 weights go to
// different kernels; a concatenation must not mix them).
func quant(env *pass.Env, n *ir.Node) safetensors.DType {
	return env.WeightDType(n.Inputs[1].WeightRef())
}

func hitsLoRA(env *pass.Env, l int, modules ...string) bool {
	_, hit := env.LoRAHit(l, modules...)
	return hit
}

// Apply implements pass.Pass.
func (p *Pass) Apply(g *ir.Graph, sites []pass.Site) (pass.Result, error) {
	var st Stats
	for _, s := range sites {
		m := s.Data.(*site)
		h := m.gate.Inputs[0]
		cat, err := g.NewNode(ir.OpConcatRows, s.Layer, nil, m.gate.Inputs[1], m.up.Inputs[1])
		if err != nil {
			return pass.Result{}, err
		}
		base := strings.TrimSuffix(m.gate.Outputs[0].Name, "gate_proj")
		cat.Outputs[0].Named(base + "gate_up_proj.weight")
		gu, err := g.NewNode(ir.OpLinear, s.Layer, nil, h, cat.Outputs[0])
		if err != nil {
			return pass.Result{}, err
		}
		gu.Outputs[0].Named(base + "gate_up")
		act, err := g.NewNode(ir.OpSwiGLUPacked, s.Layer, m.act.Attrs.Clone(), gu.Outputs[0])
		if err != nil {
			return pass.Result{}, err
		}
		act.Outputs[0].Named(m.act.Outputs[0].Name)
		g.ReplaceUses(m.act.Outputs[0], act.Outputs[0])
		at := min(g.Index(m.gate), g.Index(m.up))
		g.InsertAt(at, cat, gu, act)
		g.Remove(m.gate, m.up, m.act)
		st.MLPs++
		st.GEMMs++
	}
	g.RemoveDead()
	return pass.Result{Fired: st.MLPs, Stats: pass.Counters(&st)}, nil
}
