package model

import (
	"encoding/json"
	"strconv"
	"strings"
)

// hfFloat is a float field of config.json, always written as a JSON float
// (10.0, not 10): transformers' strict config classes refuse an int where a
// float is declared (swiglu_limit, linear_lower_bound, …).
type hfFloat float64

// MarshalJSON writes the shortest exact form with a decimal point or an
// exponent.
func (f hfFloat) MarshalJSON() ([]byte, error) {
	s := strconv.FormatFloat(float64(f), 'g', -1, 64)
	if !strings.ContainsAny(s, ".eEn") { // n: NaN, Inf (refused by json below)
		s += ".0"
	}
	if strings.ContainsAny(s, "nN") {
		return json.Marshal(float64(f)) // the encoder's error for NaN/Inf
	}
	return []byte(s), nil
}

// hfFloatPtr is p as an hfFloat, nil (JSON null) when p is nil.
func hfFloatPtr(p *float64) any {
	if p == nil {
		return nil
	}
	return hfFloat(*p)
}

// TextConfigMap returns the text configuration as a Hugging Face text_config
// object (model_type "glm5_next_text") holding every field, including the
// derived per-layer lists. ParseConfig of the result gives back c.
func (c *Config) TextConfigMap() map[string]any {
	m := map[string]any{
		"model_type":                     "glm5_next_text",
		"vocab_size":                     c.VocabSize,
		"hidden_size":                    c.HiddenSize,
		"num_hidden_layers":              c.NumHiddenLayers,
		"intermediate_size":              c.IntermediateSize,
		"moe_intermediate_size":          c.MoEIntermediateSize,
		"n_routed_experts":               c.NRoutedExperts,
		"num_experts_per_tok":            c.NumExpertsPerTok,
		"n_shared_experts":               c.NSharedExperts,
		"n_group":                        c.NGroup,
		"topk_group":                     c.TopKGroup,
		"norm_topk_prob":                 c.NormTopKProb,
		"routed_scaling_factor":          hfFloat(c.RoutedScalingFactor),
		"first_k_dense_replace":          c.FirstKDenseReplace,
		"num_attention_heads":            c.NumAttentionHeads,
		"num_key_value_heads":            c.NumKeyValueHeads,
		"q_lora_rank":                    c.QLoraRank,
		"kv_lora_rank":                   c.KVLoraRank,
		"qk_nope_head_dim":               c.QKNopeHeadDim,
		"qk_rope_head_dim":               c.QKRopeHeadDim,
		"qk_head_dim":                    c.QKHeadDim(),
		"head_dim":                       c.QKRopeHeadDim,
		"v_head_dim":                     c.VHeadDim,
		"index_n_heads":                  c.IndexNHeads,
		"index_head_dim":                 c.IndexHeadDim,
		"index_topk":                     c.IndexTopK,
		"index_kpool":                    c.IndexKPool,
		"index_kpool_compress":           c.IndexKPoolCompress,
		"index_kpool_always_select_tail": c.IndexKPoolAlwaysSelectTail,
		"index_share_for_mtp_iteration":  c.IndexShareForMTPIteration,
		"linear_num_heads":               c.LinearNumHeads,
		"linear_head_dim":                c.LinearHeadDim,
		"linear_conv_kernel_dim":         c.LinearConvKernelDim,
		"linear_lower_bound":             hfFloatPtr(c.LinearLowerBound), // nil → null
		"safe_gate":                      c.LinearLowerBound != nil,
		"hc_mult":                        c.HCMult,
		"hc_sinkhorn_iters":              c.HCSinkhornIters,
		"hc_eps":                         hfFloat(c.HCEps),
		"rms_norm_eps":                   hfFloat(c.RMSNormEps),
		"swiglu_limit":                   hfFloatPtr(c.SwiGLULimit), // nil → null
		"max_position_embeddings":        c.MaxPositionEmbeddings,
		"tie_word_embeddings":            c.TieWordEmbeddings,
		"num_nextn_predict_layers":       c.NumNextNPredictLayers,
		"hidden_act":                     c.HiddenAct,
		"attention_bias":                 c.AttentionBias,
		"pad_token_id":                   c.PadTokenID,
		"bos_token_id":                   c.BOSTokenID,
		"layer_types":                    c.LayerTypes,
		"mlp_layer_types":                c.MLPLayerTypes,
		"indexer_types":                  c.IndexerTypes,
	}
	switch len(c.EOSTokenIDs) {
	case 0:
		m["eos_token_id"] = nil
	case 1:
		m["eos_token_id"] = c.EOSTokenIDs[0]
	default:
		m["eos_token_id"] = c.EOSTokenIDs
	}
	return m
}

// QuantConfigMap returns q as a Hugging Face quantization_config object.
func (q *QuantConfig) QuantConfigMap() map[string]any {
	m := map[string]any{
		"quant_method":      q.Method,
		"fmt":               q.Fmt,
		"activation_scheme": q.ActivationScheme,
		"weight_block_size": []int{q.WeightBlockSize[0], q.WeightBlockSize[1]},
	}
	if q.ModulesToNotConvert != nil {
		m["modules_to_not_convert"] = q.ModulesToNotConvert
	}
	return m
}

// MarshalHF returns a config.json in the released nested shape: top-level
// model_type "glm5_next" and architectures, the text_config, a top-level
// tie_word_embeddings, and quantization_config when c.Quant is set.
func (c *Config) MarshalHF() ([]byte, error) {
	top := map[string]any{
		"architectures":       []string{"Glm5NextForConditionalGeneration"},
		"model_type":          "glm5_next",
		"dtype":               "bfloat16",
		"tie_word_embeddings": c.TieWordEmbeddings,
		"text_config":         c.TextConfigMap(),
	}
	if c.Quant != nil {
		top["quantization_config"] = c.Quant.QuantConfigMap()
	}
	b, err := json.MarshalIndent(top, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
