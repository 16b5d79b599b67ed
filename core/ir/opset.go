package ir

import (
	"fmt"
	"slices"
)

// The op set of the GLM-5.3-Flash forward pass. Shape inference lives here
// so that the IR can be verified without an executor; each backend binds every
// op to a kernel (core/backend/*). Attribute names are part of the IR's text format.

// Op names: the IR's text format spells them, plugins send them.
const (
	OpEmbed         = "embed"
	OpMHCPre        = "mhc_pre"
	OpMHCPost       = "mhc_post"
	OpMHCPostPre    = "mhc_post_pre"
	OpRMSNorm       = "rmsnorm"
	OpLayerNorm     = "layernorm"
	OpGatedRMSNorm  = "gated_rmsnorm"
	OpLinear        = "linear"
	OpLinearSplit   = "linear_split"
	OpLinearBatched = "linear_batched"
	OpSigmoid       = "sigmoid"
	OpAdd           = "add"
	OpSwiGLU        = "swiglu"
	OpSwiGLUPacked  = "swiglu_packed"
	OpKDAConv       = "kda_conv"
	OpKDAGate       = "kda_gate"
	OpKDAAttn       = "kda_attn"
	OpSeqLengths    = "seq_lengths"
	OpDSAMeta       = "dsa_meta"
	OpDSATopK       = "dsa_topk"
	OpMLAAttn       = "mla_attn"
	OpMoERoute      = "moe_route"
	OpMoEExperts    = "moe_experts"
	OpStreamMean    = "stream_mean"
	OpLastRows      = "last_rows"
	OpSpanRows      = "span_rows"
	OpConcatRows    = "concat_rows"
	OpStack         = "stack"
	OpSliceCols     = "slice_cols"
)

// The ops' attributes (see attrdefs.go for the names).
var (
	embedAttrs = []AttrDef{
		AttrStreams.Optional("residual streams H: the output is f32[T,H,D]; absent: plain embedding rows f32[T,D]"),
		AttrVocabStart.Default(0, "the token id of the weight's row 0 (a vocabulary shard under tensor parallelism): a token outside [vocab_start, vocab_start+rows) embeds as zeros, and an all_reduce sums the shards"),
	}
	normEps        = AttrEps.Required("the variance epsilon (> 0)")
	rmsNormAttrs   = []AttrDef{normEps}
	layerNormAttrs = []AttrDef{normEps}
	gatedNormAttrs = []AttrDef{
		AttrHeads.Required("heads: the norm runs over each head's width/heads columns"),
		AttrEps.Default(1e-5, "the variance epsilon"),
	}
	mhcPreAttrs = []AttrDef{
		AttrSite.Optional(`which sub-layer the site feeds: "attn" or "ffn" (informational)`),
		AttrEps.Default(1e-5, "the collapse's RMS epsilon"),
		AttrHCEps.Default(1e-6, "the Sinkhorn epsilon"),
		AttrIters.Default(20, "Sinkhorn iterations"),
	}
	mhcPostAttrs    = []AttrDef{AttrSite.Optional(`which sub-layer's output it expands: "attn" or "ffn" (informational)`)}
	mhcPostPreAttrs = append(append([]AttrDef(nil), mhcPreAttrs...),
		AttrPostSite.Optional(`the fused post's site: "attn" or "ffn" (informational)`),
		AttrNormEps.Default(1e-5, "the fused RMSNorm's epsilon, required (> 0) with the norm weight (input 7)"),
		AttrMaxTokens.Default(0, "above this many tokens the backend runs post and pre unfused (0: never)"),
	)
	linearSplitAttrs = []AttrDef{
		AttrSplits.Required("the outputs' widths, summing to the weight's rows"),
		AttrFused.Optional("the projections fused into this GEMM (informational: kda-fusion's form)"),
	}
	swigluAttrs  = []AttrDef{AttrLimit.Default(0, "the clamp: silu(min(g,limit))·clamp(u,±limit); 0: none")}
	kdaConvAttrs = []AttrDef{AttrKernel.Optional("the conv kernel width (informational: the weight's last dim is what runs)")}
	kdaGateAttrs = []AttrDef{
		AttrHeads.Required("heads (A_log has one entry per head)"),
		AttrLowerBound.Optional("the log-decay's lower bound (absent: none)"),
	}
	kdaAttnAttrs = []AttrDef{
		AttrHeads.Required("heads"),
		AttrHeadDim.Required("the head width"),
		AttrAlgo.Required(`the delta rule's form: "auto" (per sequence), "chunked" or "recurrent"`),
	}
	dsaMetaAttrs = []AttrDef{
		AttrKPool.Required("keys per pool (≥ 1)"),
		AttrTopK.Default(0, "selected positions per query (the indexer's top-k)"),
	}
	dsaTopKAttrs = []AttrDef{
		AttrHeads.Required("indexer heads"),
		AttrDim.Required("the indexer's head width"),
		AttrKPool.Required("keys per pool"),
		AttrTopK.Required("selected positions per query, a positive multiple of kpool"),
		AttrTail.Default(false, "always select the last, partial pool"),
		AttrShare.Optional(`index sharing between MTP draft steps: "save" keeps each sequence's last selection, "reuse" selects from the saved one (absent: neither)`),
		AttrShareExtra.Optional(`with share "reuse": the draft steps that reuse a selection (≥ 1; the rows are this much wider)`),
	}
	mlaAttrs = []AttrDef{
		AttrHeads.Required("attention heads"),
		AttrQKDim.Required("the query/key head width"),
		AttrVDim.Required("the value head width"),
		AttrRank.Required("the latent (c_kv) width"),
		AttrScale.Default(0, "the softmax scale (the builder sets 1/√qk_dim)"),
	}
	moeRouteAttrs = []AttrDef{
		AttrTopK.Required("experts per token"),
		AttrGroups.Default(1, "expert groups"),
		AttrTopKGroup.Default(1, "groups a token's experts come from"),
		AttrNormalize.Default(false, "normalize the selected weights to sum 1"),
		AttrScaling.Default(1.0, "the routed weights' scale"),
	}
	moeExpertsAttrs = []AttrDef{AttrLimit.Default(0, "the experts' SwiGLU clamp; 0: none")}
	sliceColsAttrs  = []AttrDef{
		AttrStart.Required("the first column"),
		AttrEnd.Required("one past the last column"),
	}
)

