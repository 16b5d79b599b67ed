package model

import (
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const fixtureDir = "../testdata/glm5next-tiny-a/checkpoint"

func fixtureConfigJSON(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(fixtureDir + "/config.json")
	require.NoError(t, err)
	return b
}

func fixtureConfig(t *testing.T) *Config {
	t.Helper()
	c, err := ParseConfig(fixtureConfigJSON(t), "config.json")
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	return c
}

func TestParseFixtureConfig(t *testing.T) {
	c := fixtureConfig(t)
	assert.Equal(t, 256, c.VocabSize)
	assert.Equal(t, 64, c.HiddenSize)
	assert.Equal(t, 8, c.NumHiddenLayers)
	assert.Equal(t, 160, c.IntermediateSize)
	assert.Equal(t, 32, c.MoEIntermediateSize)
	assert.Equal(t, 8, c.NRoutedExperts)
	assert.Equal(t, 2, c.NumExpertsPerTok)
	assert.Equal(t, 1, c.NSharedExperts)
	assert.Equal(t, 4, c.NumAttentionHeads)
	assert.Equal(t, 48, c.QLoraRank)
	assert.Equal(t, 32, c.KVLoraRank)
	assert.Equal(t, 16, c.QKHeadDim())
	assert.Equal(t, 16, c.IndexNHeads)
	assert.Equal(t, 4, c.IndexKPool)
	assert.Equal(t, 16, c.IndexTopK)
	assert.Equal(t, 64, c.KDAProjDim())
	assert.Equal(t, 24, c.HCMix())
	assert.Equal(t, 4096, c.MaxPositionEmbeddings)
	require.NotNil(t, c.LinearLowerBound)
	assert.Equal(t, -5.0, *c.LinearLowerBound)
	require.NotNil(t, c.SwiGLULimit)
	assert.Equal(t, 10.0, *c.SwiGLULimit)
	assert.Equal(t, 1e-6, c.HCEps)
	assert.Equal(t, 1e-5, c.RMSNormEps)
	assert.Equal(t, 2.5, c.RoutedScalingFactor)
	assert.True(t, c.NormTopKProb)
	assert.False(t, c.TieWordEmbeddings)
	assert.Nil(t, c.Quant)
	require.NotNil(t, c.PadTokenID)
	assert.Equal(t, 0, *c.PadTokenID)
	assert.Nil(t, c.BOSTokenID)

	// The lists equal config.json's.
	var raw struct {
		TextConfig struct {
			LayerTypes    []LayerType   `json:"layer_types"`
			MLPLayerTypes []MLPType     `json:"mlp_layer_types"`
			IndexerTypes  []IndexerType `json:"indexer_types"`
		} `json:"text_config"`
	}
	require.NoError(t, json.Unmarshal(fixtureConfigJSON(t), &raw))
	assert.Equal(t, raw.TextConfig.LayerTypes, c.LayerTypes)
	assert.Equal(t, raw.TextConfig.MLPLayerTypes, c.MLPLayerTypes)
	assert.Equal(t, raw.TextConfig.IndexerTypes, c.IndexerTypes)
	for i := 0; i < 8; i++ {
		assert.Equal(t, i == 3 || i == 7, c.IsDSA(i), "layer %d", i)
		assert.Equal(t, i != 3 && i != 7, c.IsKDA(i), "layer %d", i)
		assert.Equal(t, i >= 3, c.IsMoE(i), "layer %d", i)
	}
	assert.False(t, c.IsDSA(8))
	assert.False(t, c.IsKDA(-1))
	assert.Equal(t, 3, c.IndexerSource(3))
	assert.Equal(t, -1, c.IndexerSource(2))
}

func TestDerivedListsMatchFixtureWhenOmitted(t *testing.T) {
	var top map[string]any
	require.NoError(t, json.Unmarshal(fixtureConfigJSON(t), &top))
	tc := top["text_config"].(map[string]any)
	delete(tc, "layer_types")
	delete(tc, "mlp_layer_types")
	delete(tc, "indexer_types")
	b, err := json.Marshal(top)
	require.NoError(t, err)
	c, err := ParseConfig(b, "derived.json")
	require.NoError(t, err)
	want := fixtureConfig(t)
	assert.Equal(t, want.LayerTypes, c.LayerTypes)
	assert.Equal(t, want.MLPLayerTypes, c.MLPLayerTypes)
	assert.Equal(t, want.IndexerTypes, c.IndexerTypes)
}

func TestParseConfigDefaults(t *testing.T) {
	c, err := ParseConfig([]byte(`{"model_type":"glm5_next_text"}`), "flat.json")
	require.NoError(t, err)
	require.NoError(t, c.Validate())
	assert.Equal(t, 154880, c.VocabSize)
	assert.Equal(t, 4096, c.HiddenSize)
	assert.Equal(t, 45, c.NumHiddenLayers)
	assert.Equal(t, 288, c.NRoutedExperts)
	assert.Equal(t, 8, c.NumExpertsPerTok)
	assert.Equal(t, 16, c.IndexKPool, "transformers default, not the checkpoint's 4")
	assert.Equal(t, 2048, c.IndexTopK)
	assert.Equal(t, 4, c.HCMult)
	assert.Equal(t, 20, c.HCSinkhornIters)
	assert.Equal(t, 1e-6, c.HCEps)
	assert.Equal(t, 1e-5, c.RMSNormEps)
	assert.Equal(t, 10.0, *c.SwiGLULimit)
	assert.Equal(t, 4, c.LinearConvKernelDim)
	assert.Equal(t, -5.0, *c.LinearLowerBound)
	assert.Equal(t, 1, c.NGroup)
	assert.Equal(t, 1, c.TopKGroup)
	assert.Equal(t, 2.5, c.RoutedScalingFactor)
	assert.True(t, c.NormTopKProb)
	assert.True(t, c.IndexKPoolAlwaysSelectTail)
	assert.True(t, c.IndexKPoolCompress)
	assert.Equal(t, 64, c.NumKeyValueHeads)
	var dsa []int
	for i := range c.NumHiddenLayers {
		if c.IsDSA(i) {
			dsa = append(dsa, i)
		}
		assert.Equal(t, i >= 3, c.IsMoE(i))
		assert.Equal(t, IndexerFull, c.IndexerTypes[i])
	}
	assert.Equal(t, []int{3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43}, dsa)
	assert.True(t, c.IsKDA(44))

	// A flat glm5_next without text_config and an object without model_type.
	for _, s := range []string{`{"model_type":"glm5_next","num_hidden_layers":2}`, `{"num_hidden_layers":2}`} {
		c, err = ParseConfig([]byte(s), "flat.json")
		require.NoError(t, err, s)
		assert.Equal(t, 2, c.NumHiddenLayers)
		assert.Equal(t, []MLPType{MLPDense, MLPDense}, c.MLPLayerTypes, "min(first_k_dense_replace, L)")
		assert.Equal(t, []LayerType{LayerKDA, LayerKDA}, c.LayerTypes)
	}
}

func TestParseConfigNestedForwarding(t *testing.T) {
	c, err := ParseConfig([]byte(`{"model_type":"glm5_next","tie_word_embeddings":true,"hidden_size":32,
		"quantization_config":{"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[64,32],"modules_to_not_convert":["lm_head"]},
		"vision_config":{"hidden_size":7},
		"text_config":{"model_type":"glm5_next_text","hidden_size":64,"num_hidden_layers":4}}`), "nested.json")
	require.NoError(t, err)
	assert.True(t, c.TieWordEmbeddings, "forwarded from top level")
	assert.Equal(t, 64, c.HiddenSize, "text_config wins over top level")
	require.NotNil(t, c.Quant)
	assert.Equal(t, QuantConfig{Method: "fp8", Fmt: "e4m3", ActivationScheme: "dynamic", WeightBlockSize: [2]int{64, 32}, ModulesToNotConvert: []string{"lm_head"}}, *c.Quant)
	assert.Equal(t, [2]int{64, 32}, c.BlockSize())

	c, err = ParseConfig([]byte(`{"model_type":"glm5_next","tie_word_embeddings":true,"text_config":{"tie_word_embeddings":false}}`), "nested.json")
	require.NoError(t, err)
	assert.False(t, c.TieWordEmbeddings)
	assert.Equal(t, [2]int{128, 128}, c.BlockSize())
}

func TestParseConfigLayerTypeSources(t *testing.T) {
	parse := func(s string) *Config {
		t.Helper()
		c, err := ParseConfig([]byte(s), "c.json")
		require.NoError(t, err, s)
		return c
	}
	K, D := LayerKDA, LayerDSA
	c := parse(`{"num_hidden_layers":4,"layer_types":["linear_attention","full_attention","linear_attention","deepseek_sparse_attention"]}`)
	assert.Equal(t, []LayerType{K, D, K, D}, c.LayerTypes, "legacy full_attention renamed")

	c = parse(`{"num_hidden_layers":8,"linear_attn_config":{"kda_layers":[0,1,2,4,5,6],"full_attn_layers":[3,7]}}`)
	assert.Equal(t, []LayerType{K, K, K, D, K, K, K, D}, c.LayerTypes)
	c = parse(`{"num_hidden_layers":4,"linear_attn_config":{"full_attn_layers":[1]}}`)
	assert.Equal(t, []LayerType{K, D, K, K}, c.LayerTypes)
	c = parse(`{"num_hidden_layers":4,"linear_attn_config":{"kda_layers":[0,1]}}`)
	assert.Equal(t, []LayerType{K, K, D, D}, c.LayerTypes)
	c = parse(`{"num_hidden_layers":4,"linear_attn_config":{"kda_layers":[1,2,3],"full_attn_layers":[4]}}`)
	assert.Equal(t, []LayerType{K, K, K, D}, c.LayerTypes, "1-based (Kimi style) lists")
	c = parse(`{"num_hidden_layers":4,"layer_types":["linear_attention","linear_attention","linear_attention","linear_attention"],"linear_attn_config":{"full_attn_layers":[1]}}`)
	assert.Equal(t, []LayerType{K, K, K, K}, c.LayerTypes, "layer_types wins")

	_, err := ParseConfig([]byte(`{"num_hidden_layers":4,"linear_attn_config":{"full_attn_layers":[9]}}`), "c.json")
	assert.ErrorContains(t, err, "c.json: linear_attn_config.full_attn_layers[0]: layer 9 is out of range for 4 layers")
	_, err = ParseConfig([]byte(`{"num_hidden_layers":4,"linear_attn_config":{"kda_layers":[0,1,2],"full_attn_layers":[2,3]}}`), "c.json")
	assert.ErrorContains(t, err, "layer 2 is in both")
}

func TestParseConfigLinearAttnOverrides(t *testing.T) {
	c, err := ParseConfig([]byte(`{"linear_num_heads":2,"linear_attn_config":{"num_heads":8,"head_dim":32,"short_conv_kernel_size":3,"gate_lower_bound":-3.5}}`), "c.json")
	require.NoError(t, err)
	assert.Equal(t, 8, c.LinearNumHeads)
	assert.Equal(t, 32, c.LinearHeadDim)
	assert.Equal(t, 3, c.LinearConvKernelDim)
	assert.Equal(t, -3.5, *c.LinearLowerBound)

	c, err = ParseConfig([]byte(`{"linear_attn_config":{"lower_bound":-2}}`), "c.json")
	require.NoError(t, err)
	assert.Equal(t, -2.0, *c.LinearLowerBound, "legacy key")

	c, err = ParseConfig([]byte(`{"linear_attn_config":{"safe_gate":false}}`), "c.json")
	require.NoError(t, err)
	assert.Nil(t, c.LinearLowerBound, "softplus gate")
	c, err = ParseConfig([]byte(`{"safe_gate":false,"linear_lower_bound":null,"swiglu_limit":null}`), "c.json")
	require.NoError(t, err)
	assert.Nil(t, c.LinearLowerBound)
	assert.Nil(t, c.SwiGLULimit, "null swiglu_limit = no clamp")
	c, err = ParseConfig([]byte(`{"linear_lower_bound":null}`), "c.json")
	require.NoError(t, err)
	assert.Equal(t, -5.0, *c.LinearLowerBound, "safe_gate default gives -5")
}

func TestParseConfigIndexerTypes(t *testing.T) {
	F, S := IndexerFull, IndexerShared
	c, err := ParseConfig([]byte(`{"num_hidden_layers":8,"index_topk_pattern":"FFFFFFFS"}`), "c.json")
	require.NoError(t, err)
	assert.Equal(t, []IndexerType{F, F, F, F, F, F, F, S}, c.IndexerTypes)
	require.NoError(t, c.Validate())
	assert.Equal(t, 3, c.IndexerSource(7))
	assert.False(t, c.HasOwnIndexer(7))

	c, err = ParseConfig([]byte(`{"num_hidden_layers":4,"index_topk_pattern":["F","shared","full","S"]}`), "c.json")
	require.NoError(t, err)
	assert.Equal(t, []IndexerType{F, S, F, S}, c.IndexerTypes)

	c, err = ParseConfig([]byte(`{"num_hidden_layers":6,"index_topk_freq":2}`), "c.json")
	require.NoError(t, err)
	// offset 2: full iff max(i-1,0) % 2 == 0
	assert.Equal(t, []IndexerType{F, F, S, F, S, F}, c.IndexerTypes)
	c, err = ParseConfig([]byte(`{"num_hidden_layers":6,"index_topk_freq":3,"index_skip_topk_offset":0}`), "c.json")
	require.NoError(t, err)
	// full iff (i+1) % 3 == 0
	assert.Equal(t, []IndexerType{S, S, F, S, S, F}, c.IndexerTypes)
	c, err = ParseConfig([]byte(`{"num_hidden_layers":2,"index_topk_freq":0}`), "c.json")
	require.NoError(t, err)
	assert.Equal(t, []IndexerType{F, F}, c.IndexerTypes, "freq clamped to 1")

	c, err = ParseConfig([]byte(`{"num_hidden_layers":2,"indexer_types":["full","full"],"index_topk_pattern":"SS"}`), "c.json")
	require.NoError(t, err)
	assert.Equal(t, []IndexerType{F, F}, c.IndexerTypes, "explicit indexer_types win")

	_, err = ParseConfig([]byte(`{"num_hidden_layers":2,"index_topk_pattern":"FX"}`), "c.json")
	assert.ErrorContains(t, err, `c.json: index_topk_pattern: entry 1 is "X", want F or S`)
}

func TestParseConfigErrors(t *testing.T) {
	cases := []struct{ json, want string }{
		{`{"hidden_size":`, "bad.json: invalid JSON"},
		{`[1]`, "bad.json: invalid JSON"},
		{`null`, "not a JSON object"},
		{`{} {}`, "trailing data"},
		{`{"model_type":"llama"}`, `bad.json: model_type "llama" is not glm5_next`},
		{`{"model_type":"glm5_next","text_config":[1]}`, "bad.json: text_config must be an object"},
		{`{"model_type":"glm5_next","text_config":{"model_type":"qwen"}}`, `text_config.model_type "qwen"`},
		{`{"hidden_size":"64"}`, `bad.json: hidden_size: want an integer, got "64"`},
		{`{"hidden_size":64.5}`, "bad.json: hidden_size: want an integer, got 64.5"},
		{`{"rms_norm_eps":"x"}`, "bad.json: rms_norm_eps: want a number"},
		{`{"norm_topk_prob":1}`, "bad.json: norm_topk_prob: want true or false"},
		{`{"layer_types":"x"}`, "bad.json: layer_types: want a list of strings"},
		{`{"layer_types":[1]}`, "bad.json: layer_types[0]: want a string"},
		{`{"swiglu_limit":"x"}`, "swiglu_limit: want a number or null"},
		{`{"linear_attn_config":[]}`, "linear_attn_config: want an object"},
		{`{"linear_attn_config":{"num_heads":"x"}}`, "bad.json: linear_attn_config: num_heads: want an integer"},
		{`{"quantization_config":{"weight_block_size":[128]}}`, "quantization_config: weight_block_size: want 2 entries"},
		{`{"quantization_config":3}`, "quantization_config: want an object"},
		{`{"num_hidden_layers":-1}`, "num_hidden_layers: -1 is out of range"},
		{`{"eos_token_id":["a"]}`, "eos_token_id[0]: want an integer"},
	}
	for _, c := range cases {
		_, err := ParseConfig([]byte(c.json), "bad.json")
		require.Error(t, err, c.json)
		assert.Contains(t, err.Error(), c.want, c.json)
	}
	c, err := ParseConfig([]byte(`{"eos_token_id":[1,2],"hidden_size":64.0,"unknown_key":{"x":1},"vision_config":{"depth":"x"}}`), "ok.json")
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2}, c.EOSTokenIDs)
	assert.Equal(t, 64, c.HiddenSize, "integral floats accepted")
	c, err = ParseConfig([]byte(`{"eos_token_id":5,"num_key_value_heads":null,"num_attention_heads":8}`), "ok.json")
	require.NoError(t, err)
	assert.Equal(t, []int{5}, c.EOSTokenIDs)
	assert.Equal(t, 8, c.NumKeyValueHeads)
}

