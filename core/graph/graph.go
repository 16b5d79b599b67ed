// Package graph assembles the GLM-5.3-Flash forward pass as an IR graph
// from a model configuration: embedding into H residual streams, per layer
// mHC pre → RMSNorm → KDA or DSA/MLA → mHC post → mHC pre → RMSNorm → dense
// MLP or MoE → mHC post, then the stream mean, final norm and LM head
// (Build); and the MTP (NextN) draft layer's forward (BuildMTP).
package graph

import (
	"fmt"
	"math"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/model"
)

// Mode is the kind of batch a graph is built for (ir.Mode, the graph's
// typed property).
type Mode = ir.Mode

// Batch modes (see ir.Mode).
const (
	Prefill = ir.ModePrefill // fresh sequences, many tokens each (chunked KDA)
	Decode  = ir.ModeDecode  // one token per sequence on an existing cache (recurrent KDA)
	Extend  = ir.ModeExtend  // several tokens per sequence on an existing cache (chunked KDA)
	Mixed   = ir.ModeMixed   // any mix; KDA picks per sequence (continuous batching)
	// Verify is a continuous batch holding speculative verify spans beside
	// decode and prefill spans (ir.ModeVerify).
	Verify = ir.ModeVerify
)

// ParseMode validates a mode name.
func ParseMode(s string) (Mode, error) { return ir.ParseMode(s) }

// Logits says which rows get logits.
type Logits string

// Logit row selections.
const (
	AllLogits  Logits = "all"  // one row per token (evaluation, scoring)
	LastLogits Logits = "last" // one row per sequence (generation)
	// SpanLogits: each sequence's last backend.Seq.LogitRows rows (one by
	// default): a verify span's last token and every draft, one row for a
	// decode or prefill span, every row for a scored prompt.
	SpanLogits Logits = "spans"
)

// Options select what to build.
type Options struct {
	Mode   Mode
	Logits Logits
	// CaptureHidden adds graph outputs "hidden.L" with the residual streams
	// after each decoder layer (for locating divergences).
	CaptureHidden bool
	// FinalHidden adds the output ir.OutputFinalHidden: for every token
	// (whatever Logits selects) the final hidden state after the stream
	// mean and the final norm, the row lm_head reads and the MTP layer's h.
	FinalHidden bool
	// IndexShare (MTP graphs) turns index_share_for_mtp_iteration on for
	// up to IndexShare draft steps: a Decode graph (a draft step) reuses the
	// selection its slot saved and skips the indexer's scoring, any other
	// mode (the draft extend whose last row is draft step 0) saves each
	// sequence's last selection. 0: every step runs the indexer.
	IndexShare int
	// TargetLayers (trunk graphs), when not empty, adds the output
	// ir.OutputTargetHidden: for every token the hidden rows after each of
	// these decoder layers, concatenated in this order — a DFlash drafter's
	// context rows (its target_layer_ids). GLM's layers carry H residual
	// streams: each layer's row is their unweighted mean (stream_mean), the
	// collapse the final hidden gets before the final norm (architecture
	// §3.9), unnormalized as z-lab reads a Qwen3 target's hidden states.
	TargetLayers []int
	// TP, when its Size is above 1, builds rank TP.Rank's shard of a
	// tensor-parallel graph (docs/tensor-parallel.md): KDA heads (with
	// their conv channels and gates), MLA heads, the dense MLP, the shared
	// expert and every routed expert (along the intermediate dimension),
	// the embedding and lm_head (by vocabulary) are split over the ranks,
	// an all_reduce follows every attention output, MLP/MoE output and the
	// embedding, the logits are all-gathered; mHC, the router, the MLA
	// latent projections and the indexer are replicated. CheckTP says
	// whether a model can be split so.
	TP Shard
}

// Shard is one rank of a tensor-parallel group of Size ranks (Size 0 or
// 1: one device).
type Shard struct{ Size, Rank int }

// ranks is the group size (1 for one device).
func (s Shard) ranks() int { return max(s.Size, 1) }

