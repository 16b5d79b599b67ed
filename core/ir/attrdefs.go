package ir

// The attribute names of the op set. Each is declared, with its type,
// default and meaning, by the ops that take it (opset.go, opset_extra.go:
// OpDef.Attrs), or by a trait (traitAttrs); code reads and writes them
// through these names (AttrEps.Get(n), ir.NewAttrs(AttrEps.Is(1e-5))).
// The names are part of the IR's text format and of the plugin protocol.
var (
	// Any op.

	// AttrStream places a node on a stream: 0 (absent) the main one; 1 a
	// side stream, where a backend with streams (cuda) may run it beside
	// the main-stream nodes that follow it, waiting only for the values it
	// reads (a pass sets it: moe-shared-overlap). It never changes a
	// result; backends without streams ignore it.
	AttrStream = Attr[int]{"stream"}

	// Ops with the GEMM trait: per token-count bucket (ascending), the CPU
	// kernel's column grain and row blocking, or a device backend's kernel
	// choices (one string, ";" between buckets) and the GEMM kind they
	// were measured for. A batch of T rows uses the smallest bucket ≥ T,
	// else the largest (TuneBucket). prefill-autotune sets them.
	AttrTuneBuckets  = Attr[[]int]{"tune_buckets"}
	AttrTuneColGrain = Attr[[]int]{"tune_col_grain"}
	AttrTuneRowBlock = Attr[[]int]{"tune_row_block"}
	AttrTuneKernels  = Attr[string]{"tune_kernels"}
	AttrTuneKind     = Attr[string]{"tune_kind"}

	// Ops with the ReadsLengths trait: AttrLengths marks a node the
	// host-length-reuse pass rewired to the host batch metadata ("host");
	// AttrLengthsFrom says where its lengths' values come from: "batch"
	// (the batch's own) or "accept" (a speculative step's accept lengths,
	// known only after that step: never read ahead from the host).
	AttrLengths     = Attr[string]{"lengths"}
	AttrLengthsFrom = Attr[string]{"lengths_from"}

	// Norms and mHC.
	AttrEps       = Attr[float64]{"eps"}
	AttrHCEps     = Attr[float64]{"hc_eps"}
	AttrIters     = Attr[int]{"iters"}
	AttrSite      = Attr[string]{"site"}
	AttrPostSite  = Attr[string]{"post_site"}
	AttrNormEps   = Attr[float64]{"norm_eps"}
	AttrMaxTokens = Attr[int]{"max_tokens"}

	// Embedding, GEMMs and activations.
	AttrStreams = Attr[int]{"streams"}
	AttrSplits  = Attr[[]int]{"splits"}
	AttrFused   = Attr[string]{"fused"}
	AttrLimit   = Attr[float64]{"limit"}
	AttrStart   = Attr[int]{"start"}
	AttrEnd     = Attr[int]{"end"}

	// Tensor parallelism (opset_tp.go): a collective's group size, a
	// derived weight slice's axis, an embedding shard's first row.
	AttrRanks      = Attr[int]{"ranks"}
	AttrAxis       = Attr[int]{"axis"}
	AttrVocabStart = Attr[int]{"vocab_start"}

	// KDA.
	AttrKernel     = Attr[int]{"kernel"}
	AttrHeads      = Attr[int]{"heads"}
	AttrHeadDim    = Attr[int]{"head_dim"}
	AttrAlgo       = Attr[string]{"algo"}
	AttrLowerBound = Attr[float64]{"lower_bound"}

	// DSA and MLA.
	AttrKPool      = Attr[int]{"kpool"}
	AttrTopK       = Attr[int]{"topk"}
	AttrDim        = Attr[int]{"dim"}
	AttrTail       = Attr[bool]{"tail"}
	AttrShare      = Attr[string]{"share"}
	AttrShareExtra = Attr[int]{"share_extra"}
	AttrQKDim      = Attr[int]{"qk_dim"}
	AttrVDim       = Attr[int]{"v_dim"}
	AttrRank       = Attr[int]{"rank"}
	AttrScale      = Attr[float64]{"scale"}

	// DFlash attention.
	AttrKVHeads   = Attr[int]{"kv_heads"}
	AttrRopeTheta = Attr[float64]{"rope_theta"}
	AttrBlock     = Attr[int]{"block"}

	// MoE.
	AttrGroups    = Attr[int]{"groups"}
	AttrTopKGroup = Attr[int]{"topk_group"}
	AttrNormalize = Attr[bool]{"normalize"}
	AttrScaling   = Attr[float64]{"scaling"}
	AttrExpert    = Attr[int]{"expert"}
)

// Values of AttrAlgo (kda_attn): the delta rule's form.
const (
	KDAAuto      = "auto"      // per sequence: recurrent for one token, else chunked
	KDAChunked   = "chunked"   // chunked (prefill, extend)
	KDARecurrent = "recurrent" // token by token (decode)
)

// Values of AttrLengths and AttrLengthsFrom.
const (
	LengthsHost   = "host"
	LengthsBatch  = "batch"
	LengthsAccept = "accept"
)

// Attributes every op takes, whatever its traits.
var anyOpAttrs = []AttrDef{
	AttrStream.Default(0, "stream: 0 the main one, 1 a side stream a backend with streams may run it on (moe-shared-overlap sets it; never changes a result)"),
}

// gemmAttrs are the GEMM trait's attributes.
var gemmAttrs = []AttrDef{
	AttrTuneBuckets.Optional("token-count buckets (ascending) the tuned choices are for (prefill-autotune)"),
	AttrTuneColGrain.Optional("the CPU GEMM's column grain per bucket"),
	AttrTuneRowBlock.Optional("the CPU GEMM's row blocking per bucket"),
	AttrTuneKernels.Optional(`a device backend's kernel choice per bucket, ";" between buckets`),
	AttrTuneKind.Optional("the GEMM kind the device choices were measured for (they apply only to it)"),
}

// lengthsAttrs are the ReadsLengths trait's attributes.
var lengthsAttrs = []AttrDef{
	AttrLengths.Optional(`"host" when host-length-reuse rewired the lengths input to the host batch metadata`),
	AttrLengthsFrom.Default(LengthsBatch, `where the lengths' values come from: "batch" (the batch's own) or "accept" (the previous speculative step's accept lengths)`),
}

// traitAttrs lists the attributes d's traits give it, beside its own.
func traitAttrs(d OpDef) [][]AttrDef {
	out := [][]AttrDef{anyOpAttrs}
	if d.GEMM != nil {
		out = append(out, gemmAttrs)
	}
	if d.ReadsLengths {
		out = append(out, lengthsAttrs)
	}
	return out
}
