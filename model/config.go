// Package model reads GLM-5.3-Flash (Hugging Face "glm5_next") checkpoints:
// the text configuration with transformers' defaults and derivations, the
// catalog of trunk weights every layer must have, and a checkpoint reader
// that serves tensors as float32 (dequantizing FP8 e4m3 block-scaled weights).
package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
)

// LayerType is a layer's token mixer.
type LayerType string

// Token mixers.
const (
	// LayerKDA is Kimi Delta Attention (linear attention).
	LayerKDA LayerType = "linear_attention"
	// LayerDSA is MLA with a DeepSeek sparse-attention (k-pool) indexer.
	LayerDSA LayerType = "deepseek_sparse_attention"
)

// MLPType is a layer's feed-forward block.
type MLPType string

// Feed-forward kinds.
const (
	// MLPDense is a clamped-SwiGLU dense MLP of width intermediate_size.
	MLPDense MLPType = "dense"
	// MLPSparse is a sigmoid-routed mixture of experts plus shared experts.
	MLPSparse MLPType = "sparse"
)

// IndexerType says whether a DSA layer runs its own indexer.
type IndexerType string

// Indexer kinds.
const (
	// IndexerFull runs the layer's own lightning indexer.
	IndexerFull IndexerType = "full"
	// IndexerShared reuses the top-k selection of the nearest previous DSA layer.
	IndexerShared IndexerType = "shared"
)

// QuantConfig is the checkpoint's quantization_config (FP8 block quantization).
type QuantConfig struct {
	Method              string // quant_method, "fp8"
	Fmt                 string // "e4m3"
	ActivationScheme    string // "dynamic"
	WeightBlockSize     [2]int // rows, columns per scale block; [128, 128]
	ModulesToNotConvert []string
}

// Config is the text configuration of a glm5_next model (the text_config of
// the released multimodal config.json), with transformers' defaults applied
// and the per-layer lists derived.
type Config struct {
	// Source names where the config came from (used in error messages).
	Source string

	VocabSize           int
	HiddenSize          int
	NumHiddenLayers     int
	IntermediateSize    int // dense MLP width
	MoEIntermediateSize int // per routed expert; the shared expert is this × NSharedExperts
	NRoutedExperts      int
	NumExpertsPerTok    int
	NSharedExperts      int
	NGroup              int
	TopKGroup           int
	NormTopKProb        bool
	RoutedScalingFactor float64
	FirstKDenseReplace  int // only used to derive MLPLayerTypes

	NumAttentionHeads int
	NumKeyValueHeads  int
	QLoraRank         int
	KVLoraRank        int
	QKNopeHeadDim     int
	QKRopeHeadDim     int
	VHeadDim          int

	IndexNHeads                int
	IndexHeadDim               int
	IndexTopK                  int
	IndexKPool                 int
	IndexKPoolCompress         bool
	IndexKPoolAlwaysSelectTail bool
	// IndexShareForMTPIteration: MTP draft steps ≥ 1 reuse step 0's
	// indexer selection (index_share_for_mtp_iteration; default true, the
	// released checkpoint's value).
	IndexShareForMTPIteration bool

	LinearNumHeads      int
	LinearHeadDim       int
	LinearConvKernelDim int
	// LinearLowerBound is the KDA "safe gate" multiplier (g = bound·σ(·));
	// nil means the plain softplus gate.
	LinearLowerBound *float64

	HCMult          int
	HCSinkhornIters int
	HCEps           float64
	RMSNormEps      float64
	// SwiGLULimit clamps gate (max) and up (both sides); nil means no clamp.
	SwiGLULimit *float64

	MaxPositionEmbeddings int
	TieWordEmbeddings     bool
	NumNextNPredictLayers int
	HiddenAct             string
	AttentionBias         bool
	PadTokenID            *int
	BOSTokenID            *int
	EOSTokenIDs           []int

	LayerTypes    []LayerType
	MLPLayerTypes []MLPType
	IndexerTypes  []IndexerType

	// Quant is the quantization_config, nil for an unquantized checkpoint.
	Quant *QuantConfig
}