func init() {
	for _, d := range []OpDef{
		{Name: OpEmbed, Doc: "token ids → H identical residual streams f32[T,H,D] (attr streams), or embedding rows f32[T,D] (no streams attr)", MinInputs: 2, MaxInputs: 2, Infer: inferEmbed, Attrs: embedAttrs},
		{Name: OpMHCPre, Doc: "mHC mapping + Sinkhorn + stream collapse", MinInputs: 4, MaxInputs: 4, Infer: inferMHCPre, Attrs: mhcPreAttrs},
		{Name: OpMHCPost, Doc: "mHC expand: post·o + combᵀ·R", MinInputs: 4, MaxInputs: 4, Infer: inferMHCPost, Attrs: mhcPostAttrs},
		{Name: OpRMSNorm, Doc: "weighted RMSNorm over the last dim", MinInputs: 2, MaxInputs: 2, Infer: inferNorm, Attrs: rmsNormAttrs},
		{Name: OpLayerNorm, Doc: "LayerNorm with bias over the last dim", MinInputs: 3, MaxInputs: 3, Infer: inferNorm, Attrs: layerNormAttrs},
		{Name: OpLinear, Doc: "y = x·Wᵀ", MinInputs: 2, MaxInputs: 2, Infer: inferLinear, GEMM: weightGEMM},
		{Name: OpLinearSplit, Doc: "one GEMM against a row-concatenated weight, outputs split by attr splits", MinInputs: 2, MaxInputs: 2, Infer: inferLinearSplit, GEMM: weightGEMM, Attrs: linearSplitAttrs},
		{Name: OpSigmoid, Doc: "elementwise sigmoid", MinInputs: 1, MaxInputs: 1, Infer: inferSame},
		{Name: OpAdd, Doc: "elementwise sum", MinInputs: 2, MaxInputs: 2, Infer: inferAdd},
		{Name: OpSwiGLU, Doc: "silu(min(g,limit))·clamp(u,±limit)", MinInputs: 2, MaxInputs: 2, Infer: inferAdd, Attrs: swigluAttrs},
		{Name: OpSwiGLUPacked, Doc: "swiglu of one [T,2I] input packing g then u per row (a gate-up GEMM's output) → [T,I]", MinInputs: 1, MaxInputs: 1, Infer: inferSwiGLUPacked, Attrs: swigluAttrs},
		{Name: OpKDAConv, Doc: "causal depthwise conv + SiLU over q,k,v with the per-sequence conv state", MinInputs: 5, MaxInputs: 5, Infer: inferKDAConv, SideEffects: true, ReadsLengths: true, Attrs: kdaConvAttrs},
		{Name: OpKDAGate, Doc: "KDA forget gate (log-decay)", MinInputs: 3, MaxInputs: 3, Infer: inferKDAGate, Attrs: kdaGateAttrs},
		{Name: OpKDAAttn, Doc: "KDA delta rule (chunked or recurrent) with the per-sequence recurrent state", MinInputs: 6, MaxInputs: 6, Infer: inferKDAAttn, SideEffects: true, ReadsLengths: true, Attrs: kdaAttnAttrs},
		{Name: OpGatedRMSNorm, Doc: "per-head RMSNorm gated by sigmoid(gate)", MinInputs: 3, MaxInputs: 3, Infer: inferGatedNorm, Attrs: gatedNormAttrs},
		{Name: OpDSAMeta, Doc: "per-batch DSA metadata: key lengths, visible pools, tails", MinInputs: 1, MaxInputs: 1, Infer: inferHostMeta, ReadsLengths: true, Attrs: dsaMetaAttrs},
		{Name: OpDSATopK, Doc: "k-pool lightning indexer: append pooled keys, select positions", MinInputs: 6, MaxInputs: 6, Infer: inferDSATopK, SideEffects: true, Attrs: dsaTopKAttrs},
		{Name: OpMLAAttn, Doc: "append c_kv to the latent cache, sparse NoPE MLA over the selected positions", MinInputs: 5, MaxInputs: 5, Infer: inferMLAAttn, SideEffects: true, Attrs: mlaAttrs},
		{Name: OpMoERoute, Doc: "sigmoid + bias top-k routing (group-limited)", MinInputs: 2, MaxInputs: 2, Infer: inferMoERoute, Attrs: moeRouteAttrs},
		{Name: OpMoEExperts, Doc: "routed experts: clamped SwiGLU per selected expert, weighted sum", MinInputs: 6, MaxInputs: 6, Infer: inferMoEExperts, Attrs: moeExpertsAttrs},
		{Name: OpStreamMean, Doc: "unweighted mean of the H residual streams", MinInputs: 1, MaxInputs: 1, Infer: inferStreamMean},
		{Name: OpLastRows, Doc: "the last token row of every sequence", MinInputs: 2, MaxInputs: 2, Infer: inferLastRows},
		{Name: OpSpanRows, Doc: "the last r rows of every sequence, r per sequence from the batch (1, or a speculative verify span's last token and drafts)", MinInputs: 2, MaxInputs: 2, Infer: inferSpanRows},
		{Name: OpConcatRows, Doc: "derived weight: concatenation along dim 0", MinInputs: 1, MaxInputs: -1, Infer: inferConcatRows, Fold: foldConcat},
		{Name: OpStack, Doc: "derived weight: equal-shaped weights stacked along a new dim 0", MinInputs: 1, MaxInputs: -1, Infer: inferStack, Fold: foldConcat},
		{Name: OpSliceCols, Doc: "derived weight: columns [start, end) of a 2-D weight", MinInputs: 1, MaxInputs: 1, Infer: inferSliceCols, Fold: foldSliceCols, Attrs: sliceColsAttrs},
		{Name: OpSeqLengths, Doc: "per-sequence token counts materialized by the executor (the device copy)", MinInputs: 1, MaxInputs: 1, Infer: inferSeqLengths},
		{Name: OpLinearBatched, Doc: "G GEMMs in one kernel: x [T,G·K] split in G blocks, each times its own [N,K] slice of a stacked weight", MinInputs: 2, MaxInputs: 2, Infer: inferLinearBatched},
		{Name: OpMHCPostPre, Doc: "fused mHC post (expand) + the next mHC pre (+ optional RMSNorm) in one sweep", MinInputs: 7, MaxInputs: 8, Infer: inferMHCPostPre, Attrs: mhcPostPreAttrs},
	} {
		MustRegister(d)
	}
}

