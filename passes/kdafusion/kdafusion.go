// Package kdafusion is the kda-projection-fusion pass ("qkvbfg"): per KDA
// layer, the six GEMMs that read the normalized input (q, k, v, b, f_a, g_a)
// become one GEMM against a row-concatenated weight with split outputs, and
// the two low-rank up-projections (f_b, g_b) become one batched GEMM against
// their stacked weights. Where only q/k/v fail eligibility, the partial
// "bfg" form merges b, f_a, g_a and batches f_b/g_b.
package kdafusion

import (
	"fmt"
	"strings"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model/safetensors"
)

// Name is the pass's YAML name.
const Name = "kda-projection-fusion"

// Description is the pass as the registry, the report and `glmflash passes list`
// know it.
var Description = pass.Description{Name: Name, Version: "1.0.0",
	Summary: "fuse each KDA layer's q/k/v/b/f_a/g_a projections into one split GEMM and f_b/g_b into one batched GEMM",
	Verify:  "eligible as on any batch: the fused projections feed the same kda_conv and kda_attn nodes, which keep each verify position's conv window and recurrent state for the rollback",
	Draft:   "no sites: the MTP layer and a DFlash draft graph have no KDA"}

func init() { pass.Register(Description, func() pass.Pass { return &Pass{} }) }

// Options are the pass's options.
type Options struct {
	Form string `option:"form" default:"auto" enum:"auto,full,bfg" doc:"auto: full qkvbfg where eligible, else the bfg form; full or bfg: only that form"`
}

// Stats are the pass's statistics.
type Stats struct {
	Full    int `stat:"full_layers" doc:"layers fused in the full qkvbfg form"`
	Partial int `stat:"bfg_layers" doc:"layers fused in the partial bfg form"`
	GEMMs   int `stat:"gemms_removed" doc:"GEMM nodes removed, net of the split and batched GEMMs added"`
}

// Pass implements pass.Pass.
type Pass struct{ opts Options }

// Options implements pass.WithOptions.
func (p *Pass) Options() any { return &p.opts }

// projections of one KDA layer, by module name.
var modules = []string{"q_proj", "k_proj", "v_proj", "b_proj", "f_a_proj", "g_a_proj", "f_b_proj", "g_b_proj"}

type layerSite struct {
	lin  map[string]*ir.Node // module → linear node
	full bool                // qkvbfg (else bfg)
}

// projections finds the linear nodes of layer l by their weight names.
func projections(g *ir.Graph, l int) map[string]*ir.Node {
	out := map[string]*ir.Node{}
	for _, n := range g.Nodes {
		if n.Layer != l || n.Op != ir.OpLinear || len(n.Inputs) != 2 {
			continue
		}
		ref := n.Inputs[1].WeightRef()
		for _, m := range modules {
			if strings.HasSuffix(ref, ".self_attn."+m+".weight") {
				out[m] = n
			}
		}
	}
	return out
}

func quantClass(dt safetensors.DType) string {
	if dt == safetensors.F8E4M3 {
		return "FP8"
	}
	return dt.String()
}

// Eligible implements pass.Pass: one site per KDA layer.
func (p *Pass) Eligible(g *ir.Graph, a *pass.Analyses, env *pass.Env) []pass.Site {
	var sites []pass.Site
	for _, n := range g.Nodes {
		if n.Op != ir.OpKDAAttn {
			continue
		}
		l := n.Layer
		where := fmt.Sprintf("layer %d", l)
		lin := projections(g, l)
		if len(lin) != len(modules) {
			sites = append(sites, pass.Skip(where, l, "not all eight projections are separate linear nodes (already fused?)"))
			continue
		}
		// The model's KDA heads: a tensor-parallel rank's graph holds
		// heads/TP.Size of them (the rank's shard of q/k/v/b and f_b/g_b,
		// f_a and g_a replicated), which the fused GEMM keeps.
		heads := ir.AttrHeads.Get(n)
		if env.Model != nil {
			heads = env.Model.LinearNumHeads
		}
		if !env.TP.Known {
			sites = append(sites, pass.Skip(where, l, "attention-TP rank/size metadata missing"))
			continue
		}
		if env.TP.Size < 1 || heads%env.TP.Size != 0 {
			sites = append(sites, pass.Skip(where, l, "%d KDA heads not divisible by attention-TP size %d", heads, env.TP.Size))
			continue
		}
		if t, hit := env.LoRAHit(l, modules...); hit {
			sites = append(sites, pass.Skip(where, l, "LoRA adapter %q targets %s", t.Adapter, t.Module))
			continue
		}
		// every q/k/v/b/f_a/g_a must read the same input; f_b/g_b read f_a/g_a
		h := lin["q_proj"].Inputs[0]
		shapeOK := true
		for _, m := range modules[:6] {
			if lin[m].Inputs[0] != h {
				shapeOK = false
			}
		}
		if lin["f_b_proj"].Inputs[0] != lin["f_a_proj"].Outputs[0] || lin["g_b_proj"].Inputs[0] != lin["g_a_proj"].Outputs[0] ||
			len(a.Users(lin["f_a_proj"].Outputs[0])) != 1 || len(a.Users(lin["g_a_proj"].Outputs[0])) != 1 {
			shapeOK = false
		}
		if !shapeOK {
			sites = append(sites, pass.Skip(where, l, "projection dataflow is not the KDA pattern"))
			continue
		}
		cls := map[string]string{}
		for _, m := range modules {
			cls[m] = quantClass(env.WeightDType(lin[m].Inputs[1].WeightRef()))
		}
		qkvSame := cls["q_proj"] == cls["k_proj"] && cls["k_proj"] == cls["v_proj"] && cls["v_proj"] == cls["b_proj"]
		bfgSame := true
		for _, m := range []string{"f_a_proj", "g_a_proj", "f_b_proj", "g_b_proj"} {
			if cls[m] != cls["b_proj"] {
				bfgSame = false
			}
		}
		switch {
		case qkvSame && bfgSame && p.opts.Form != "bfg":
			sites = append(sites, pass.Site{Where: where, Layer: l, OK: true, Note: "full qkvbfg form", Data: &layerSite{lin: lin, full: true}})
		case bfgSame && p.opts.Form != "full":
			note := "partial bfg form"
			if !qkvSame {
				note = fmt.Sprintf("partial bfg form: %s", mismatch(cls, []string{"q_proj", "k_proj", "v_proj", "b_proj"}))
			}
			sites = append(sites, pass.Site{Where: where, Layer: l, OK: true, Note: note, Data: &layerSite{lin: lin}})
		case !bfgSame:
			sites = append(sites, pass.Skip(where, l, "%s", mismatch(cls, modules)))
		default:
			sites = append(sites, pass.Skip(where, l, "only the bfg form applies (%s) and option form=full", mismatch(cls, modules)))
		}
	}
	return sites
}