// IsKDA reports whether layer i uses Kimi Delta Attention.
func (c *Config) IsKDA(i int) bool {
	return i >= 0 && i < len(c.LayerTypes) && c.LayerTypes[i] == LayerKDA
}

// IsDSA reports whether layer i uses MLA with the sparse-attention indexer.
// MTP layers (IsMTP) are DSA layers.
func (c *Config) IsDSA(i int) bool {
	return i >= 0 && i < len(c.LayerTypes) && c.LayerTypes[i] == LayerDSA || c.IsMTP(i)
}

// IsMoE reports whether layer i has a mixture-of-experts feed-forward block.
// MTP layers (IsMTP) are MoE layers.
func (c *Config) IsMoE(i int) bool {
	return i >= 0 && i < len(c.MLPLayerTypes) && c.MLPLayerTypes[i] == MLPSparse || c.IsMTP(i)
}

// HasOwnIndexer reports whether layer i is a DSA layer that runs its own
// indexer (every MTP layer does).
func (c *Config) HasOwnIndexer(i int) bool {
	return c.IsDSA(i) && (i >= len(c.IndexerTypes) || c.IndexerTypes[i] != IndexerShared)
}

// HasMTP reports whether the model declares MTP (NextN) draft layers
// (num_nextn_predict_layers > 0).
func (c *Config) HasMTP() bool { return c.NumNextNPredictLayers > 0 }

// IsMTP reports whether layer i is an MTP layer: num_hidden_layers ≤ i <
// num_hidden_layers + num_nextn_predict_layers (layer 45 of the released
// model). An MTP layer is a plain pre-norm DSA + MoE decoder layer without
// mHC, with its own full indexer (architecture §7).
func (c *Config) IsMTP(i int) bool {
	return i >= c.NumHiddenLayers && i < c.NumHiddenLayers+c.NumNextNPredictLayers
}

// MTPLayer returns the layer index of MTP layer k (num_hidden_layers + k).
func (c *Config) MTPLayer(k int) int { return c.NumHiddenLayers + k }

// TrunkLayers lists the trunk's layer indices, 0 … num_hidden_layers−1.
func (c *Config) TrunkLayers() []int { return layerRange(0, c.NumHiddenLayers) }

// MTPLayers lists the MTP layers' indices (empty without MTP).
func (c *Config) MTPLayers() []int {
	return layerRange(c.NumHiddenLayers, c.NumHiddenLayers+max(c.NumNextNPredictLayers, 0))
}

func layerRange(lo, hi int) []int {
	out := make([]int, 0, max(hi-lo, 0))
	for i := lo; i < hi; i++ {
		out = append(out, i)
	}
	return out
}

// IndexerSource returns the layer whose indexer selection DSA layer i uses:
// i itself for a full indexer, else the nearest previous DSA layer's source.
// It returns -1 when i is not a DSA layer or no source exists.
func (c *Config) IndexerSource(i int) int {
	if !c.IsDSA(i) {
		return -1
	}
	if c.HasOwnIndexer(i) {
		return i
	}
	for j := i - 1; j >= 0; j-- {
		if c.IsDSA(j) {
			return c.IndexerSource(j)
		}
	}
	return -1
}

// QKHeadDim is qk_nope_head_dim + qk_rope_head_dim.
func (c *Config) QKHeadDim() int { return c.QKNopeHeadDim + c.QKRopeHeadDim }

// KDAProjDim is the width of each KDA q/k/v projection, linear_num_heads × linear_head_dim.
func (c *Config) KDAProjDim() int { return c.LinearNumHeads * c.LinearHeadDim }