// weightGEMM is the GEMM trait of ops computing y = x·Wᵀ with x input 0
// and W input 1.
func weightGEMM(n *Node) GEMMShape {
	return GEMMShape{N: n.Inputs[1].Shape[0], K: n.Inputs[0].Shape[1], Weight: n.Inputs[1]}
}

// foldConcat folds concat_rows and stack: both lay their inputs out one
// after another (row-major, along a leading dimension).
func foldConcat(_ *Node, in [][]float32) ([][]float32, error) {
	n := 0
	for _, x := range in {
		n += len(x)
	}
	out := make([]float32, 0, n)
	for _, x := range in {
		out = append(out, x...)
	}
	return [][]float32{out}, nil
}

func need(n *Node, i int, dt DType, rank int) (*Value, error) {
	v := n.Inputs[i]
	if v == nil {
		return nil, fmt.Errorf("input %d is missing", i)
	}
	if v.DType != dt {
		return nil, fmt.Errorf("input %d (%s) is %s, want %s", i, v.Name, v.DType, dt)
	}
	if rank >= 0 && len(v.Shape) != rank {
		return nil, fmt.Errorf("input %d (%s) has rank %d, want %d", i, v.Name, len(v.Shape), rank)
	}
	return v, nil
}

// needLengths checks a lengths source: the host batch metadata, or the
// executor-produced per-sequence lengths (i32[S]).
func needLengths(n *Node, i int) error {
	v := n.Inputs[i]
	if v == nil {
		return fmt.Errorf("input %d (lengths source) is missing", i)
	}
	if v.DType == Host {
		return nil
	}
	if v.DType == I32 && len(v.Shape) == 1 && v.Shape[0] == DimS {
		return nil
	}
	return fmt.Errorf("input %d (%s) must be host batch metadata or i32[S] lengths, got %s", i, v.Name, FormatShape(v.DType, v.Shape))
}