// CheckTP reports why cfg cannot be split over n tensor-parallel ranks
// (nil when it can): every sharded dimension must divide by n. Errors name
// the model field and parallel.tp_size.
func CheckTP(cfg *model.Config, n int) error {
	if n <= 1 {
		return nil
	}
	dims := []struct {
		field string
		v     int
	}{
		{"linear_attn_config.num_heads (KDA heads)", cfg.LinearNumHeads},
		{"num_attention_heads (MLA heads)", cfg.NumAttentionHeads},
		{"index_n_heads (indexer heads)", cfg.IndexNHeads},
		{"intermediate_size (dense MLP)", cfg.IntermediateSize},
		{"moe_intermediate_size (routed and shared experts)", cfg.MoEIntermediateSize},
		{"vocab_size (embedding and lm_head)", cfg.VocabSize},
	}
	for _, d := range dims {
		if d.v%n != 0 {
			return fmt.Errorf("parallel.tp_size %d does not divide the model's %s, %d", n, d.field, d.v)
		}
	}
	return nil
}

// ShardConfig is the configuration one rank's cache store is sized by: cfg
// with the KDA and MLA heads divided by the ranks (their per-head state is
// split; the MLA latent and the indexer's pooled keys are replicated).
func ShardConfig(cfg *model.Config, n int) *model.Config {
	if n <= 1 {
		return cfg
	}
	c := *cfg
	c.LinearNumHeads /= n
	c.NumAttentionHeads /= n
	c.NumKeyValueHeads /= n
	return &c
}

func (o *Options) checkTP(cfg *model.Config) error {
	if o.TP.Size < 0 || o.TP.Rank < 0 || o.TP.Rank >= o.TP.ranks() {
		return fmt.Errorf("graph: tensor-parallel rank %d of %d is not a rank of the group", o.TP.Rank, o.TP.Size)
	}
	return CheckTP(cfg, o.TP.ranks())
}

const prefix = "model.language_model."

type builder struct {
	cfg   *model.Config
	g     *ir.Graph
	batch *ir.Value
	// lens is the executor-produced per-sequence lengths that KDA and DSA
	// nodes read (the host-length-reuse pass rewires them to batch).
	lens *ir.Value
	opts Options
	// pending holds the post and comb values of the last mhc_pre, consumed
	// by the matching mhc_post.
	pending []*ir.Value
	// shards counts the slice_dim nodes at the graph's head.
	shards int
}

func (b *builder) w(name string, shape ...int) *ir.Value { return b.g.AddWeight(prefix+name, shape...) }

// ws is weight name (of its full shape) cut to this rank's shard along
// axis: the rank's 1/N of the axis, a derived weight folded at load.
func (b *builder) ws(name string, axis int, shape ...int) *ir.Value {
	return b.shard(b.w(name, shape...), axis)
}

func (b *builder) shard(w *ir.Value, axis int) *ir.Value {
	n := b.opts.TP.ranks()
	if n == 1 {
		return w
	}
	per := w.Shape[axis] / n
	lo := b.opts.TP.Rank * per
	// Shards lead the graph (they read weights only), so that a pass
	// inserting a node before the first of the nodes it replaces (a fused
	// GEMM over several shards) finds every shard defined.
	nd, err := b.g.NewNode(ir.OpSliceDim, -1, ir.NewAttrs(ir.AttrAxis.Is(axis), ir.AttrStart.Is(lo), ir.AttrEnd.Is(lo+per)), w)
	if err != nil {
		panic(fmt.Sprintf("graph: shard of %s: %v (CheckTP should have refused the model)", w.Name, err))
	}
	b.g.InsertAt(b.shards, nd)
	b.shards++
	return nd.Outputs[0].Named(fmt.Sprintf("%s.tp%d", w.Name, b.opts.TP.Rank))
}

// reduce sums a rank's partial x over the ranks (x itself on one device).
func (b *builder) reduce(l int, x *ir.Value, name string) *ir.Value {
	n := b.opts.TP.ranks()
	if n == 1 {
		return x
	}
	return b.g.Op1(ir.OpAllReduce, l, ir.NewAttrs(ir.AttrRanks.Is(n)), x).Named(name)
}