// KDAConvLen is the length of one KDA layer's short-conv window: the last
// linear_conv_kernel_dim−1 positions of its q, k and v projections.
func (c *Config) KDAConvLen() int { return 3 * c.KDAProjDim() * (c.LinearConvKernelDim - 1) }

// KDAStateLen is the length of one KDA layer's recurrent state: a
// linear_head_dim² matrix per head.
func (c *Config) KDAStateLen() int { return c.LinearNumHeads * c.LinearHeadDim * c.LinearHeadDim }

// HCMix is the length of the mHC mixing vector, (2+H)·H for H = hc_mult.
func (c *Config) HCMix() int { return (2 + c.HCMult) * c.HCMult }

// SharedIntermediateSize is the width of the shared-expert MLP,
// moe_intermediate_size × n_shared_experts.
func (c *Config) SharedIntermediateSize() int { return c.MoEIntermediateSize * c.NSharedExperts }

// Clone returns a deep copy.
func (c *Config) Clone() *Config {
	d := *c
	d.LinearLowerBound = clonePtr(c.LinearLowerBound)
	d.SwiGLULimit = clonePtr(c.SwiGLULimit)
	d.PadTokenID = clonePtr(c.PadTokenID)
	d.BOSTokenID = clonePtr(c.BOSTokenID)
	d.EOSTokenIDs = append([]int(nil), c.EOSTokenIDs...)
	d.LayerTypes = append([]LayerType(nil), c.LayerTypes...)
	d.MLPLayerTypes = append([]MLPType(nil), c.MLPLayerTypes...)
	d.IndexerTypes = append([]IndexerType(nil), c.IndexerTypes...)
	if c.Quant != nil {
		q := *c.Quant
		q.ModulesToNotConvert = append([]string(nil), c.Quant.ModulesToNotConvert...)
		d.Quant = &q
	}
	return &d
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// topLevelOnly are keys of a nested config that are never forwarded to text_config.
var topLevelOnly = map[string]bool{
	"model_type": true, "text_config": true, "vision_config": true, "architectures": true,
	"quantization_config": true, "transformers_version": true, "auto_map": true,
}

// ParseConfig parses a config.json. It accepts the nested multimodal shape
// (model_type "glm5_next" with a text_config; top-level text fields missing
// from text_config are forwarded to it, quantization_config stays top-level)
// and the flat shape (model_type "glm5_next_text", or "glm5_next" without a
// text_config). Missing fields take transformers' defaults and the per-layer
// lists are derived as transformers does. vision_config and unknown keys are
// ignored. source names the file in error messages. The result is not
// validated; call Validate.
func ParseConfig(data []byte, source string) (*Config, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var top map[string]any
	if err := dec.Decode(&top); err != nil {
		return nil, fmt.Errorf("%s: invalid JSON: %w", source, err)
	}
	if top == nil {
		return nil, fmt.Errorf("%s: config is not a JSON object", source)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: invalid JSON: trailing data after the object", source)
	}
	mt, hasMT := top["model_type"]
	if hasMT {
		s, ok := mt.(string)
		if !ok || (s != "glm5_next" && s != "glm5_next_text") {
			return nil, fmt.Errorf("%s: model_type %v is not glm5_next or glm5_next_text", source, jsonText(mt))
		}
	}
	text := top
	if tc, ok := top["text_config"]; ok && tc != nil && mt != "glm5_next_text" {
		tm, ok := tc.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s: text_config must be an object, got %s", source, jsonText(tc))
		}
		if tmt, ok := tm["model_type"]; ok && tmt != "glm5_next_text" {
			return nil, fmt.Errorf("%s: text_config.model_type %s is not glm5_next_text", source, jsonText(tmt))
		}
		text = make(map[string]any, len(tm)+len(top))
		for k, v := range tm {
			text[k] = v
		}
		for k, v := range top {
			if _, have := text[k]; !have && !topLevelOnly[k] {
				text[k] = v
			}
		}
		if q, ok := top["quantization_config"]; ok {
			text["quantization_config"] = q
		}
	}
	p := &parser{m: text, src: source}
	c := p.config()
	if err := errors.Join(p.errs...); err != nil {
		return nil, err
	}
	return c, nil
}