func out(name string, dt DType, shape ...int) OutType {
	return OutType{Name: name, DType: dt, Shape: shape}
}

func numel(shape []int) int {
	p := 1
	for _, d := range shape[1:] {
		p *= d
	}
	return p
}

func inferEmbed(n *Node) ([]OutType, error) {
	if _, err := need(n, 0, I32, 1); err != nil {
		return nil, err
	}
	w, err := need(n, 1, F32, 2)
	if err != nil {
		return nil, err
	}
	H, ok := AttrStreams.Lookup(n)
	if !ok {
		return []OutType{out("x", F32, DimT, w.Shape[1])}, nil
	}
	if H < 1 {
		return nil, fmt.Errorf("attribute streams must be ≥ 1 (or absent for plain embedding rows)")
	}
	return []OutType{out("streams", F32, DimT, H, w.Shape[1])}, nil
}

// slice_cols(w[N,K]) {start, end} → w[:, start:end]: a derived weight (the
// MTP's eh_proj applied to a concatenation as two GEMMs on its halves).
func inferSliceCols(n *Node) ([]OutType, error) {
	w, err := need(n, 0, F32, 2)
	if err != nil {
		return nil, err
	}
	if w.Kind != Weight {
		return nil, fmt.Errorf("input 0 (%s) must be a weight", w.Name)
	}
	lo, hi := colAttr(n, AttrStart), colAttr(n, AttrEnd)
	if lo < 0 || hi <= lo || hi > w.Shape[1] {
		return nil, fmt.Errorf("columns [%d, %d) are not a non-empty range of %d", lo, hi, w.Shape[1])
	}
	return []OutType{out("w", F32, w.Shape[0], hi-lo)}, nil
}

// colAttr reads slice_cols' start or end, −1 when absent (refused).
func colAttr(n *Node, a Attr[int]) int {
	if v, ok := a.Lookup(n); ok {
		return v
	}
	return -1
}

func foldSliceCols(n *Node, in [][]float32) ([][]float32, error) {
	N, K := n.Inputs[0].Shape[0], n.Inputs[0].Shape[1]
	lo, hi := AttrStart.Get(n), AttrEnd.Get(n)
	if len(in[0]) != N*K {
		return nil, fmt.Errorf("weight has %d values, want %d", len(in[0]), N*K)
	}
	out := make([]float32, 0, N*(hi-lo))
	for r := 0; r < N; r++ {
		out = append(out, in[0][r*K+lo:r*K+hi]...)
	}
	return [][]float32{out}, nil
}

func inferMHCPre(n *Node) ([]OutType, error) {
	x, err := need(n, 0, F32, 3)
	if err != nil {
		return nil, err
	}
	H, D := x.Shape[1], x.Shape[2]
	mix := (2 + H) * H
	fn, err := need(n, 1, F32, 2)
	if err != nil {
		return nil, err
	}
	if fn.Shape[0] != mix || fn.Shape[1] != H*D {
		return nil, fmt.Errorf("fn is %v, want [%d %d]", fn.Shape, mix, H*D)
	}
	if b, err := need(n, 2, F32, 1); err != nil || b.Shape[0] != mix {
		return nil, fmt.Errorf("base must be f32[%d]: %v", mix, err)
	}
	if s, err := need(n, 3, F32, 1); err != nil || s.Shape[0] != 3 {
		return nil, fmt.Errorf("scale must be f32[3]: %v", err)
	}
	return []OutType{out("h", F32, x.Shape[0], D), out("post", F32, x.Shape[0], H), out("comb", F32, x.Shape[0], H*H)}, nil
}

