package graph

import (
	"fmt"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/model"
)

// DFlashPrefix prefixes the drafter's tensor names in a DFlash draft
// graph ("dflash.layers.0.self_attn.q_proj.weight"): the engine's weight
// source reads them from the drafter's checkpoint (without the prefix, as
// z-lab's state dict names them) and every other name from the trunk's.
const DFlashPrefix = "dflash."

// BuildDFlash returns the verified forward graph of a DFlash block drafter
// d over the trunk cfg (z-lab's DFlashDraftModel, dflash/model.py). Inputs:
// the block tokens (ir.InputTokens: per sequence exactly d.BlockSize rows,
// its pending token then d.BlockSize−1 mask tokens), the batch, and the
// new context rows (ir.InputContext [C, targets·D], the trunk's
// target-layer hidden rows of the positions committed since the
// sequence's last draft). Then
//
//	ctx = hidden_norm(fc · context)                       (every layer reads it)
//	x   = embed_tokens(tokens)                             (the trunk's embedding)
//	per draft layer l:
//	  h  = input_layernorm(x)
//	  o  = dflash_attn(q_proj·h, k_proj·h, v_proj·h, k_proj·ctx, v_proj·ctx)
//	  x += o_proj · o
//	  x += down_proj · (silu(gate_proj·h') ⊙ up_proj·h'),  h' = post_attention_layernorm(x)
//	logits = lm_head · norm(x)                             (each block's last B−1 rows)
//
// The batch's sequences ask backend.Seq.LogitRows = B−1: the rows after
// the pending token are the drafts' logits. dflash_attn keeps the context
// rows' K/V in the draft store (positions from the store's length), never
// the block's. opts.Mode only labels the graph (default Extend); the
// logits are always span logits; CaptureHidden, FinalHidden, IndexShare
// and TargetLayers do not apply.
func BuildDFlash(cfg *model.Config, d *model.DFlashConfig, opts Options) (*ir.Graph, error) {
	if d == nil {
		return nil, fmt.Errorf("graph: no DFlash drafter configuration")
	}
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("graph: DFlash drafter: %w", err)
	}
	if err := d.CheckTarget(cfg); err != nil {
		return nil, fmt.Errorf("graph: %w", err)
	}
	if opts.CaptureHidden || opts.FinalHidden || opts.IndexShare > 0 || len(opts.TargetLayers) > 0 {
		return nil, fmt.Errorf("graph: the DFlash draft graph takes no hidden-capture, index-share or target-layer options")
	}
	if opts.Logits != "" && opts.Logits != SpanLogits {
		return nil, fmt.Errorf("graph: the DFlash draft graph's logits are span logits (each block's last B−1 rows), not %q", opts.Logits)
	}
	if opts.Mode == ir.ModeUnset {
		opts.Mode = Extend
	}
	opts.Logits = SpanLogits
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	g := ir.New("dflash")
	g.SetMode(opts.Mode)
	g.SetDFlash()
	g.Attrs.Put(ir.GraphAttrLogits.Is(string(SpanLogits)))
	b := &builder{cfg: cfg, g: g, opts: opts}
	D, I := d.HiddenSize, d.IntermediateSize
	Q, KV, hd := d.NumAttentionHeads*d.HeadDim, d.KVWidth(), d.HeadDim
	tokens := g.AddInput(ir.InputTokens, ir.I32, ir.DimT)
	b.batch = g.AddInput(ir.InputBatch, ir.Host)
	context := g.AddInput(ir.InputContext, ir.F32, ir.DimC, d.ContextWidth())
	dw := func(name string, shape ...int) *ir.Value { return g.AddWeight(DFlashPrefix+name, shape...) }
	norm := func(l int, x *ir.Value, weight, name string) *ir.Value {
		return g.Op1(ir.OpRMSNorm, l, ir.NewAttrs(ir.AttrEps.Is(d.RMSNormEps)), x, dw(weight, D)).Named(name)
	}
	lin := func(l int, x *ir.Value, weight string, out, in int, name string) *ir.Value {
		return g.Op1(ir.OpLinear, l, nil, x, dw(weight, out, in)).Named(name)
	}
	ctx := norm(-1, lin(-1, context, "fc.weight", D, d.ContextWidth(), "dflash.fc"), "hidden_norm.weight", "dflash.ctx")
	x := g.Op1(ir.OpEmbed, -1, nil, tokens, b.w("embed_tokens.weight", cfg.VocabSize, D)).Named("dflash.embed")
	for l := 0; l < d.NumHiddenLayers; l++ {
		ln := func(rest string) string { return model.DFlashLayerName(l, rest) }
		nm := func(s string) string { return fmt.Sprintf("dflash.l%d.%s", l, s) }
		h := norm(l, x, ln("input_layernorm.weight"), nm("attn_in"))
		q := lin(l, h, ln("self_attn.q_proj.weight"), Q, D, nm("q"))
		kb := lin(l, h, ln("self_attn.k_proj.weight"), KV, D, nm("k"))
		vb := lin(l, h, ln("self_attn.v_proj.weight"), KV, D, nm("v"))
		kc := lin(l, ctx, ln("self_attn.k_proj.weight"), KV, D, nm("k_ctx"))
		vc := lin(l, ctx, ln("self_attn.v_proj.weight"), KV, D, nm("v_ctx"))
		o := g.Op1(ir.OpDFlashAttn, l, ir.NewAttrs(ir.AttrHeads.Is(d.NumAttentionHeads), ir.AttrKVHeads.Is(d.NumKeyValueHeads), ir.AttrHeadDim.Is(hd),
			ir.AttrEps.Is(d.RMSNormEps), ir.AttrRopeTheta.Is(d.RopeTheta), ir.AttrBlock.Is(d.BlockSize)),
			b.batch, q, kb, vb, kc, vc, dw(ln("self_attn.q_norm.weight"), hd), dw(ln("self_attn.k_norm.weight"), hd)).Named(nm("attn"))
		x = g.Op1(ir.OpAdd, l, nil, x, lin(l, o, ln("self_attn.o_proj.weight"), D, Q, nm("o"))).Named(nm("attn_res"))
		h = norm(l, x, ln("post_attention_layernorm.weight"), nm("ffn_in"))
		gt := lin(l, h, ln("mlp.gate_proj.weight"), I, D, nm("gate"))
		up := lin(l, h, ln("mlp.up_proj.weight"), I, D, nm("up"))
		act := g.Op1(ir.OpSwiGLU, l, ir.NewAttrs(ir.AttrLimit.Is(0.0)), gt, up).Named(nm("act"))
		x = g.Op1(ir.OpAdd, l, nil, x, lin(l, act, ln("mlp.down_proj.weight"), D, I, nm("down"))).Named(nm("ffn_res"))
	}
	y := norm(-1, x, "norm.weight", "dflash.norm")
	b.head(b.lastRows(y))
	return b.verified()
}
