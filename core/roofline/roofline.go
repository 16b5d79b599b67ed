// Package roofline counts the bytes a decode step must read from device
// memory: the floor under its time on a memory-bound device is those bytes
// over the memory bandwidth. bench divides the measured step time by it.
//
// The count is of what a step cannot avoid reading (weights and sequence
// state), not of what an implementation happens to move: activations,
// metadata and logits are left out (they are small at decode batch sizes),
// and so is any re-reading a kernel does.
package roofline

import (
	"fmt"
	"math"
	"strings"

	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
)

// Holding gives the bytes per element at which a device holds a
// checkpoint tensor of the catalog (model.Config.WeightCatalog); 0 when it
// does not hold it (an FP8 block-scale tensor folded into a dequantized
// weight).
type Holding func(w model.WeightSpec) float64

// Held is the holding of a backend that keeps FP8 e4m3 weights as FP8 (fp8:
// 1 byte an element, their "_scale_inv" block scales as F32, 4) or
// dequantizes them to bf16 (2 bytes, scales not held), keeps BF16 tensors
// as bf16 (2) and F32 tensors as F32 (4); with fp32Weights every tensor is
// held as F32 (FP8 scales folded in). A backend that also stores
// bf16-exact F32 tensors as bf16 (the CUDA backend does: the random
// presets' mHC, conv and bias tensors are) holds those at half of what is
// counted here; they are small.
func Held(fp8, fp32Weights bool) Holding {
	return func(w model.WeightSpec) float64 {
		scale := strings.HasSuffix(w.Name, model.ScaleSuffix)
		switch {
		case scale && fp8 && !fp32Weights:
			return 4
		case scale:
			return 0
		case fp32Weights:
			return 4
		case w.DType == safetensors.F8E4M3 && fp8:
			return 1
		case w.DType == safetensors.F8E4M3, w.DType == safetensors.BF16:
			return 2
		}
		return 4
	}
}

// Step is the bytes one decode step of B sequences at a context length
// reads, by term. Every term is for the whole batch.
type Step struct {
	B, Context int
	// Weights: every trunk weight that is not a routed expert, the
	// embedding table or lm_head (attention and KDA projections, norms,
	// mHC mixing, the router, shared experts, dense MLPs, the indexers'
	// weights, the final norm), once per step however many sequences
	// share it, at its held size (FP8: 1 byte an element plus its F32 block
	// scales; BF16: 2; F32: 4).
	Weights float64
	// Experts: the routed experts a step touches. B tokens each routed to
	// k of E experts (uniformly, independently) touch E·(1−(1−k/E)^B)
	// distinct experts per MoE layer in expectation (exactly k at B = 1,
	// E at most); each is read once, at one expert's held size (gate, up
	// and down with their scales). ExpertsPerLayer is that expectation,
	// ExpertBytes one expert's size, MoELayers the trunk's MoE layers.
	Experts         float64
	ExpertsPerLayer float64
	ExpertBytes     float64
	MoELayers       int
	// Embedding: the B embedding rows the step's tokens look up (hidden
	// elements each at the table's held size), not the table.
	Embedding float64
	// LMHead: the whole output projection (the embedding table when the
	// embeddings are tied), every vocabulary row for any B.
	LMHead float64
	// KDAState: per sequence and KDA layer the recurrent state
	// (linear_num_heads·linear_head_dim² F32), read and written: 2× its
	// bytes.
	KDAState float64
	// Conv: per sequence and KDA layer the short-conv window (the last
	// linear_conv_kernel_dim−1 positions of q, k and v: 3·linear_num_heads·
	// linear_head_dim·(kernel−1) F32), read and written: 2× its bytes.
	Conv float64
	// Latents: per sequence and DSA layer the MLA latent rows attended,
	// min(context, index_topk) rows of kv_lora_rank F32 (the selection's
	// always-selected tail, at most index_kpool−1 more rows, is left out).
	Latents float64
	// IndexKeys: per sequence and layer with its own indexer, the pooled
	// keys it scores, ceil(context/index_kpool) rows of index_head_dim F32.
	IndexKeys float64
}