func inferMHCPost(n *Node) ([]OutType, error) {
	o, err := need(n, 0, F32, 2)
	if err != nil {
		return nil, err
	}
	r, err := need(n, 1, F32, 3)
	if err != nil {
		return nil, err
	}
	H := r.Shape[1]
	if o.Shape[1] != r.Shape[2] {
		return nil, fmt.Errorf("sub-layer output width %d != stream width %d", o.Shape[1], r.Shape[2])
	}
	if p, err := need(n, 2, F32, 2); err != nil || p.Shape[1] != H {
		return nil, fmt.Errorf("post must be f32[T,%d]: %v", H, err)
	}
	if c, err := need(n, 3, F32, 2); err != nil || c.Shape[1] != H*H {
		return nil, fmt.Errorf("comb must be f32[T,%d]: %v", H*H, err)
	}
	return []OutType{out("streams", F32, r.Shape...)}, nil
}

func inferNorm(n *Node) ([]OutType, error) {
	x, err := need(n, 0, F32, 2)
	if err != nil {
		return nil, err
	}
	for i := 1; i < len(n.Inputs); i++ {
		w, err := need(n, i, F32, 1)
		if err != nil {
			return nil, err
		}
		if w.Shape[0] != x.Shape[1] {
			return nil, fmt.Errorf("weight %d has %d elements, input width is %d", i, w.Shape[0], x.Shape[1])
		}
	}
	if AttrEps.Get(n) <= 0 {
		return nil, fmt.Errorf("attribute eps must be > 0")
	}
	return []OutType{out("y", F32, x.Shape...)}, nil
}

func inferLinear(n *Node) ([]OutType, error) {
	x, err := need(n, 0, F32, 2)
	if err != nil {
		return nil, err
	}
	w, err := need(n, 1, F32, -1)
	if err != nil {
		return nil, err
	}
	if len(w.Shape) < 2 || numel(w.Shape) != x.Shape[1] {
		return nil, fmt.Errorf("weight %s is %v, input width is %d", w.Name, w.Shape, x.Shape[1])
	}
	return []OutType{out("y", F32, x.Shape[0], w.Shape[0])}, nil
}

func inferLinearSplit(n *Node) ([]OutType, error) {
	x, err := need(n, 0, F32, 2)
	if err != nil {
		return nil, err
	}
	w, err := need(n, 1, F32, 2)
	if err != nil {
		return nil, err
	}
	if w.Shape[1] != x.Shape[1] {
		return nil, fmt.Errorf("weight %s is %v, input width is %d", w.Name, w.Shape, x.Shape[1])
	}
	splits := AttrSplits.Get(n)
	sum := 0
	var outs []OutType
	for i, s := range splits {
		if s <= 0 {
			return nil, fmt.Errorf("split %d is %d", i, s)
		}
		sum += s
		outs = append(outs, out(fmt.Sprintf("y%d", i), F32, x.Shape[0], s))
	}
	if sum != w.Shape[0] {
		return nil, fmt.Errorf("splits sum to %d, weight has %d rows", sum, w.Shape[0])
	}
	return outs, nil
}

func inferSame(n *Node) ([]OutType, error) {
	x, err := need(n, 0, F32, -1)
	if err != nil {
		return nil, err
	}
	return []OutType{out("y", F32, x.Shape...)}, nil
}

func inferAdd(n *Node) ([]OutType, error) {
	a, err := need(n, 0, F32, -1)
	if err != nil {
		return nil, err
	}
	b, err := need(n, 1, F32, -1)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(a.Shape, b.Shape) {
		return nil, fmt.Errorf("shapes %v and %v differ", a.Shape, b.Shape)
	}
	return []OutType{out("y", F32, a.Shape...)}, nil
}

func inferSwiGLUPacked(n *Node) ([]OutType, error) {
	x, err := need(n, 0, F32, 2)
	if err != nil {
		return nil, err
	}
	if x.Shape[1]%2 != 0 {
		return nil, fmt.Errorf("input width %d is not g and u of equal widths", x.Shape[1])
	}
	return []OutType{out("y", F32, x.Shape[0], x.Shape[1]/2)}, nil
}

func inferKDAConv(n *Node) ([]OutType, error) {
	if err := needLengths(n, 0); err != nil {
		return nil, err
	}
	var P int
	for i := 1; i <= 3; i++ {
		x, err := need(n, i, F32, 2)
		if err != nil {
			return nil, err
		}
		if i == 1 {
			P = x.Shape[1]
		} else if x.Shape[1] != P {
			return nil, fmt.Errorf("q/k/v widths differ: %d vs %d", x.Shape[1], P)
		}
	}
	w, err := need(n, 4, F32, 3)
	if err != nil {
		return nil, err
	}
	if w.Shape[0] != 3*P || w.Shape[1] != 1 {
		return nil, fmt.Errorf("conv weight is %v, want [%d 1 K]", w.Shape, 3*P)
	}
	return []OutType{out("q", F32, DimT, P), out("k", F32, DimT, P), out("v", F32, DimT, P)}, nil
}