func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// parser reads typed fields out of a decoded JSON object, recording errors
// that name the field.
type parser struct {
	m    map[string]any
	src  string
	errs []error
}

func (p *parser) fail(key string, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s: %s: %s", p.src, key, fmt.Sprintf(format, args...)))
}

// get returns the value and whether the key is present with a non-null value.
func (p *parser) get(key string) (any, bool) {
	v, ok := p.m[key]
	return v, ok && v != nil
}

func toInt(v any) (int, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	if i, err := n.Int64(); err == nil {
		if int64(int(i)) != i {
			return 0, false
		}
		return int(i), true
	}
	f, err := n.Float64()
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0, false
	}
	return int(f), true
}

func (p *parser) int(key string, def int) int {
	v, ok := p.get(key)
	if !ok {
		return def
	}
	i, ok := toInt(v)
	if !ok {
		p.fail(key, "want an integer, got %s", jsonText(v))
		return def
	}
	return i
}

func (p *parser) optInt(key string) *int {
	v, ok := p.get(key)
	if !ok {
		return nil
	}
	i, ok := toInt(v)
	if !ok {
		p.fail(key, "want an integer, got %s", jsonText(v))
		return nil
	}
	return &i
}

func toFloat(v any) (float64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	f, err := n.Float64()
	return f, err == nil
}

func (p *parser) float(key string, def float64) float64 {
	v, ok := p.get(key)
	if !ok {
		return def
	}
	f, ok := toFloat(v)
	if !ok {
		p.fail(key, "want a number, got %s", jsonText(v))
		return def
	}
	return f
}

// optFloat returns def when the key is absent, nil when it is null.
func (p *parser) optFloat(key string, def *float64) *float64 {
	v, present := p.m[key]
	if !present {
		return def
	}
	if v == nil {
		return nil
	}
	f, ok := toFloat(v)
	if !ok {
		p.fail(key, "want a number or null, got %s", jsonText(v))
		return def
	}
	return &f
}

func (p *parser) bool(key string, def bool) bool {
	v, ok := p.get(key)
	if !ok {
		return def
	}
	b, ok := v.(bool)
	if !ok {
		p.fail(key, "want true or false, got %s", jsonText(v))
		return def
	}
	return b
}

func (p *parser) string(key, def string) string {
	v, ok := p.get(key)
	if !ok {
		return def
	}
	s, ok := v.(string)
	if !ok {
		p.fail(key, "want a string, got %s", jsonText(v))
		return def
	}
	return s
}

func (p *parser) strList(key string) ([]string, bool) {
	v, ok := p.get(key)
	if !ok {
		return nil, false
	}
	arr, ok := v.([]any)
	if !ok {
		p.fail(key, "want a list of strings, got %s", jsonText(v))
		return nil, false
	}
	out := make([]string, len(arr))
	for i, e := range arr {
		s, ok := e.(string)
		if !ok {
			p.fail(fmt.Sprintf("%s[%d]", key, i), "want a string, got %s", jsonText(e))
			return nil, false
		}
		out[i] = s
	}
	return out, true
}

func (p *parser) intList(key string, v any) ([]int, bool) {
	arr, ok := v.([]any)
	if !ok {
		p.fail(key, "want a list of integers, got %s", jsonText(v))
		return nil, false
	}
	out := make([]int, len(arr))
	for i, e := range arr {
		n, ok := toInt(e)
		if !ok {
			p.fail(fmt.Sprintf("%s[%d]", key, i), "want an integer, got %s", jsonText(e))
			return nil, false
		}
		out[i] = n
	}
	return out, true
}

func f64(v float64) *float64 { return &v }

