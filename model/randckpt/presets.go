// Package randckpt writes random GLM-5.3-Flash checkpoints in the real
// Hugging Face format: a nested config.json and safetensors files with the
// released tensor names, shapes and dtypes, optionally FP8 block-quantized.
// Weights follow the O(1)-activation initialisation of the transformers
// fixture generator (shared/tools/hf_fixture.py randomize()), so that a
// forward pass over them produces meaningful activations.
package randckpt

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/glmflash/glmflash/model"
)

// presets maps a preset name to its text_config fields; everything not listed
// takes transformers' defaults and derivations (model.ParseConfig).
var presets = map[string]map[string]any{
	// tiny: exactly the sizes of testdata/glm5next-tiny-a (the HF fixture).
	"tiny": {
		"vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 8, "intermediate_size": 160,
		"moe_intermediate_size": 32, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
		"n_group": 1, "topk_group": 1, "norm_topk_prob": true, "routed_scaling_factor": 2.5,
		"num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 48, "kv_lora_rank": 32,
		"qk_nope_head_dim": 16, "qk_rope_head_dim": 0, "v_head_dim": 16,
		"index_n_heads": 16, "index_head_dim": 16, "index_topk": 16, "index_kpool": 4,
		"index_kpool_always_select_tail": true,
		"linear_num_heads":               4, "linear_head_dim": 16, "linear_conv_kernel_dim": 4, "linear_lower_bound": -5.0,
		"hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-5, "swiglu_limit": 10.0,
		"max_position_embeddings": 4096, "tie_word_embeddings": false, "pad_token_id": 0,
	},
	// small: a few-million-parameter model for fast end-to-end tests.
	"small": {
		"vocab_size": 4096, "hidden_size": 256, "num_hidden_layers": 8, "intermediate_size": 512,
		"moe_intermediate_size": 128, "n_routed_experts": 16, "num_experts_per_tok": 2, "n_shared_experts": 1,
		"num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 128, "kv_lora_rank": 64,
		"qk_nope_head_dim": 64, "qk_rope_head_dim": 0, "v_head_dim": 64,
		"index_n_heads": 8, "index_head_dim": 32, "index_topk": 64, "index_kpool": 4,
		"linear_num_heads": 4, "linear_head_dim": 64, "hc_mult": 4,
		"max_position_embeddings": 16384, "pad_token_id": 0,
	},
	// bench: ~0.4 B parameters with the released model's proportions, for
	// throughput measurements.
	"bench": {
		"vocab_size": 32000, "hidden_size": 1024, "num_hidden_layers": 8, "intermediate_size": 2816,
		"moe_intermediate_size": 512, "n_routed_experts": 32, "num_experts_per_tok": 4, "n_shared_experts": 1,
		"num_attention_heads": 8, "num_key_value_heads": 8, "q_lora_rank": 512, "kv_lora_rank": 256,
		"qk_nope_head_dim": 128, "qk_rope_head_dim": 0, "v_head_dim": 128,
		"index_n_heads": 8, "index_head_dim": 64, "index_topk": 256, "index_kpool": 4,
		"linear_num_heads": 8, "linear_head_dim": 128, "hc_mult": 4,
		"max_position_embeddings": 65536, "pad_token_id": 0,
	},
	// gpu: the released model's per-layer sizes (architecture.md §1.1:
	// hidden 4096, 288 routed experts top-8 of 2048, MLA 64 heads of 256
	// with q_lora 1536 / kv_lora 512, the 32×128 indexer keeping 2048
	// tokens in pools of 4, KDA 64 heads of 128, dense MLP 12288, the
	// released vocabulary) over 8 of its 45 layers: the released schedule
	// (KDA + dense MLP at 0–2, DSA + MoE at 3, KDA + MoE at 4–6, DSA + MoE
	// at 7), about 41 GB in the FP8 layout. 8 layers is what both engines
	// of the GPU benchmark hold comfortably on one H200 (139 GiB):
	// transformers keeps the weights it cannot run in FP8 as bf16, twice
	// that, and the FP8 checkpoint itself must fit the GPU machine's 64 GiB
	// of disk. max_position_embeddings is the released config's 202752 (with
	// no RoPE only a context limit): the paged caches take pages as
	// sequences grow, and the serving memory planner sizes the pool.
	"gpu": {
		"vocab_size": 154880, "hidden_size": 4096, "num_hidden_layers": 8, "intermediate_size": 12288,
		"moe_intermediate_size": 2048, "n_routed_experts": 288, "num_experts_per_tok": 8, "n_shared_experts": 1,
		"n_group": 1, "topk_group": 1, "norm_topk_prob": true, "routed_scaling_factor": 2.5,
		"num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
		"qk_nope_head_dim": 256, "qk_rope_head_dim": 0, "v_head_dim": 256,
		"index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048, "index_kpool": 4,
		"index_kpool_always_select_tail": true,
		"linear_num_heads":               64, "linear_head_dim": 128, "linear_conv_kernel_dim": 4, "linear_lower_bound": -5.0,
		"hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-5, "swiglu_limit": 10.0,
		"max_position_embeddings": 202752, "tie_word_embeddings": false, "pad_token_id": 154820,
	},
}