func inferKDAGate(n *Node) ([]OutType, error) {
	z, err := need(n, 0, F32, 2)
	if err != nil {
		return nil, err
	}
	H := AttrHeads.Get(n)
	if H < 1 || z.Shape[1]%H != 0 {
		return nil, fmt.Errorf("attribute heads (%d) must divide width %d", H, z.Shape[1])
	}
	if a, err := need(n, 1, F32, 1); err != nil || a.Shape[0] != H {
		return nil, fmt.Errorf("weight A_log must be f32[%d]: %v", H, err)
	}
	if b, err := need(n, 2, F32, 1); err != nil || b.Shape[0] != z.Shape[1] {
		return nil, fmt.Errorf("dt_bias must be f32[%d]: %v", z.Shape[1], err)
	}
	return []OutType{out("g", F32, z.Shape...)}, nil
}

func inferKDAAttn(n *Node) ([]OutType, error) {
	if err := needLengths(n, 0); err != nil {
		return nil, err
	}
	H, Dh := AttrHeads.Get(n), AttrHeadDim.Get(n)
	if H < 1 || Dh < 1 {
		return nil, fmt.Errorf("attributes heads and head_dim must be ≥ 1")
	}
	for i := 1; i <= 4; i++ {
		x, err := need(n, i, F32, 2)
		if err != nil {
			return nil, err
		}
		if x.Shape[1] != H*Dh {
			return nil, fmt.Errorf("input %d width %d != heads·head_dim %d", i, x.Shape[1], H*Dh)
		}
	}
	if b, err := need(n, 5, F32, 2); err != nil || b.Shape[1] != H {
		return nil, fmt.Errorf("beta must be f32[T,%d]: %v", H, err)
	}
	switch AttrAlgo.Get(n) {
	case KDAAuto, KDAChunked, KDARecurrent:
	default:
		return nil, fmt.Errorf("attribute algo must be auto, chunked or recurrent")
	}
	return []OutType{out("o", F32, DimT, H*Dh)}, nil
}

func inferGatedNorm(n *Node) ([]OutType, error) {
	o, err := need(n, 0, F32, 2)
	if err != nil {
		return nil, err
	}
	if g, err := need(n, 1, F32, 2); err != nil || !slices.Equal(g.Shape, o.Shape) {
		return nil, fmt.Errorf("gate must match %v: %v", o.Shape, err)
	}
	H := AttrHeads.Get(n)
	if H < 1 || o.Shape[1]%H != 0 {
		return nil, fmt.Errorf("attribute heads must divide width %d", o.Shape[1])
	}
	if w, err := need(n, 2, F32, 1); err != nil || w.Shape[0] != o.Shape[1]/H {
		return nil, fmt.Errorf("weight must be f32[%d]: %v", o.Shape[1]/H, err)
	}
	return []OutType{out("y", F32, o.Shape...)}, nil
}

func inferHostMeta(n *Node) ([]OutType, error) {
	if err := needLengths(n, 0); err != nil {
		return nil, err
	}
	if AttrKPool.Get(n) < 1 {
		return nil, fmt.Errorf("attribute kpool must be ≥ 1")
	}
	return []OutType{out("meta", Host)}, nil
}

func inferDSATopK(n *Node) ([]OutType, error) {
	if _, err := need(n, 0, Host, -1); err != nil {
		return nil, err
	}
	H, D := AttrHeads.Get(n), AttrDim.Get(n)
	kp, topk := AttrKPool.Get(n), AttrTopK.Get(n)
	if H < 1 || D < 1 || kp < 1 || topk < kp || topk%kp != 0 {
		return nil, fmt.Errorf("attributes heads, dim, kpool, topk invalid (topk must be a positive multiple of kpool)")
	}
	shapes := [][]int{{DimT, H * D}, {DimT, D}, {DimT, D}, {DimT, H}, {kp, D}}
	for i, s := range shapes {
		x, err := need(n, i+1, F32, 2)
		if err != nil {
			return nil, err
		}
		if x.Shape[1] != s[1] || (s[0] > 0 && x.Shape[0] != s[0]) {
			return nil, fmt.Errorf("input %d (%s) is %v, want %v", i+1, x.Name, x.Shape, s)
		}
	}
	extra := 0
	switch share := AttrShare.Get(n); share {
	case "", IndexShareSave:
		if _, ok := AttrShareExtra.Lookup(n); ok {
			return nil, fmt.Errorf("attribute share_extra needs share %q", IndexShareReuse)
		}
	case IndexShareReuse:
		if extra = AttrShareExtra.Get(n); extra < 1 {
			return nil, fmt.Errorf("share %q needs share_extra ≥ 1 (the draft steps that reuse a selection), got %d", share, extra)
		}
	default:
		return nil, fmt.Errorf("attribute share must be %q or %q, got %q", IndexShareSave, IndexShareReuse, share)
	}
	return []OutType{out("sel", I32, DimT, topk+kp-1+extra)}, nil
}