// embed is the token embedding (streams H, or plain rows when H is 0),
// vocabulary-sharded and all-reduced under tensor parallelism.
func (b *builder) embed(tokens *ir.Value, H int, name string) *ir.Value {
	cfg := b.cfg
	attrs := ir.NewAttrs()
	if H > 0 {
		attrs.Put(ir.AttrStreams.Is(H))
	}
	w := b.ws("embed_tokens.weight", 0, cfg.VocabSize, cfg.HiddenSize)
	if n := b.opts.TP.ranks(); n > 1 {
		attrs.Put(ir.AttrVocabStart.Is(b.opts.TP.Rank * cfg.VocabSize / n))
	}
	x := b.g.Op1(ir.OpEmbed, -1, attrs, tokens, w).Named(name)
	return b.reduce(-1, x, name+".sum")
}

func layerName(l int, rest string) string { return fmt.Sprintf("layers.%d.%s", l, rest) }

func (o *Options) defaults() error {
	if o.Mode == ir.ModeUnset {
		o.Mode = Mixed
	}
	if !o.Mode.Valid() {
		return fmt.Errorf("unknown mode %s (want prefill, decode, extend, mixed or verify)", o.Mode)
	}
	if o.Logits == "" {
		o.Logits = LastLogits
		if o.Mode == Verify {
			o.Logits = SpanLogits
		}
	}
	if o.Logits != AllLogits && o.Logits != LastLogits && o.Logits != SpanLogits {
		return fmt.Errorf("unknown logits selection %q (want all, last or spans)", o.Logits)
	}
	if o.IndexShare < 0 {
		return fmt.Errorf("index share steps must be ≥ 0, got %d", o.IndexShare)
	}
	return nil
}

// Build returns the verified forward graph for cfg.
func Build(cfg *model.Config, opts Options) (*ir.Graph, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if err := opts.checkTP(cfg); err != nil {
		return nil, err
	}
	if opts.IndexShare > 0 {
		return nil, fmt.Errorf("graph: index sharing is an MTP graph option (the trunk's indexers run every step)")
	}
	capture := map[int]*ir.Value{}
	for i, l := range opts.TargetLayers {
		if l < 0 || l >= cfg.NumHiddenLayers {
			return nil, fmt.Errorf("graph: target layer %d (entry %d) is outside the trunk's decoder layers [0, %d)", l, i, cfg.NumHiddenLayers)
		}
		capture[l] = nil
	}
	g := ir.New("glm5_next")
	g.SetMode(opts.Mode)
	g.Attrs.Put(ir.GraphAttrLogits.Is(string(opts.Logits)), ir.GraphAttrLayers.Is(cfg.NumHiddenLayers))
	b := &builder{cfg: cfg, g: g, opts: opts}
	tokens := g.AddInput(ir.InputTokens, ir.I32, ir.DimT)
	b.batch = g.AddInput(ir.InputBatch, ir.Host)
	b.lens = g.Op1(ir.OpSeqLengths, -1, nil, b.batch).Named("seq_lengths")
	D, H := cfg.HiddenSize, cfg.HCMult
	X := b.embed(tokens, H, "streams.embed")
	var lastSel *ir.Value
	for l := 0; l < cfg.NumHiddenLayers; l++ {
		R := X
		h := b.pre(l, "hc_attn", X)
		h = g.Op1(ir.OpRMSNorm, l, ir.NewAttrs(ir.AttrEps.Is(cfg.RMSNormEps)), h, b.w(layerName(l, "input_layernorm.weight"), D)).Named(fmt.Sprintf("l%d.attn_in", l))
		var a *ir.Value
		if cfg.IsKDA(l) {
			a = b.kda(l, h)
		} else {
			a, lastSel = b.dsa(l, h, lastSel)
		}
		X = b.post(l, "attn", b.reduce(l, a, fmt.Sprintf("l%d.attn.sum", l)), R)
		R = X
		h = b.pre(l, "hc_ffn", X)
		h = g.Op1(ir.OpRMSNorm, l, ir.NewAttrs(ir.AttrEps.Is(cfg.RMSNormEps)), h, b.w(layerName(l, "post_attention_layernorm.weight"), D)).Named(fmt.Sprintf("l%d.ffn_in", l))
		var f *ir.Value
		if cfg.IsMoE(l) {
			f = b.moe(l, h)
		} else {
			f = b.mlp(l, "mlp", h, cfg.IntermediateSize)
		}
		X = b.post(l, "ffn", b.reduce(l, f, fmt.Sprintf("l%d.ffn.sum", l)), R)
		if opts.CaptureHidden {
			g.Outputs[ir.HiddenOutput(l)] = X
		}
		if _, ok := capture[l]; ok {
			capture[l] = g.Op1(ir.OpStreamMean, l, nil, X).Named(fmt.Sprintf("l%d.target_hidden", l))
		}
	}
	if len(opts.TargetLayers) > 0 {
		rows := make([]*ir.Value, len(opts.TargetLayers))
		for i, l := range opts.TargetLayers {
			rows[i] = capture[l]
		}
		g.Outputs[ir.OutputTargetHidden] = g.Op1(ir.OpConcatCols, -1, nil, rows...).Named("target_hidden")
	}
	y := g.Op1(ir.OpStreamMean, -1, nil, X).Named("final.mean")
	norm := func(y *ir.Value) *ir.Value {
		return g.Op1(ir.OpRMSNorm, -1, ir.NewAttrs(ir.AttrEps.Is(cfg.RMSNormEps)), y, b.w("norm.weight", D)).Named("final.norm")
	}
	if opts.FinalHidden { // every row is normalized and kept; logits read the selected ones
		y = norm(y)
		g.Outputs[ir.OutputFinalHidden] = y
		y = b.lastRows(y)
	} else { // only the selected rows are normalized
		y = norm(b.lastRows(y))
	}
	b.head(y)
	return b.verified()
}