// config reads every field with transformers' defaults (Glm5NextTextConfig)
// and derives the per-layer lists.
func (p *parser) config() *Config {
	c := &Config{Source: p.src}
	c.VocabSize = p.int("vocab_size", 154880)
	c.HiddenSize = p.int("hidden_size", 4096)
	c.NumHiddenLayers = p.int("num_hidden_layers", 45)
	c.IntermediateSize = p.int("intermediate_size", 12288)
	c.MoEIntermediateSize = p.int("moe_intermediate_size", 2048)
	c.NRoutedExperts = p.int("n_routed_experts", 288)
	c.NumExpertsPerTok = p.int("num_experts_per_tok", 8)
	c.NSharedExperts = p.int("n_shared_experts", 1)
	c.NGroup = p.int("n_group", 1)
	c.TopKGroup = p.int("topk_group", 1)
	c.NormTopKProb = p.bool("norm_topk_prob", true)
	c.RoutedScalingFactor = p.float("routed_scaling_factor", 2.5)
	c.FirstKDenseReplace = p.int("first_k_dense_replace", 3)

	c.NumAttentionHeads = p.int("num_attention_heads", 64)
	if v, present := p.m["num_key_value_heads"]; present && v == nil {
		c.NumKeyValueHeads = c.NumAttentionHeads // transformers: None means "same as heads"
	} else {
		c.NumKeyValueHeads = p.int("num_key_value_heads", 64)
	}
	if v, present := p.m["q_lora_rank"]; present && v == nil {
		c.QLoraRank = 0 // null means "no q LoRA", which Validate rejects
	} else {
		c.QLoraRank = p.int("q_lora_rank", 1536)
	}
	c.KVLoraRank = p.int("kv_lora_rank", 512)
	c.QKNopeHeadDim = p.int("qk_nope_head_dim", 256)
	c.QKRopeHeadDim = p.int("qk_rope_head_dim", 0)
	c.VHeadDim = p.int("v_head_dim", 256)

	c.IndexNHeads = p.int("index_n_heads", 32)
	c.IndexHeadDim = p.int("index_head_dim", 128)
	c.IndexTopK = p.int("index_topk", 2048)
	c.IndexKPool = p.int("index_kpool", 16)
	c.IndexKPoolCompress = p.bool("index_kpool_compress", true)
	c.IndexKPoolAlwaysSelectTail = p.bool("index_kpool_always_select_tail", true)
	c.IndexShareForMTPIteration = p.bool("index_share_for_mtp_iteration", true)

	c.LinearNumHeads = p.int("linear_num_heads", 64)
	c.LinearHeadDim = p.int("linear_head_dim", 128)
	c.LinearConvKernelDim = p.int("linear_conv_kernel_dim", 4)
	safeGate := p.bool("safe_gate", true)
	c.LinearLowerBound = p.optFloat("linear_lower_bound", nil)

	c.HCMult = p.int("hc_mult", 4)
	c.HCSinkhornIters = p.int("hc_sinkhorn_iters", 20)
	c.HCEps = p.float("hc_eps", 1e-6)
	c.RMSNormEps = p.float("rms_norm_eps", 1e-5)
	c.SwiGLULimit = p.optFloat("swiglu_limit", f64(10))

	c.MaxPositionEmbeddings = p.int("max_position_embeddings", 1048576)
	c.TieWordEmbeddings = p.bool("tie_word_embeddings", false)
	c.NumNextNPredictLayers = p.int("num_nextn_predict_layers", 0)
	c.HiddenAct = p.string("hidden_act", "silu")
	c.AttentionBias = p.bool("attention_bias", false)
	c.PadTokenID = p.optInt("pad_token_id")
	c.BOSTokenID = p.optInt("bos_token_id")
	if v, ok := p.get("eos_token_id"); ok {
		if _, isList := v.([]any); isList {
			c.EOSTokenIDs, _ = p.intList("eos_token_id", v)
		} else if i := p.optInt("eos_token_id"); i != nil {
			c.EOSTokenIDs = []int{*i}
		}
	}

	var kdaLayers, fullLayers []int
	var haveKDA, haveFull bool
	if v, ok := p.get("linear_attn_config"); ok {
		lac, isMap := v.(map[string]any)
		if !isMap {
			p.fail("linear_attn_config", "want an object, got %s", jsonText(v))
		} else {
			sub := &parser{m: lac, src: p.src + ": linear_attn_config"}
			c.LinearNumHeads = sub.int("num_heads", c.LinearNumHeads)
			c.LinearHeadDim = sub.int("head_dim", c.LinearHeadDim)
			c.LinearConvKernelDim = sub.int("short_conv_kernel_size", c.LinearConvKernelDim)
			safeGate = sub.bool("safe_gate", safeGate)
			if _, ok := lac["gate_lower_bound"]; ok {
				c.LinearLowerBound = sub.optFloat("gate_lower_bound", nil)
			} else if _, ok := lac["lower_bound"]; ok {
				c.LinearLowerBound = sub.optFloat("lower_bound", nil)
			}
			if v, ok := sub.get("kda_layers"); ok {
				kdaLayers, haveKDA = sub.intList("kda_layers", v)
			}
			if v, ok := sub.get("full_attn_layers"); ok {
				fullLayers, haveFull = sub.intList("full_attn_layers", v)
			}
			p.errs = append(p.errs, sub.errs...)
		}
	}
	if c.LinearLowerBound == nil && safeGate {
		c.LinearLowerBound = f64(-5)
	}

	L := c.NumHiddenLayers
	if L < 0 || L > 1<<16 {
		p.fail("num_hidden_layers", "%d is out of range", L)
		return c
	}
	// layer_types
	if lt, ok := p.strList("layer_types"); ok {
		c.LayerTypes = make([]LayerType, len(lt))
		for i, s := range lt {
			if s == "full_attention" {
				s = string(LayerDSA)
			}
			c.LayerTypes[i] = LayerType(s)
		}
	} else if haveKDA || haveFull {
		c.LayerTypes = p.layerTypesFromLists(L, kdaLayers, fullLayers, haveKDA, haveFull)
	} else {
		c.LayerTypes = make([]LayerType, L)
		for i := range c.LayerTypes {
			c.LayerTypes[i] = LayerKDA
			if i%4 == 3 {
				c.LayerTypes[i] = LayerDSA
			}
		}
	}
	// mlp_layer_types
	if mt, ok := p.strList("mlp_layer_types"); ok {
		c.MLPLayerTypes = make([]MLPType, len(mt))
		for i, s := range mt {
			c.MLPLayerTypes[i] = MLPType(s)
		}
	} else {
		c.MLPLayerTypes = make([]MLPType, L)
		for i := range c.MLPLayerTypes {
			c.MLPLayerTypes[i] = MLPSparse
			if i < c.FirstKDenseReplace {
				c.MLPLayerTypes[i] = MLPDense
			}
		}
	}
	// indexer_types
	if it, ok := p.strList("indexer_types"); ok {
		c.IndexerTypes = make([]IndexerType, len(it))
		for i, s := range it {
			c.IndexerTypes[i] = IndexerType(s)
		}
	} else if v, ok := p.get("index_topk_pattern"); ok {
		c.IndexerTypes = p.indexerPattern(v)
	} else {
		freq := max(p.int("index_topk_freq", 1), 1)
		offset := p.int("index_skip_topk_offset", 2)
		c.IndexerTypes = make([]IndexerType, L)
		for i := range c.IndexerTypes {
			c.IndexerTypes[i] = IndexerShared
			if max(i-offset+1, 0)%freq == 0 {
				c.IndexerTypes[i] = IndexerFull
			}
		}
	}

	if v, ok := p.get("quantization_config"); ok {
		c.Quant = p.quant(v)
	}
	return c
}

