// Package mhcfusion is the mhc-post-pre-fusion pass: at a boundary between
// two sub-layers, the mHC post of the first (expand into the residual
// streams) and the mHC pre of the next (mixing, Sinkhorn, collapse, and
// optionally the following RMSNorm) become one fused step that computes
// the next pre's statistics in the same sweep that writes the streams.
// Intra-layer boundaries (attention → FFN) and cross-layer boundaries
// (layer i's FFN → layer i+1's attention) are options.
package mhcfusion

import (
	"fmt"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
)

// Name is the pass's YAML name.
const Name = "mhc-post-pre-fusion"

// Description is the pass as the registry, the report and `glmflash passes list`
// know it.
var Description = pass.Description{Name: Name, Version: "1.0.0",
	Summary: "fuse each mHC post with the next mHC pre (and its RMSNorm) at sub-layer boundaries",
	Verify:  "eligible as on any batch: the MTP drafter reads the final hidden row (after the stream mean and the final norm), not a residual between sublayers, and the terminal layer stays unfused; a DFlash drafter's target-layer rows (stream_mean after a layer) read the fused node's streams, so its boundaries fuse too",
	Draft:   "no sites: the MTP layer and a DFlash draft graph have no mHC"}

func init() { pass.Register(Description, func() pass.Pass { return &Pass{} }) }

// Options are the pass's options.
type Options struct {
	Intra     bool `option:"intra_layer" default:"true" doc:"fuse attention → FFN boundaries inside a layer"`
	Cross     bool `option:"cross_layer" default:"true" doc:"fuse layer i FFN → layer i+1 attention boundaries"`
	Norm      bool `option:"fuse_norm" default:"true" doc:"also apply the next sub-layer's RMSNorm in the fused step"`
	MaxTokens int  `option:"max_tokens" default:"0" doc:"decline (run unfused) for batches above this many tokens; 0 = no cap"`
}

// Validate implements pass.Validator.
func (o *Options) Validate() error {
	if o.MaxTokens < 0 {
		return fmt.Errorf("option max_tokens must be ≥ 0, got %d", o.MaxTokens)
	}
	return nil
}

// Stats are the pass's statistics.
type Stats struct {
	Intra int `stat:"intra_layer_fused" doc:"attention → FFN boundaries fused"`
	Cross int `stat:"cross_layer_fused" doc:"layer → next layer boundaries fused"`
	Norms int `stat:"norms_fused" doc:"RMSNorms folded into the fused step"`
}

// Pass implements pass.Pass.
type Pass struct{ opts Options }

// Options implements pass.WithOptions.
func (p *Pass) Options() any { return &p.opts }

type boundary struct {
	post, pre, norm *ir.Node
}

// Eligible implements pass.Pass: one site per mHC post.
func (p *Pass) Eligible(g *ir.Graph, a *pass.Analyses, env *pass.Env) []pass.Site {
	var sites []pass.Site
	for _, n := range g.Nodes {
		if n.Op != ir.OpMHCPost {
			continue
		}
		l := n.Layer
		site := ir.AttrSite.Get(n)
		X := n.Outputs[0]
		var pre *ir.Node
		for _, u := range a.Users(X) {
			if u.Op == ir.OpMHCPre && u.Inputs[0] == X {
				pre = u
			}
		}
		cross := site == "ffn"
		where := fmt.Sprintf("layer %d attn → ffn", l)
		if cross {
			where = fmt.Sprintf("layer %d ffn → layer %d attn", l, l+1)
		}
		switch {
		case pre == nil && cross:
			sites = append(sites, pass.Skip(fmt.Sprintf("layer %d ffn → final", l), l, "terminal layer: its post is applied and the streams are averaged"))
			continue
		case pre == nil:
			sites = append(sites, pass.Skip(where, l, "no mHC pre reads this post's streams"))
			continue
		case cross && !p.opts.Cross:
			sites = append(sites, pass.Skip(where, l, "cross-layer fusion disabled (option cross_layer=false)"))
			continue
		case !cross && !p.opts.Intra:
			sites = append(sites, pass.Skip(where, l, "intra-layer fusion disabled (option intra_layer=false)"))
			continue
		case cross && env.CaptureHidden[l]:
			sites = append(sites, pass.Skip(where, l, "hidden-state capture requested after layer %d: the residual must be materialized", l))
			continue
		case a.IsOutput(X) && cross:
			sites = append(sites, pass.Skip(where, l, "the residual after layer %d is a graph output (observed)", l))
			continue
		case n.Inputs[1].Shape[1] != pre.Inputs[0].Shape[1]:
			sites = append(sites, pass.Skip(where, l, "hc_mult mismatch"))
			continue
		}
		b := &boundary{post: n, pre: pre}
		if p.opts.Norm {
			h := pre.Outputs[0]
			us := a.Users(h)
			if len(us) == 1 && us[0].Op == ir.OpRMSNorm && us[0].Inputs[0] == h {
				b.norm = us[0]
			}
		}
		note := ""
		if p.opts.MaxTokens > 0 {
			note = fmt.Sprintf("declines above %d tokens", p.opts.MaxTokens)
		}
		sites = append(sites, pass.Site{Where: where, Layer: l, OK: true, Note: note, Data: b})
	}
	return sites
}

// Apply implements pass.Pass.
func (p *Pass) Apply(g *ir.Graph, sites []pass.Site) (pass.Result, error) {
	var st Stats
	for _, s := range sites {
		b := s.Data.(*boundary)
		if ir.AttrSite.Get(b.post) == "ffn" {
			st.Cross++
		} else {
			st.Intra++
		}
		post, pre := b.post, b.pre
		attrs := pre.Attrs.Clone()
		attrs.Put(ir.AttrPostSite.Is(ir.AttrSite.Get(post)))
		if p.opts.MaxTokens > 0 {
			attrs.Put(ir.AttrMaxTokens.Is(p.opts.MaxTokens))
		}
		ins := append([]*ir.Value{}, post.Inputs...)
		ins = append(ins, pre.Inputs[1:]...)
		if b.norm != nil {
			ins = append(ins, b.norm.Inputs[1])
			attrs.Put(ir.AttrNormEps.Is(ir.AttrEps.Get(b.norm)))
		}
		fused, err := g.NewNode(ir.OpMHCPostPre, pre.Layer, attrs, ins...)
		if err != nil {
			return pass.Result{}, err
		}
		fused.Outputs[0].Named(post.Outputs[0].Name)
		g.ReplaceUses(post.Outputs[0], fused.Outputs[0])
		h := pre.Outputs[0]
		if b.norm != nil {
			fused.Outputs[1].Named(b.norm.Outputs[0].Name)
			g.ReplaceUses(b.norm.Outputs[0], fused.Outputs[1])
		} else {
			fused.Outputs[1].Named(h.Name)
			g.ReplaceUses(h, fused.Outputs[1])
		}
		fused.Outputs[2].Named(pre.Outputs[1].Name)
		fused.Outputs[3].Named(pre.Outputs[2].Name)
		g.ReplaceUses(pre.Outputs[1], fused.Outputs[2])
		g.ReplaceUses(pre.Outputs[2], fused.Outputs[3])
		g.InsertAt(g.Index(post), fused)
		rm := []*ir.Node{post, pre}
		if b.norm != nil {
			rm = append(rm, b.norm)
			st.Norms++
		}
		g.Remove(rm...)
	}
	return pass.Result{Fired: len(sites), Stats: pass.Counters(&st)}, nil
}