// lastRows selects the rows that get logits.
func (b *builder) lastRows(y *ir.Value) *ir.Value {
	switch b.opts.Logits {
	case LastLogits:
		return b.g.Op1(ir.OpLastRows, -1, nil, b.batch, y).Named("final.last")
	case SpanLogits:
		return b.g.Op1(ir.OpSpanRows, -1, nil, b.batch, y).Named("final.spans")
	}
	return y
}

// head adds the lm_head GEMM and the logits output.
func (b *builder) head(y *ir.Value) {
	cfg := b.cfg
	w := b.shard(b.g.AddWeight("lm_head.weight", cfg.VocabSize, cfg.HiddenSize), 0)
	logits := b.g.Op1(ir.OpLinear, -1, nil, y, w).Named("logits")
	if n := b.opts.TP.ranks(); n > 1 { // each rank's vocabulary block, side by side
		logits.Named("logits.tp")
		logits = b.g.Op1(ir.OpAllGatherCols, -1, ir.NewAttrs(ir.AttrRanks.Is(n)), logits).Named("logits")
	}
	b.g.Outputs[ir.OutputLogits] = logits
}

func (b *builder) verified() (*ir.Graph, error) {
	if err := b.g.Verify(); err != nil {
		return nil, fmt.Errorf("graph: the built graph does not verify: %w", err)
	}
	return b.g, nil
}