// Index sharing between MTP draft steps (index_share_for_mtp_iteration),
// the values of dsa_topk's "share" attribute: a "save" node keeps every
// sequence's last selection row in its slot; a "reuse" node skips scoring
// and selects, for a query at position p, the saved row (made at position
// p0) plus every position in (p0, p] (at most share_extra of them, so its
// rows are share_extra wider).
const (
	IndexShareSave  = "save"
	IndexShareReuse = "reuse"
)

func inferMLAAttn(n *Node) ([]OutType, error) {
	if _, err := need(n, 0, Host, -1); err != nil {
		return nil, err
	}
	H, dq, dv, R := AttrHeads.Get(n), AttrQKDim.Get(n), AttrVDim.Get(n), AttrRank.Get(n)
	if H < 1 || dq < 1 || dv < 1 || R < 1 {
		return nil, fmt.Errorf("attributes heads, qk_dim, v_dim, rank must be ≥ 1")
	}
	if q, err := need(n, 1, F32, 2); err != nil || q.Shape[1] != H*dq {
		return nil, fmt.Errorf("q must be f32[T,%d]: %v", H*dq, err)
	}
	if c, err := need(n, 2, F32, 2); err != nil || c.Shape[1] != R {
		return nil, fmt.Errorf("c_kv must be f32[T,%d]: %v", R, err)
	}
	if w, err := need(n, 3, F32, 2); err != nil || w.Shape[0] != H*(dq+dv) || w.Shape[1] != R {
		return nil, fmt.Errorf("kv_b weight must be f32[%d,%d]: %v", H*(dq+dv), R, err)
	}
	if _, err := need(n, 4, I32, 2); err != nil {
		return nil, err
	}
	return []OutType{out("o", F32, DimT, H*dv)}, nil
}

func inferMoERoute(n *Node) ([]OutType, error) {
	l, err := need(n, 0, F32, 2)
	if err != nil {
		return nil, err
	}
	E := l.Shape[1]
	if b, err := need(n, 1, F32, 1); err != nil || b.Shape[0] != E {
		return nil, fmt.Errorf("bias must be f32[%d]: %v", E, err)
	}
	K, G, TG := AttrTopK.Get(n), AttrGroups.Get(n), AttrTopKGroup.Get(n)
	if K < 1 || G < 1 || E%G != 0 || TG < 1 || TG > G || K > TG*(E/G) {
		return nil, fmt.Errorf("routing attributes topk=%d groups=%d topk_group=%d invalid for %d experts", K, G, TG, E)
	}
	return []OutType{out("idx", I32, l.Shape[0], K), out("w", F32, l.Shape[0], K)}, nil
}

func inferMoEExperts(n *Node) ([]OutType, error) {
	x, err := need(n, 0, F32, 2)
	if err != nil {
		return nil, err
	}
	idx, err := need(n, 1, I32, 2)
	if err != nil {
		return nil, err
	}
	if w, err := need(n, 2, F32, 2); err != nil || w.Shape[1] != idx.Shape[1] {
		return nil, fmt.Errorf("weights must match idx: %v", err)
	}
	g, err := need(n, 3, F32, 3)
	if err != nil {
		return nil, err
	}
	E, I, D := g.Shape[0], g.Shape[1], x.Shape[1]
	if g.Shape[2] != D {
		return nil, fmt.Errorf("gate experts are %v, input width %d", g.Shape, D)
	}
	if u, err := need(n, 4, F32, 3); err != nil || !slices.Equal(u.Shape, g.Shape) {
		return nil, fmt.Errorf("up experts must be [%d %d %d]: %v", E, I, D, err)
	}
	if d, err := need(n, 5, F32, 3); err != nil || !slices.Equal(d.Shape, []int{E, D, I}) {
		return nil, fmt.Errorf("down experts must be [%d %d %d]: %v", E, D, I, err)
	}
	return []OutType{out("y", F32, x.Shape...)}, nil
}