// Total is the sum of the terms: the bytes the step reads.
func (s Step) Total() float64 {
	return s.Weights + s.Experts + s.Embedding + s.LMHead + s.KDAState + s.Conv + s.Latents + s.IndexKeys
}

// Term is one named term of a Step.
type Term struct {
	Name  string
	Bytes float64
}

// Terms lists the step's terms in a fixed order under stable names.
func (s Step) Terms() []Term {
	return []Term{{"weights", s.Weights}, {"experts", s.Experts}, {"embedding_rows", s.Embedding}, {"lm_head", s.LMHead},
		{"kda_state", s.KDAState}, {"conv_windows", s.Conv}, {"mla_latents", s.Latents}, {"indexer_keys", s.IndexKeys}}
}

// Seconds is the time reading Total takes at bw bytes per second.
func (s Step) Seconds(bw float64) float64 { return s.Total() / bw }

// ExpectedExperts is E·(1−(1−k/E)^B): the expected number of distinct
// experts B tokens touch, each routed to k of E uniformly (exactly k at B =
// 1).
func ExpectedExperts(E, k, B int) float64 {
	if B == 1 || k >= E {
		return float64(min(k, E))
	}
	return float64(E) * (1 - math.Pow(1-float64(k)/float64(E), float64(B)))
}

// Decode counts the bytes one decode step of B sequences, each at context
// tokens, reads from cfg's trunk (MTP layers excluded) with the weights
// held as held says. The catalog is the FP8 layout's when cfg has a
// quantization_config.
func Decode(cfg *model.Config, held Holding, B, context int) (Step, error) {
	if B < 1 || context < 1 {
		return Step{}, fmt.Errorf("roofline: batch %d and context %d must be ≥ 1", B, context)
	}
	s := Step{B: B, Context: context}
	var embed, lmHead, routed float64
	for _, w := range cfg.WeightCatalog(cfg.Quant != nil) {
		n := 1
		for _, d := range w.Shape {
			n *= d
		}
		bytes := float64(n) * held(w)
		switch {
		case w.Name == model.EmbedName:
			embed = bytes
			s.Embedding = float64(B) * float64(cfg.HiddenSize) * held(w)
		case w.Name == model.LMHeadName:
			lmHead = bytes
		case strings.Contains(w.Name, ".mlp.experts."):
			routed += bytes
		default:
			s.Weights += bytes
		}
	}
	if cfg.TieWordEmbeddings {
		lmHead = embed
	}
	s.LMHead = lmHead
	for _, l := range cfg.TrunkLayers() {
		if cfg.IsMoE(l) {
			s.MoELayers++
		}
	}
	if s.MoELayers > 0 && cfg.NRoutedExperts > 0 {
		s.ExpertBytes = routed / float64(s.MoELayers*cfg.NRoutedExperts)
		s.ExpertsPerLayer = ExpectedExperts(cfg.NRoutedExperts, cfg.NumExpertsPerTok, B)
		s.Experts = float64(s.MoELayers) * s.ExpertsPerLayer * s.ExpertBytes
	}
	const f32 = 4
	fb := float64(B)
	for _, l := range cfg.TrunkLayers() {
		if cfg.IsKDA(l) {
			s.KDAState += fb * 2 * f32 * float64(cfg.KDAStateLen())
			s.Conv += fb * 2 * f32 * float64(cfg.KDAConvLen())
		}
		if cfg.IsDSA(l) {
			s.Latents += fb * f32 * float64(min(context, cfg.IndexTopK)) * float64(cfg.KVLoraRank)
		}
		if cfg.HasOwnIndexer(l) && cfg.IndexKPool > 0 {
			pools := (context + cfg.IndexKPool - 1) / cfg.IndexKPool
			s.IndexKeys += fb * f32 * float64(pools) * float64(cfg.IndexHeadDim)
		}
	}
	return s, nil
}