// BuildMTP returns the verified forward graph of the MTP (NextN) draft
// layer, layer num_hidden_layers (architecture §7): inputs token ids a and
// hidden rows h (ir.InputHidden, one per token), then
//
//	z  = eh_proj · [enorm(embed(a)); hnorm(h)]      (two GEMMs on eh_proj's halves)
//	z += DSA/MLA(input_layernorm(z))                 (its own latent cache and full indexer)
//	z += MoE(post_attention_layernorm(z))            (routed + shared experts)
//	hm = shared_head.norm(z)                         (output final_hidden, every row)
//	logits = lm_head · hm                            (the rows opts.Logits selects)
//
// without mHC, sharing the trunk's embedding and lm_head. Its state (MLA
// latents, indexer pools) lives in a store of the MTP layers
// (model.Config.MTPLayers), whose positions are the MTP's own. The mode
// only labels the graph (the layer has no KDA); CaptureHidden and
// FinalHidden do not apply (final_hidden is always an output).
func BuildMTP(cfg *model.Config, opts Options) (*ir.Graph, error) {
	if !cfg.HasMTP() {
		return nil, fmt.Errorf("graph: the model has no MTP layer (num_nextn_predict_layers is %d)", cfg.NumNextNPredictLayers)
	}
	if opts.CaptureHidden || opts.FinalHidden {
		return nil, fmt.Errorf("graph: the MTP graph takes no hidden-capture options (it always outputs %s)", ir.OutputFinalHidden)
	}
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if err := opts.checkTP(cfg); err != nil {
		return nil, err
	}
	l, D := cfg.MTPLayer(0), cfg.HiddenSize
	g := ir.New("glm5_next_mtp")
	g.SetMode(opts.Mode)
	g.SetMTPLayer(l)
	g.Attrs.Put(ir.GraphAttrLogits.Is(string(opts.Logits)))
	b := &builder{cfg: cfg, g: g, opts: opts}
	tokens := g.AddInput(ir.InputTokens, ir.I32, ir.DimT)
	b.batch = g.AddInput(ir.InputBatch, ir.Host)
	hidden := g.AddInput(ir.InputHidden, ir.F32, ir.DimT, D)
	b.lens = g.Op1(ir.OpSeqLengths, -1, nil, b.batch).Named("seq_lengths")
	norm := func(x *ir.Value, weight, name string) *ir.Value {
		return g.Op1(ir.OpRMSNorm, l, ir.NewAttrs(ir.AttrEps.Is(cfg.RMSNormEps)), x, b.w(layerName(l, weight), D)).Named(fmt.Sprintf("l%d.%s", l, name))
	}
	e := b.embed(tokens, 0, "mtp.embed")
	en := norm(e, "enorm.weight", "enorm")
	hn := norm(hidden, "hnorm.weight", "hnorm")
	eh := b.w(layerName(l, "eh_proj.weight"), D, 2*D)
	half := func(x *ir.Value, lo int, name string) *ir.Value {
		w := g.Op1(ir.OpSliceCols, l, ir.NewAttrs(ir.AttrStart.Is(lo), ir.AttrEnd.Is(lo+D)), eh).Named(fmt.Sprintf("l%d.eh_proj.%s", l, name))
		return g.Op1(ir.OpLinear, l, nil, x, w).Named(fmt.Sprintf("l%d.eh.%s", l, name))
	}
	z := g.Op1(ir.OpAdd, l, nil, half(en, 0, "e"), half(hn, D, "h")).Named(fmt.Sprintf("l%d.eh", l))
	if opts.IndexShare > 0 {
		g.Attrs.Put(ir.GraphAttrIndexShare.Is(opts.IndexShare))
	}
	a, _ := b.dsa(l, norm(z, "input_layernorm.weight", "attn_in"), nil)
	z = g.Op1(ir.OpAdd, l, nil, z, b.reduce(l, a, fmt.Sprintf("l%d.attn.sum", l))).Named(fmt.Sprintf("l%d.attn_res", l))
	f := b.reduce(l, b.moe(l, norm(z, "post_attention_layernorm.weight", "ffn_in")), fmt.Sprintf("l%d.ffn.sum", l))
	z = g.Op1(ir.OpAdd, l, nil, z, f).Named(fmt.Sprintf("l%d.ffn_res", l))
	hm := norm(z, "shared_head.norm.weight", "shared_head")
	g.Outputs[ir.OutputFinalHidden] = hm
	b.head(b.lastRows(hm))
	return b.verified()
}

// pre emits one mHC pre site and stashes post/comb for the matching post.
func (b *builder) pre(l int, site string, X *ir.Value) *ir.Value {
	cfg := b.cfg
	H, D := cfg.HCMult, cfg.HiddenSize
	mix := (2 + H) * H
	outs := b.g.Op(ir.OpMHCPre, l, ir.NewAttrs(ir.AttrSite.Is(site[3:]), ir.AttrEps.Is(cfg.RMSNormEps), ir.AttrHCEps.Is(cfg.HCEps), ir.AttrIters.Is(cfg.HCSinkhornIters)), X,
		b.w(layerName(l, site+"_fn"), mix, H*D), b.w(layerName(l, site+"_base"), mix), b.w(layerName(l, site+"_scale"), 3))
	outs[0].Named(fmt.Sprintf("l%d.%s.h", l, site[3:]))
	outs[1].Named(fmt.Sprintf("l%d.%s.post", l, site[3:]))
	outs[2].Named(fmt.Sprintf("l%d.%s.comb", l, site[3:]))
	b.pending = outs[1:]
	return outs[0]
}