// MTPSuffix names a preset's variant with one MTP (NextN) layer: "tiny-mtp"
// is "tiny" plus num_nextn_predict_layers 1, whose checkpoint holds the
// same trunk tensors (same bytes for a seed) and the MTP layer's.
const MTPSuffix = "-mtp"

// PresetNames returns the preset names, sorted: every base preset, its
// MTP variant and, where it has one, its DFlash variant (DFlashSuffix).
func PresetNames() []string {
	names := make([]string, 0, 3*len(presets))
	for n := range presets {
		names = append(names, n, n+MTPSuffix)
		if _, ok := dflashPresets[n]; ok {
			names = append(names, n+DFlashSuffix)
		}
	}
	sort.Strings(names)
	return names
}

// Preset returns a validated configuration by name: "tiny" (the sizes of
// the HF fixture testdata/glm5next-tiny-a), "small", "bench" or "gpu" (the
// released sizes over 8 layers: for the GPU, in FP8), or one of
// them with MTPSuffix for the same model with an MTP layer. All presets
// use the released layer schedule: DSA at layers i%4==3, KDA elsewhere, a
// dense MLP on layers 0–2 and MoE after.
func Preset(name string) (*model.Config, error) { return PresetWith(name, nil) }

// PresetWith is Preset with some text_config fields set to other values
// (JSON), e.g. {"n_routed_experts": 16} for a scaled variant; every key must
// be a text_config field, and the result must validate.
func PresetWith(name string, set map[string]json.RawMessage) (*model.Config, error) {
	base, dflash := strings.CutSuffix(name, DFlashSuffix) // the trunk is the base's
	if _, ok := dflashPresets[base]; dflash && !ok {
		return nil, fmt.Errorf("randckpt: unknown preset %q (have %v)", name, PresetNames())
	}
	base, mtp := strings.CutSuffix(base, MTPSuffix)
	fields, ok := presets[base]
	if !ok {
		return nil, fmt.Errorf("randckpt: unknown preset %q (have %v)", name, PresetNames())
	}
	m := map[string]any{"model_type": "glm5_next_text"}
	for k, v := range fields {
		m[k] = v
	}
	if len(set) > 0 {
		known, err := Preset(name)
		if err != nil {
			return nil, err
		}
		fieldsOf := known.TextConfigMap()
		for k, raw := range set {
			if _, ok := fieldsOf[k]; !ok || k == "model_type" {
				return nil, fmt.Errorf("randckpt: --set %s: not a text_config field", k)
			}
			var v any
			if err := json.Unmarshal(raw, &v); err != nil {
				return nil, fmt.Errorf("randckpt: --set %s: the value is not JSON: %w", k, err)
			}
			m[k] = v
		}
	}
	if mtp {
		m["num_nextn_predict_layers"] = 1
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("randckpt: preset %s: %w", name, err)
	}
	cfg, err := model.ParseConfig(b, "preset "+name)
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}