// layerTypesFromLists builds layer_types from linear_attn_config's kda_layers /
// full_attn_layers. Indices are 0-based (GLM-5.3-Flash lists DSA layers as
// 3, 7, …, 43); lists that are evidently 1-based (Kimi-Linear style: they
// contain L but not 0) are shifted.
func (p *parser) layerTypesFromLists(L int, kda, full []int, haveKDA, haveFull bool) []LayerType {
	has := func(xs []int, v int) bool {
		for _, x := range xs {
			if x == v {
				return true
			}
		}
		return false
	}
	all := append(append([]int(nil), kda...), full...)
	shift := 0
	if has(all, L) && !has(all, 0) {
		shift = 1
	}
	out := make([]LayerType, L)
	defaultType := LayerKDA // with only full_attn_layers given, the rest are KDA
	if haveKDA && !haveFull {
		defaultType = LayerDSA
	}
	for i := range out {
		out[i] = defaultType
	}
	set := func(key string, xs []int, t LayerType) {
		for j, x := range xs {
			i := x - shift
			if i < 0 || i >= L {
				p.fail(fmt.Sprintf("linear_attn_config.%s[%d]", key, j), "layer %d is out of range for %d layers", x, L)
				continue
			}
			out[i] = t
		}
	}
	set("kda_layers", kda, LayerKDA)
	set("full_attn_layers", full, LayerDSA)
	if haveKDA && haveFull {
		for _, k := range kda {
			if has(full, k) {
				p.fail("linear_attn_config", "layer %d is in both kda_layers and full_attn_layers", k)
			}
		}
	}
	return out
}