func mismatch(cls map[string]string, mods []string) string {
	first := cls[mods[0]]
	for _, m := range mods[1:] {
		if cls[m] != first {
			return fmt.Sprintf("%s is %s but %s is %s", mods[0], first, m, cls[m])
		}
	}
	return "projections quantized differently"
}

// Apply implements pass.Pass.
func (p *Pass) Apply(g *ir.Graph, sites []pass.Site) (pass.Result, error) {
	res := pass.Result{}
	var st Stats
	for _, s := range sites {
		ls := s.Data.(*layerSite)
		if err := rewrite(g, s.Layer, ls); err != nil {
			return res, fmt.Errorf("layer %d: %w", s.Layer, err)
		}
		res.Fired++
		if ls.full {
			st.Full++
			st.GEMMs += len(modules) - 2
		} else {
			st.Partial++
			st.GEMMs += 5 - 2 // b, f_a, g_a, f_b, g_b → one split and one batched GEMM
		}
	}
	g.RemoveDead()
	res.Stats = pass.Counters(&st)
	return res, nil
}

func rewrite(g *ir.Graph, l int, ls *layerSite) error {
	lin := ls.lin
	h := lin["q_proj"].Inputs[0]
	merged := []string{"b_proj", "f_a_proj", "g_a_proj"}
	if ls.full {
		merged = []string{"q_proj", "k_proj", "v_proj", "b_proj", "f_a_proj", "g_a_proj"}
	}
	var ws []*ir.Value
	var splits []int
	for _, m := range merged {
		ws = append(ws, lin[m].Inputs[1])
		splits = append(splits, lin[m].Outputs[0].Shape[1])
	}
	// f_a and g_a stay adjacent as one [T, 2·Dh] block for the batched GEMM
	splits[len(splits)-2] += splits[len(splits)-1]
	splits = splits[:len(splits)-1]
	name := "bfg"
	if ls.full {
		name = "qkvbfg"
	}
	cat, err := g.NewNode(ir.OpConcatRows, l, nil, ws...)
	if err != nil {
		return err
	}
	cat.Outputs[0].Named(fmt.Sprintf("l%d.self_attn.%s_proj", l, name))
	split, err := g.NewNode(ir.OpLinearSplit, l, ir.NewAttrs(ir.AttrSplits.Is(splits), ir.AttrFused.Is(name)), h, cat.Outputs[0])
	if err != nil {
		return err
	}
	stk, err := g.NewNode(ir.OpStack, l, nil, lin["f_b_proj"].Inputs[1], lin["g_b_proj"].Inputs[1])
	if err != nil {
		return err
	}
	stk.Outputs[0].Named(fmt.Sprintf("l%d.self_attn.fg_b_proj", l))
	low := split.Outputs[len(split.Outputs)-1]
	bat, err := g.NewNode(ir.OpLinearBatched, l, nil, low, stk.Outputs[0])
	if err != nil {
		return err
	}
	for i, m := range merged[:len(merged)-2] {
		split.Outputs[i].Named(fmt.Sprintf("l%d.self_attn.%s", l, strings.TrimSuffix(m, "_proj")))
		g.ReplaceUses(lin[m].Outputs[0], split.Outputs[i])
	}
	low.Named(fmt.Sprintf("l%d.self_attn.fg_a", l))
	bat.Outputs[0].Named(fmt.Sprintf("l%d.self_attn.f_b", l))
	bat.Outputs[1].Named(fmt.Sprintf("l%d.self_attn.g_b", l))
	g.ReplaceUses(lin["f_b_proj"].Outputs[0], bat.Outputs[0])
	g.ReplaceUses(lin["g_b_proj"].Outputs[0], bat.Outputs[1])
	// insert before the first node being replaced, so every consumer of the
	// new outputs comes after them
	at := len(g.Nodes)
	for _, m := range append(merged, "f_b_proj", "g_b_proj") {
		if i := g.Index(lin[m]); i >= 0 && i < at {
			at = i
		}
	}
	g.InsertAt(at, cat, split, stk, bat)
	return nil
}
