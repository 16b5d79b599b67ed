package model

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// a z-lab style drafter config.json (Qwen3 keys the drafter ignores
// included) for a target of 8 layers, hidden 64, vocabulary 256
const dflashJSON = `{
  "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
  "block_size": 4, "num_target_layers": 8, "hidden_size": 64, "intermediate_size": 96,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "hidden_act": "silu", "attention_bias": false,
  "attention_dropout": 0.0, "use_sliding_window": false, "sliding_window": null, "max_window_layers": 2,
  "layer_types": ["full_attention", "full_attention"], "rope_scaling": null, "use_cache": true,
  "tie_word_embeddings": false, "vocab_size": 256, "torch_dtype": "bfloat16",
  "dflash_config": {"target_layer_ids": [1, 3, 5], "mask_token_id": 255}
}`

func TestParseDFlashConfig(t *testing.T) {
	c, err := ParseDFlashConfig([]byte(dflashJSON), "d.json")
	require.NoError(t, err)
	require.Equal(t, &DFlashConfig{BlockSize: 4, TargetLayerIDs: []int{1, 3, 5}, MaskTokenID: 255, NumTargetLayers: 8, HiddenSize: 64, IntermediateSize: 96,
		NumHiddenLayers: 2, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 16, RMSNormEps: 1e-6, RopeTheta: 1e6, VocabSize: 256, HiddenAct: "silu"}, c)
	require.Equal(t, 3*64, c.ContextWidth())
	require.Equal(t, 32, c.KVWidth())
	b, err := c.MarshalHF()
	require.NoError(t, err)
	back, err := ParseDFlashConfig(b, "marshalled")
	require.NoError(t, err)
	require.Equal(t, c, back)

	data, err := os.ReadFile(fixtureDir + "/config.json")
	require.NoError(t, err)
	tgt, err := ParseConfig(data, "tiny-a")
	require.NoError(t, err)
	require.NoError(t, c.CheckTarget(tgt))
	bad := *c
	bad.HiddenSize, bad.TargetLayerIDs, bad.MaskTokenID, bad.NumTargetLayers = 48, []int{1, 8}, 256, 6
	err = bad.CheckTarget(tgt)
	for _, want := range []string{"hidden_size 48 is not the target's 64", "num_target_layers 6", "target_layer_ids[1] is 8", "mask_token_id 256 is outside"} {
		require.ErrorContains(t, err, want)
	}
	require.Len(t, c.WeightCatalog(), 3+2*11)
	require.Equal(t, "layers.1.self_attn.k_norm.weight", c.WeightCatalog()[3+11+6].Name)
}

// Settings the drafter does not implement are refused naming their key;
// so are missing required keys and another architecture.
func TestParseDFlashConfigRefusals(t *testing.T) {
	for _, c := range []struct{ old, new, want string }{
		{`"attention_bias": false`, `"attention_bias": true`, "attention_bias: true is not implemented"},
		{`"use_sliding_window": false`, `"use_sliding_window": true`, "use_sliding_window: true is not implemented"},
		{`["full_attention", "full_attention"]`, `["full_attention", "sliding_attention"]`, `layer_types[1]: "sliding_attention" is not implemented`},
		{`"rope_scaling": null`, `"rope_scaling": {"rope_type": "yarn", "factor": 4.0}`, "rope_scaling: {"},
		{`"hidden_act": "silu"`, `"hidden_act": "gelu"`, `hidden_act "gelu" is not implemented`},
		{`"tie_word_embeddings": false`, `"tie_word_embeddings": true`, "tie_word_embeddings: true is not implemented"},
		{`["DFlashDraftModel"]`, `["Qwen3ForCausalLM"]`, `architectures: want a list holding "DFlashDraftModel"`},
		{`"block_size": 4,`, ``, "block_size: missing"},
		{`"block_size": 4`, `"block_size": 1`, "block_size must be in [2, 32]"},
		{`"num_key_value_heads": 2`, `"num_key_value_heads": 3`, "num_key_value_heads (3) must divide num_attention_heads (4)"},
		{`"head_dim": 16`, `"head_dim": 15`, "head_dim must be even"},
		{`"mask_token_id": 255`, `"mask_token": 255`, "dflash_config: mask_token_id: missing"},
		{`[1, 3, 5]`, `[1, 3, 9]`, "target_layer_ids[2] is 9, outside the target's layers [0, 8)"},
		{`[1, 3, 5]`, `[1, "x"]`, "target_layer_ids[1]: want an integer"},
		{`"rope_theta": 1000000.0`, `"rope_theta": 0`, "rope_theta must be > 0"},
		{`"rope_scaling": null`, `"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}`, `rope_parameters: rope_type: "yarn" is not implemented`},
		{`"rope_scaling": null`, `"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}`, "rope_theta: 500000 disagrees with the top-level rope_theta 1e+06"},
		{`"rope_scaling": null`, `"rope_parameters": {"rope_theta": 1e6, "factor": 2}`, "rope_parameters: factor: is not implemented"},
	} {
		in := strings.Replace(dflashJSON, c.old, c.new, 1)
		require.NotEqual(t, dflashJSON, in, c.old)
		_, err := ParseDFlashConfig([]byte(in), "d.json")
		require.ErrorContains(t, err, c.want, c.new)
	}
	_, err := ParseDFlashConfig([]byte(strings.Replace(dflashJSON, `"dflash_config": {"target_layer_ids": [1, 3, 5], "mask_token_id": 255}`, `"x": 1`, 1)), "d.json")
	require.ErrorContains(t, err, "dflash_config: missing")
}

// transformers ≥ 5's rope_parameters give rope_theta.
func TestDFlashRopeParameters(t *testing.T) {
	in := strings.Replace(strings.Replace(dflashJSON, `"rope_theta": 1000000.0,`, ``, 1), `"rope_scaling": null`, `"rope_parameters": {"rope_type": "default", "rope_theta": 250000.0}`, 1)
	c, err := ParseDFlashConfig([]byte(in), "d.json")
	require.NoError(t, err)
	require.Equal(t, 250000.0, c.RopeTheta)
}

// Without target_layer_ids the drafter reads z-lab's default layers.
func TestDefaultTargetLayerIDs(t *testing.T) {
	require.Equal(t, []int{4}, DefaultTargetLayerIDs(8, 1))
	require.Equal(t, []int{1, 3, 5}, DefaultTargetLayerIDs(8, 3))
	require.Equal(t, []int{1, 9, 17, 25, 33}, DefaultTargetLayerIDs(36, 5))
	require.Equal(t, []int{1, 4, 6}, DefaultTargetLayerIDs(9, 3), "Python's round: 3.5 → 4, half to even; 1+5 = 6")
	c, err := ParseDFlashConfig([]byte(strings.Replace(dflashJSON, `"target_layer_ids": [1, 3, 5], `, ``, 1)), "d.json")
	require.NoError(t, err)
	require.Equal(t, []int{1, 5}, c.TargetLayerIDs)
}