func (b *builder) post(l int, site string, o, R *ir.Value) *ir.Value {
	p := b.pending
	return b.g.Op1(ir.OpMHCPost, l, ir.NewAttrs(ir.AttrSite.Is(site)), o, R, p[0], p[1]).Named(fmt.Sprintf("streams.l%d.%s", l, site))
}

func (b *builder) linear(l int, x *ir.Value, name string, out, in int) *ir.Value {
	return b.linearW(l, x, name, b.w(layerName(l, name), out, in))
}

// linearS is linear with the weight (of its full shape out×in) sharded
// along axis: 0 splits the outputs (column parallel), 1 the inputs (row
// parallel: a partial sum, reduced later).
func (b *builder) linearS(l int, x *ir.Value, name string, axis, out, in int) *ir.Value {
	return b.linearW(l, x, name, b.ws(layerName(l, name), axis, out, in))
}

func (b *builder) linearW(l int, x *ir.Value, name string, w *ir.Value) *ir.Value {
	return b.g.Op1(ir.OpLinear, l, nil, x, w).Named(fmt.Sprintf("l%d.%s", l, trimWeight(name)))
}

func trimWeight(n string) string {
	const s = ".weight"
	if len(n) > len(s) && n[len(n)-len(s):] == s {
		return n[:len(n)-len(s)]
	}
	return n
}

func (b *builder) kda(l int, h *ir.Value) *ir.Value {
	cfg, g := b.cfg, b.g
	// Under tensor parallelism Hk is this rank's heads; HkF and PF the
	// model's heads and channels (the checkpoint tensors' shapes).
	n := b.opts.TP.ranks()
	D, HkF, Dh := cfg.HiddenSize, cfg.LinearNumHeads, cfg.LinearHeadDim
	Hk, PF, K := HkF/n, HkF*Dh, cfg.LinearConvKernelDim
	uq := b.linearS(l, h, "self_attn.q_proj.weight", 0, PF, D)
	uk := b.linearS(l, h, "self_attn.k_proj.weight", 0, PF, D)
	uv := b.linearS(l, h, "self_attn.v_proj.weight", 0, PF, D)
	convW := g.Op1(ir.OpConcatRows, l, nil,
		b.ws(layerName(l, "self_attn.q_conv1d.weight"), 0, PF, 1, K),
		b.ws(layerName(l, "self_attn.k_conv1d.weight"), 0, PF, 1, K),
		b.ws(layerName(l, "self_attn.v_conv1d.weight"), 0, PF, 1, K)).Named(fmt.Sprintf("l%d.self_attn.qkv_conv1d", l))
	qkv := g.Op(ir.OpKDAConv, l, ir.NewAttrs(ir.AttrKernel.Is(K)), b.lens, uq, uk, uv, convW)
	for i, n := range []string{"q", "k", "v"} {
		qkv[i].Named(fmt.Sprintf("l%d.kda.%s", l, n))
	}
	fa := b.linear(l, h, "self_attn.f_a_proj.weight", Dh, D)
	z := b.linearS(l, fa, "self_attn.f_b_proj.weight", 0, PF, Dh)
	gateAttrs := ir.NewAttrs(ir.AttrHeads.Is(Hk))
	if cfg.LinearLowerBound != nil {
		gateAttrs.Put(ir.AttrLowerBound.Is(*cfg.LinearLowerBound))
	}
	gl := g.Op1(ir.OpKDAGate, l, gateAttrs, z, b.ws(layerName(l, "self_attn.A_log"), 0, HkF), b.ws(layerName(l, "self_attn.dt_bias"), 0, PF)).Named(fmt.Sprintf("l%d.kda.g", l))
	bl := b.linearS(l, h, "self_attn.b_proj.weight", 0, HkF, D)
	beta := g.Op1(ir.OpSigmoid, l, nil, bl).Named(fmt.Sprintf("l%d.kda.beta", l))
	algo := ir.KDAAuto
	switch b.opts.Mode {
	case Prefill, Extend:
		algo = ir.KDAChunked
	case Decode:
		algo = ir.KDARecurrent
	}
	o := g.Op1(ir.OpKDAAttn, l, ir.NewAttrs(ir.AttrHeads.Is(Hk), ir.AttrHeadDim.Is(Dh), ir.AttrAlgo.Is(algo)), b.lens, qkv[0], qkv[1], qkv[2], gl, beta).Named(fmt.Sprintf("l%d.kda.o", l))
	ga := b.linear(l, h, "self_attn.g_a_proj.weight", Dh, D)
	gate := b.linearS(l, ga, "self_attn.g_b_proj.weight", 0, PF, Dh)
	y := g.Op1(ir.OpGatedRMSNorm, l, ir.NewAttrs(ir.AttrHeads.Is(Hk), ir.AttrEps.Is(cfg.RMSNormEps)), o, gate, b.w(layerName(l, "self_attn.o_norm.weight"), Dh)).Named(fmt.Sprintf("l%d.kda.normed", l))
	return b.linearS(l, y, "self_attn.o_proj.weight", 1, D, PF)
}