func inferStreamMean(n *Node) ([]OutType, error) {
	x, err := need(n, 0, F32, 3)
	if err != nil {
		return nil, err
	}
	return []OutType{out("y", F32, x.Shape[0], x.Shape[2])}, nil
}

func inferLastRows(n *Node) ([]OutType, error) {
	if _, err := need(n, 0, Host, -1); err != nil {
		return nil, err
	}
	x, err := need(n, 1, F32, 2)
	if err != nil {
		return nil, err
	}
	return []OutType{out("y", F32, DimS, x.Shape[1])}, nil
}

func inferSpanRows(n *Node) ([]OutType, error) {
	if _, err := need(n, 0, Host, -1); err != nil {
		return nil, err
	}
	x, err := need(n, 1, F32, 2)
	if err != nil {
		return nil, err
	}
	if x.Shape[0] != DimT {
		return nil, fmt.Errorf("input 1 (%s) must have the token dimension, got %s", x.Name, FormatShape(x.DType, x.Shape))
	}
	return []OutType{out("y", F32, DimR, x.Shape[1])}, nil
}

func inferConcatRows(n *Node) ([]OutType, error) {
	first, err := need(n, 0, F32, -1)
	if err != nil {
		return nil, err
	}
	rows := 0
	for i, in := range n.Inputs {
		if in.DType != F32 || len(in.Shape) != len(first.Shape) || in.Kind != Weight {
			return nil, fmt.Errorf("input %d (%s) must be an f32 weight of rank %d", i, in.Name, len(first.Shape))
		}
		if !slices.Equal(in.Shape[1:], first.Shape[1:]) {
			return nil, fmt.Errorf("input %d (%s) is %v, trailing dims must match %v", i, in.Name, in.Shape, first.Shape)
		}
		rows += in.Shape[0]
	}
	return []OutType{out("w", F32, append([]int{rows}, first.Shape[1:]...)...)}, nil
}

func inferStack(n *Node) ([]OutType, error) {
	first, err := need(n, 0, F32, -1)
	if err != nil {
		return nil, err
	}
	for i, in := range n.Inputs {
		if in.DType != F32 || in.Kind != Weight || !slices.Equal(in.Shape, first.Shape) {
			return nil, fmt.Errorf("input %d (%s) must be an f32 weight shaped %v", i, in.Name, first.Shape)
		}
	}
	return []OutType{out("w", F32, append([]int{len(n.Inputs)}, first.Shape...)...)}, nil
}

func inferSeqLengths(n *Node) ([]OutType, error) {
	if _, err := need(n, 0, Host, -1); err != nil {
		return nil, err
	}
	return []OutType{out("lengths", I32, DimS)}, nil
}

func inferLinearBatched(n *Node) ([]OutType, error) {
	x, err := need(n, 0, F32, 2)
	if err != nil {
		return nil, err
	}
	w, err := need(n, 1, F32, 3)
	if err != nil {
		return nil, err
	}
	G, N, K := w.Shape[0], w.Shape[1], w.Shape[2]
	if x.Shape[1] != G*K {
		return nil, fmt.Errorf("input width %d != groups·K = %d·%d", x.Shape[1], G, K)
	}
	outs := make([]OutType, G)
	for g := range outs {
		outs[g] = out(fmt.Sprintf("y%d", g), F32, x.Shape[0], N)
	}
	return outs, nil
}

// mhc_post_pre(o, R, post, comb, fn, base, scale[, norm_w]) → streams, h, post', comb'
func inferMHCPostPre(n *Node) ([]OutType, error) {
	if _, err := inferMHCPost(&Node{Inputs: n.Inputs[:4], Attrs: n.Attrs}); err != nil {
		return nil, err
	}
	R := n.Inputs[1]
	pre, err := inferMHCPre(&Node{Inputs: []*Value{R, n.Inputs[4], n.Inputs[5], n.Inputs[6]}, Attrs: n.Attrs})
	if err != nil {
		return nil, err
	}
	if len(n.Inputs) == 8 {
		w, err := need(n, 7, F32, 1)
		if err != nil {
			return nil, err
		}
		if w.Shape[0] != R.Shape[2] {
			return nil, fmt.Errorf("norm weight has %d elements, hidden is %d", w.Shape[0], R.Shape[2])
		}
		if eps, ok := AttrNormEps.Lookup(n); !ok || eps <= 0 {
			return nil, fmt.Errorf("attribute norm_eps must be > 0 when a norm weight is given")
		}
	}
	return append([]OutType{out("streams", F32, R.Shape...)}, pre...), nil
}