// indexerPattern reads index_topk_pattern: a string of F (full) / S (shared)
// or a list of such letters or of "full"/"shared".
func (p *parser) indexerPattern(v any) []IndexerType {
	var items []string
	switch x := v.(type) {
	case string:
		for _, r := range x {
			items = append(items, string(r))
		}
	case []any:
		for i, e := range x {
			s, ok := e.(string)
			if !ok {
				p.fail(fmt.Sprintf("index_topk_pattern[%d]", i), "want a string, got %s", jsonText(e))
				return nil
			}
			items = append(items, s)
		}
	default:
		p.fail("index_topk_pattern", "want a string or list, got %s", jsonText(v))
		return nil
	}
	out := make([]IndexerType, len(items))
	for i, s := range items {
		switch strings.ToLower(s) {
		case "f", "full":
			out[i] = IndexerFull
		case "s", "shared":
			out[i] = IndexerShared
		default:
			p.fail("index_topk_pattern", "entry %d is %q, want F or S", i, s)
			return nil
		}
	}
	return out
}

func (p *parser) quant(v any) *QuantConfig {
	m, ok := v.(map[string]any)
	if !ok {
		p.fail("quantization_config", "want an object, got %s", jsonText(v))
		return nil
	}
	sub := &parser{m: m, src: p.src + ": quantization_config"}
	q := &QuantConfig{
		Method:           sub.string("quant_method", ""),
		Fmt:              sub.string("fmt", "e4m3"),
		ActivationScheme: sub.string("activation_scheme", "dynamic"),
		WeightBlockSize:  [2]int{128, 128},
	}
	if bv, ok := sub.get("weight_block_size"); ok {
		if bs, ok := sub.intList("weight_block_size", bv); ok {
			if len(bs) != 2 {
				sub.fail("weight_block_size", "want 2 entries, got %d", len(bs))
			} else {
				q.WeightBlockSize = [2]int{bs[0], bs[1]}
			}
		}
	}
	if mods, ok := sub.strList("modules_to_not_convert"); ok {
		q.ModulesToNotConvert = mods
	}
	p.errs = append(p.errs, sub.errs...)
	return q
}