func (b *builder) dsa(l int, h, prevSel *ir.Value) (*ir.Value, *ir.Value) {
	cfg, g := b.cfg, b.g
	// nh is this rank's MLA heads, nhF the model's; the latent (q_a,
	// kv_a) and the indexer are replicated.
	D, nhF := cfg.HiddenSize, cfg.NumAttentionHeads
	nh := nhF / b.opts.TP.ranks()
	dq, dv, R, QR := cfg.QKHeadDim(), cfg.VHeadDim, cfg.KVLoraRank, cfg.QLoraRank
	qa := b.linear(l, h, "self_attn.q_a_proj.weight", QR, D)
	qres := g.Op1(ir.OpRMSNorm, l, ir.NewAttrs(ir.AttrEps.Is(cfg.RMSNormEps)), qa, b.w(layerName(l, "self_attn.q_a_layernorm.weight"), QR)).Named(fmt.Sprintf("l%d.q_res", l))
	q := b.linearS(l, qres, "self_attn.q_b_proj.weight", 0, nhF*dq, QR)
	kva := b.linear(l, h, "self_attn.kv_a_proj_with_mqa.weight", R, D)
	ckv := g.Op1(ir.OpRMSNorm, l, ir.NewAttrs(ir.AttrEps.Is(cfg.RMSNormEps)), kva, b.w(layerName(l, "self_attn.kv_a_layernorm.weight"), R)).Named(fmt.Sprintf("l%d.c_kv", l))
	meta := g.Op1(ir.OpDSAMeta, l, ir.NewAttrs(ir.AttrKPool.Is(cfg.IndexKPool), ir.AttrTopK.Is(cfg.IndexTopK)), b.lens).Named(fmt.Sprintf("l%d.dsa_meta", l))
	sel := prevSel
	if cfg.HasOwnIndexer(l) {
		Hi, Di := cfg.IndexNHeads, cfg.IndexHeadDim
		qi := b.linear(l, qres, "self_attn.indexer.wq_b.weight", Hi*Di, QR)
		ki := b.linear(l, h, "self_attn.indexer.wk.weight", Di, D)
		ki = g.Op1(ir.OpLayerNorm, l, ir.NewAttrs(ir.AttrEps.Is(1e-6)), ki, b.w(layerName(l, "self_attn.indexer.k_norm.weight"), Di), b.w(layerName(l, "self_attn.indexer.k_norm.bias"), Di)).Named(fmt.Sprintf("l%d.indexer.k", l))
		gi := g.Op1(ir.OpLinear, l, nil, h, b.w(layerName(l, "self_attn.indexer.index_kpool_compress_gate"), Di, D)).Named(fmt.Sprintf("l%d.indexer.gate", l))
		wi := b.linear(l, h, "self_attn.indexer.weights_proj.weight", Hi, D)
		attrs := ir.NewAttrs(ir.AttrHeads.Is(Hi), ir.AttrDim.Is(Di), ir.AttrKPool.Is(cfg.IndexKPool), ir.AttrTopK.Is(cfg.IndexTopK), ir.AttrTail.Is(cfg.IndexKPoolAlwaysSelectTail))
		if k := b.opts.IndexShare; k > 0 && cfg.IsMTP(l) {
			if b.opts.Mode == Decode {
				attrs.Put(ir.AttrShare.Is(ir.IndexShareReuse), ir.AttrShareExtra.Is(k))
			} else {
				attrs.Put(ir.AttrShare.Is(ir.IndexShareSave))
			}
		}
		sel = g.Op1(ir.OpDSATopK, l, attrs,
			meta, qi, ki, gi, wi, b.w(layerName(l, "self_attn.indexer.index_kpool_compress_ape"), cfg.IndexKPool, Di)).Named(fmt.Sprintf("l%d.indexer.sel", l))
	} else if sel == nil {
		panic(fmt.Sprintf("layer %d: shared indexer with no previous full DSA layer (config validation should have caught this)", l))
	}
	o := g.Op1(ir.OpMLAAttn, l, ir.NewAttrs(ir.AttrHeads.Is(nh), ir.AttrQKDim.Is(dq), ir.AttrVDim.Is(dv), ir.AttrRank.Is(R), ir.AttrScale.Is(1/math.Sqrt(float64(dq)))),
		meta, q, ckv, b.ws(layerName(l, "self_attn.kv_b_proj.weight"), 0, nhF*(dq+dv), R), sel).Named(fmt.Sprintf("l%d.mla.o", l))
	return b.linearS(l, o, "self_attn.o_proj.weight", 1, D, nhF*dv), sel
}

