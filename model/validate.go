package model

import (
	"errors"
	"fmt"
	"math"
)

// maxDim bounds every size field so that products of sizes cannot overflow.
const maxDim = 1 << 24

// Bounds of the fields whose size is not a tensor dimension. They are far
// above the released model's values (1,048,576 positions, 20 Sinkhorn
// iterations, a 4-wide conv, 45 layers) and far below what would exhaust a
// machine or wrap an integer.
const (
	// MaxPositionEmbeddings bounds max_position_embeddings (4 Mi tokens).
	MaxPositionEmbeddings = 1 << 22
	// MaxSinkhornIters bounds hc_sinkhorn_iters (run per token and layer).
	MaxSinkhornIters = 1000
	// MaxConvKernel bounds linear_conv_kernel_dim (a per-slot window).
	MaxConvKernel = 64
	// MaxLayers bounds num_hidden_layers.
	MaxLayers = 4096
	// MaxParameters bounds the weight catalog's element count (2^40).
	MaxParameters = int64(1) << 40
)

// Validate checks the configuration for values the engine cannot run. Every
// violation is reported (joined), each naming the field and prefixed by the
// config's Source, e.g. "config.json: index_topk (16) must be a multiple of
// index_kpool (3)".
func (c *Config) Validate() error {
	src := c.Source
	if src == "" {
		src = "config"
	}
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", src, fmt.Sprintf(format, args...)))
	}
	positive := func(name string, v int) {
		switch {
		case v <= 0:
			fail("%s (%d) must be positive", name, v)
		case v > maxDim:
			fail("%s (%d) is implausibly large (more than %d)", name, v, maxDim)
		}
	}
	L := c.NumHiddenLayers
	positive("vocab_size", c.VocabSize)
	positive("hidden_size", c.HiddenSize)
	positive("num_hidden_layers", L)
	positive("num_attention_heads", c.NumAttentionHeads)
	positive("num_key_value_heads", c.NumKeyValueHeads)
	positive("kv_lora_rank", c.KVLoraRank)
	positive("qk_nope_head_dim", c.QKNopeHeadDim)
	positive("v_head_dim", c.VHeadDim)
	positive("linear_num_heads", c.LinearNumHeads)
	positive("linear_head_dim", c.LinearHeadDim)
	positive("linear_conv_kernel_dim", c.LinearConvKernelDim)
	positive("index_n_heads", c.IndexNHeads)
	positive("index_head_dim", c.IndexHeadDim)
	positive("index_topk", c.IndexTopK)
	positive("index_kpool", c.IndexKPool)
	if c.MaxPositionEmbeddings <= 0 || c.MaxPositionEmbeddings > MaxPositionEmbeddings {
		fail("max_position_embeddings (%d) must be in [1, %d]", c.MaxPositionEmbeddings, MaxPositionEmbeddings)
	}
	if c.QLoraRank <= 0 {
		fail("q_lora_rank (%d) must be positive: glm5_next requires the q LoRA projection", c.QLoraRank)
	} else if c.QLoraRank > maxDim {
		fail("q_lora_rank (%d) is implausibly large (more than %d)", c.QLoraRank, maxDim)
	}
	if c.IndexTopK > c.MaxPositionEmbeddings && c.MaxPositionEmbeddings > 0 {
		fail("index_topk (%d) must not exceed max_position_embeddings (%d): it selects among the positions", c.IndexTopK, c.MaxPositionEmbeddings)
	}
	if L > MaxLayers {
		fail("num_hidden_layers (%d) must be at most %d", L, MaxLayers)
	}
	if c.LinearConvKernelDim > MaxConvKernel {
		fail("linear_conv_kernel_dim (%d) must be at most %d", c.LinearConvKernelDim, MaxConvKernel)
	}
	if c.FirstKDenseReplace < 0 || c.FirstKDenseReplace > maxDim {
		fail("first_k_dense_replace (%d) must be in [0, %d]", c.FirstKDenseReplace, maxDim)
	}
	tokenID := func(name string, id int) {
		if id < 0 || (c.VocabSize > 0 && id >= c.VocabSize) {
			fail("%s (%d) must be a token id in [0, vocab_size %d)", name, id, c.VocabSize)
		}
	}
	if c.PadTokenID != nil {
		tokenID("pad_token_id", *c.PadTokenID)
	}
	if c.BOSTokenID != nil {
		tokenID("bos_token_id", *c.BOSTokenID)
	}
	for i, id := range c.EOSTokenIDs {
		tokenID(fmt.Sprintf("eos_token_id[%d]", i), id)
	}
	if c.NumAttentionHeads != c.NumKeyValueHeads {
		fail("num_attention_heads (%d) must equal num_key_value_heads (%d)", c.NumAttentionHeads, c.NumKeyValueHeads)
	}
	if c.QKRopeHeadDim != 0 {
		fail("qk_rope_head_dim (%d) must be 0: glm5_next MLA uses no RoPE", c.QKRopeHeadDim)
	}
	if c.IndexKPool > 0 && c.IndexTopK%c.IndexKPool != 0 {
		fail("index_topk (%d) must be a multiple of index_kpool (%d)", c.IndexTopK, c.IndexKPool)
	}
	if c.NumNextNPredictLayers < 0 {
		fail("num_nextn_predict_layers (%d) must not be negative", c.NumNextNPredictLayers)
	} else if L+c.NumNextNPredictLayers > MaxLayers {
		fail("num_hidden_layers + num_nextn_predict_layers (%d) must be at most %d", L+c.NumNextNPredictLayers, MaxLayers)
	}
	if c.HCMult < 1 || c.HCMult > 64 {
		fail("hc_mult (%d) must be at least 1 (and at most 64)", c.HCMult)
	}
	if c.HCSinkhornIters < 1 || c.HCSinkhornIters > MaxSinkhornIters {
		fail("hc_sinkhorn_iters (%d) must be in [1, %d]", c.HCSinkhornIters, MaxSinkhornIters)
	}
	if c.NSharedExperts > maxDim || c.QKRopeHeadDim > maxDim || c.NumNextNPredictLayers > maxDim {
		fail("n_shared_experts (%d), qk_rope_head_dim (%d) and num_nextn_predict_layers (%d) must be at most %d",
			c.NSharedExperts, c.QKRopeHeadDim, c.NumNextNPredictLayers, maxDim)
	}
	posFloat := func(name string, v float64) {
		if !(v > 0) || math.IsInf(v, 0) {
			fail("%s (%g) must be a positive finite number", name, v)
		}
	}
	posFloat("hc_eps", c.HCEps)
	posFloat("rms_norm_eps", c.RMSNormEps)
	posFloat("routed_scaling_factor", c.RoutedScalingFactor)
	if c.SwiGLULimit != nil {
		posFloat("swiglu_limit", *c.SwiGLULimit)
	}
	if c.LinearLowerBound != nil && (math.IsNaN(*c.LinearLowerBound) || math.IsInf(*c.LinearLowerBound, 0) || *c.LinearLowerBound >= 0) {
		fail("linear_lower_bound (%g) must be a negative finite number", *c.LinearLowerBound)
	}
	if c.HiddenAct != "silu" {
		fail("hidden_act %q is not supported (want silu)", c.HiddenAct)
	}
	if c.AttentionBias {
		fail("attention_bias true is not supported")
	}

	// Per-layer lists.
	if len(c.LayerTypes) != L {
		fail("layer_types has %d entries, want num_hidden_layers (%d)", len(c.LayerTypes), L)
	}
	for i, t := range c.LayerTypes {
		if t != LayerKDA && t != LayerDSA {
			fail("layer_types[%d] is %q, want %q or %q", i, t, LayerKDA, LayerDSA)
		}
	}
	if len(c.MLPLayerTypes) != L {
		fail("mlp_layer_types has %d entries, want num_hidden_layers (%d)", len(c.MLPLayerTypes), L)
	}
	anyMoE, anyDense := c.HasMTP(), false // MTP layers are MoE layers
	for i, t := range c.MLPLayerTypes {
		switch t {
		case MLPSparse:
			anyMoE = true
		case MLPDense:
			anyDense = true
		default:
			fail("mlp_layer_types[%d] is %q, want %q or %q", i, t, MLPDense, MLPSparse)
		}
	}
	if len(c.IndexerTypes) != L {
		fail("indexer_types has %d entries, want num_hidden_layers (%d)", len(c.IndexerTypes), L)
	}
	for i, t := range c.IndexerTypes {
		if t != IndexerFull && t != IndexerShared {
			fail("indexer_types[%d] is %q, want %q or %q", i, t, IndexerFull, IndexerShared)
		}
	}
	// A shared DSA layer reuses the selection of the nearest previous DSA
	// layer, which (transitively) must come from a full one.
	if len(c.IndexerTypes) == L && len(c.LayerTypes) == L {
		prevDSA, sawFull := -1, false
		for i := 0; i < L; i++ {
			if c.LayerTypes[i] != LayerDSA {
				continue
			}
			if c.IndexerTypes[i] == IndexerShared {
				if prevDSA < 0 || !sawFull {
					fail("indexer_types[%d] is shared but no earlier DSA layer runs a full indexer", i)
				}
			} else {
				sawFull = true
			}
			prevDSA = i
		}
	}

	if anyDense {
		positive("intermediate_size", c.IntermediateSize)
	}
	if anyMoE {
		positive("moe_intermediate_size", c.MoEIntermediateSize)
		positive("n_routed_experts", c.NRoutedExperts)
		positive("num_experts_per_tok", c.NumExpertsPerTok)
		positive("n_group", c.NGroup)
		positive("topk_group", c.TopKGroup)
		if c.NSharedExperts < 0 {
			fail("n_shared_experts (%d) must not be negative", c.NSharedExperts)
		}
		if c.NGroup > 0 && c.NRoutedExperts > 0 && c.TopKGroup > 0 {
			if c.NRoutedExperts%c.NGroup != 0 {
				fail("n_routed_experts (%d) must be a multiple of n_group (%d)", c.NRoutedExperts, c.NGroup)
			} else {
				per := c.NRoutedExperts / c.NGroup
				if c.NGroup > 1 && per < 2 {
					fail("n_routed_experts/n_group (%d) must be at least 2 when n_group (%d) > 1: group scores sum each group's top 2", per, c.NGroup)
				}
				if c.TopKGroup > c.NGroup {
					fail("topk_group (%d) must not exceed n_group (%d)", c.TopKGroup, c.NGroup)
				} else if c.NumExpertsPerTok > c.TopKGroup*per {
					fail("num_experts_per_tok (%d) must not exceed the %d experts in topk_group (%d) groups of %d",
						c.NumExpertsPerTok, c.TopKGroup*per, c.TopKGroup, per)
				}
			}
		}
	}
	if q := c.Quant; q != nil {
		if q.Method != "fp8" {
			fail("quantization_config.quant_method %q is not supported (want fp8)", q.Method)
		}
		if q.Fmt != "e4m3" {
			fail("quantization_config.fmt %q is not supported (want e4m3)", q.Fmt)
		}
		if q.WeightBlockSize[0] <= 0 || q.WeightBlockSize[1] <= 0 {
			fail("quantization_config.weight_block_size %v must be positive", q.WeightBlockSize)
		}
	}
	if len(errs) == 0 {
		var n int64
		for _, w := range append(c.WeightCatalog(false), c.MTPWeightCatalog(false)...) {
			e := int64(1)
			for _, d := range w.Shape {
				e *= int64(d)
			}
			n += e
		}
		if n > MaxParameters {
			fail("the weights have %d parameters, more than the %d this engine accepts (hidden_size, vocab_size, n_routed_experts and the intermediate sizes multiply)", n, MaxParameters)
		}
	}
	return errors.Join(errs...)
}