func TestValidateErrors(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(c *Config)
		want   string
	}{
		{"kpool", func(c *Config) { c.IndexKPool = 3 }, "config.json: index_topk (16) must be a multiple of index_kpool (3)"},
		{"kv heads", func(c *Config) { c.NumKeyValueHeads = 2 }, "config.json: num_attention_heads (4) must equal num_key_value_heads (2)"},
		{"layer_types length", func(c *Config) { c.LayerTypes = c.LayerTypes[:7] }, "config.json: layer_types has 7 entries, want num_hidden_layers (8)"},
		{"mlp length", func(c *Config) { c.MLPLayerTypes = append(c.MLPLayerTypes, MLPDense) }, "mlp_layer_types has 9 entries"},
		{"indexer length", func(c *Config) { c.IndexerTypes = nil }, "indexer_types has 0 entries"},
		{"layer value", func(c *Config) { c.LayerTypes[2] = "mamba" }, `layer_types[2] is "mamba"`},
		{"mlp value", func(c *Config) { c.MLPLayerTypes[2] = "moe" }, `mlp_layer_types[2] is "moe"`},
		{"indexer value", func(c *Config) { c.IndexerTypes[2] = "half" }, `indexer_types[2] is "half"`},
		{"rope", func(c *Config) { c.QKRopeHeadDim = 64 }, "qk_rope_head_dim (64) must be 0"},
		{"q lora", func(c *Config) { c.QLoraRank = 0 }, "q_lora_rank (0) must be positive"},
		{"hidden", func(c *Config) { c.HiddenSize = 0 }, "hidden_size (0) must be positive"},
		{"vocab", func(c *Config) { c.VocabSize = -1 }, "vocab_size (-1) must be positive"},
		{"groups divide", func(c *Config) { c.NGroup = 3 }, "n_routed_experts (8) must be a multiple of n_group (3)"},
		{"group size", func(c *Config) { c.NGroup = 8; c.TopKGroup = 2 }, "n_routed_experts/n_group (1) must be at least 2"},
		{"topk_group", func(c *Config) { c.NGroup = 2; c.TopKGroup = 3 }, "topk_group (3) must not exceed n_group (2)"},
		{"experts per tok", func(c *Config) { c.NGroup = 4; c.TopKGroup = 1; c.NumExpertsPerTok = 3 }, "num_experts_per_tok (3) must not exceed the 2 experts in topk_group (1) groups of 2"},
		{"experts per tok total", func(c *Config) { c.NumExpertsPerTok = 9 }, "num_experts_per_tok (9) must not exceed the 8 experts"},
		{"shared first", func(c *Config) { c.IndexerTypes[3] = IndexerShared }, "indexer_types[3] is shared but no earlier DSA layer runs a full indexer"},
		{"hc_mult", func(c *Config) { c.HCMult = 0 }, "hc_mult (0) must be at least 1"},
		{"sinkhorn", func(c *Config) { c.HCSinkhornIters = 0 }, "hc_sinkhorn_iters (0) must be in [1, 1000]"},
		{"eps", func(c *Config) { c.RMSNormEps = 0 }, "rms_norm_eps (0) must be a positive finite number"},
		{"quant", func(c *Config) { c.Quant = &QuantConfig{Method: "awq", Fmt: "e4m3", WeightBlockSize: [2]int{128, 128}} }, `quantization_config.quant_method "awq" is not supported`},
		{"block", func(c *Config) { c.Quant = &QuantConfig{Method: "fp8", Fmt: "e4m3"} }, "weight_block_size [0 0] must be positive"},
		{"lower bound", func(c *Config) { v := 1.0; c.LinearLowerBound = &v }, "linear_lower_bound (1) must be a negative"},
		{"act", func(c *Config) { c.HiddenAct = "gelu" }, `hidden_act "gelu" is not supported`},
		{"bias", func(c *Config) { c.AttentionBias = true }, "attention_bias true is not supported"},
		{"moe width", func(c *Config) { c.MoEIntermediateSize = 0 }, "moe_intermediate_size (0) must be positive"},
		{"kda heads", func(c *Config) { c.LinearNumHeads = 0 }, "linear_num_heads (0) must be positive"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := fixtureConfig(t).Clone()
			tc.mutate(c)
			err := c.Validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	// Several problems are all reported.
	c := fixtureConfig(t).Clone()
	c.IndexKPool, c.HCMult = 3, 0
	err := c.Validate()
	require.Error(t, err)
	assert.Equal(t, 2, strings.Count(err.Error(), "config.json:"), err.Error())
	// A shared layer after a full DSA layer is fine.
	c = fixtureConfig(t).Clone()
	c.IndexerTypes[7] = IndexerShared
	c.IndexerTypes[0] = IndexerShared // ignored: KDA layer
	require.NoError(t, c.Validate())
}

func TestMarshalHFRoundTrip(t *testing.T) {
	for _, src := range []string{fixtureDir + "/config.json"} {
		b, err := os.ReadFile(src)
		require.NoError(t, err)
		c, err := ParseConfig(b, "config.json")
		require.NoError(t, err)
		c.Quant = &QuantConfig{Method: "fp8", Fmt: "e4m3", ActivationScheme: "dynamic", WeightBlockSize: [2]int{128, 128}}
		c.EOSTokenIDs = []int{3, 4}
		out, err := c.MarshalHF()
		require.NoError(t, err)
		back, err := ParseConfig(out, "config.json")
		require.NoError(t, err)
		assert.Equal(t, c, back)

		c.LinearLowerBound, c.SwiGLULimit, c.Quant, c.EOSTokenIDs = nil, nil, nil, []int{7}
		out, err = c.MarshalHF()
		require.NoError(t, err)
		back, err = ParseConfig(out, "config.json")
		require.NoError(t, err)
		assert.Equal(t, c, back)
		var top map[string]any
		require.NoError(t, json.Unmarshal(out, &top))
		assert.Equal(t, "glm5_next", top["model_type"])
		assert.Equal(t, "glm5_next_text", top["text_config"].(map[string]any)["model_type"])
		assert.NotContains(t, top, "quantization_config")
	}
}

func TestClone(t *testing.T) {
	c := fixtureConfig(t)
	c.Quant = &QuantConfig{Method: "fp8", ModulesToNotConvert: []string{"a"}}
	d := c.Clone()
	assert.Equal(t, c, d)
	d.LayerTypes[0] = LayerDSA
	*d.LinearLowerBound = 1
	d.Quant.ModulesToNotConvert[0] = "b"
	assert.Equal(t, LayerKDA, c.LayerTypes[0])
	assert.Equal(t, -5.0, *c.LinearLowerBound)
	assert.Equal(t, "a", c.Quant.ModulesToNotConvert[0])
}

// Float fields are written as JSON floats (transformers' strict config
// classes refuse swiglu_limit: 10).
func TestMarshalHFWritesFloatsAsFloats(t *testing.T) {
	b, err := os.ReadFile("../testdata/glm5next-tiny-a/checkpoint/config.json")
	require.NoError(t, err)
	c, err := ParseConfig(b, "x")
	require.NoError(t, err)
	out, err := c.MarshalHF()
	require.NoError(t, err)
	require.Contains(t, string(out), `"swiglu_limit": 10.0`)
	require.Contains(t, string(out), `"linear_lower_bound": -5.0`)
	require.Contains(t, string(out), `"routed_scaling_factor": 2.5`)
	for _, f := range []float64{10, -5, 2.5, 1e-5, 1e300} {
		j, err := json.Marshal(hfFloat(f))
		require.NoError(t, err)
		var back float64
		require.NoError(t, json.Unmarshal(j, &back))
		require.Equal(t, f, back)
		require.Regexp(t, `[.eE]`, string(j))
	}
	_, err = json.Marshal(hfFloat(math.NaN()))
	require.Error(t, err)
}