func (b *builder) mlp(l int, name string, h *ir.Value, inter int) *ir.Value {
	D := b.cfg.HiddenSize
	gt := b.linearS(l, h, name+".gate_proj.weight", 0, inter, D)
	up := b.linearS(l, h, name+".up_proj.weight", 0, inter, D)
	act := b.g.Op1(ir.OpSwiGLU, l, ir.NewAttrs(ir.AttrLimit.Is(b.swigluLimit())), gt, up).Named(fmt.Sprintf("l%d.%s.act", l, name))
	return b.linearS(l, act, name+".down_proj.weight", 1, D, inter)
}

func (b *builder) swigluLimit() float64 {
	if b.cfg.SwiGLULimit == nil {
		return 0
	}
	return *b.cfg.SwiGLULimit
}

func (b *builder) moe(l int, h *ir.Value) *ir.Value {
	cfg, g := b.cfg, b.g
	D, E, I := cfg.HiddenSize, cfg.NRoutedExperts, cfg.MoEIntermediateSize
	logits := b.linear(l, h, "mlp.gate.weight", E, D)
	route := g.Op(ir.OpMoERoute, l, ir.NewAttrs(ir.AttrTopK.Is(cfg.NumExpertsPerTok), ir.AttrGroups.Is(cfg.NGroup), ir.AttrTopKGroup.Is(cfg.TopKGroup), ir.AttrNormalize.Is(cfg.NormTopKProb), ir.AttrScaling.Is(cfg.RoutedScalingFactor)),
		logits, b.w(layerName(l, "mlp.gate.e_score_correction_bias"), E))
	route[0].Named(fmt.Sprintf("l%d.moe.idx", l))
	route[1].Named(fmt.Sprintf("l%d.moe.w", l))
	// Every routed expert is split along its intermediate dimension
	// (EP1): axis 1 of gate/up [E, I, D], axis 2 of down [E, D, I].
	ex := func(proj string, axis int, shape ...int) *ir.Value {
		return b.shard(g.AddStackedWeight(prefix+layerName(l, "mlp.experts.{e}."+proj+".weight"), E, shape...), axis)
	}
	routed := g.Op1(ir.OpMoEExperts, l, ir.NewAttrs(ir.AttrLimit.Is(b.swigluLimit())), h, route[0], route[1],
		ex("gate_proj", 1, I, D), ex("up_proj", 1, I, D), ex("down_proj", 2, D, I)).Named(fmt.Sprintf("l%d.moe.routed", l))
	if cfg.NSharedExperts == 0 {
		return routed
	}
	shared := b.mlp(l, "mlp.shared_experts", h, I*cfg.NSharedExperts)
	return g.Op1(ir.OpAdd, l, nil, routed, shared).Named(fmt.Sprintf("l%d.moe.out", l))
}
