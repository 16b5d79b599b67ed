package model

import (
	"fmt"
	"strings"

	"github.com/glmflash/glmflash/model/safetensors"
)

// Checkpoint tensor name prefixes.
const (
	// TextPrefix prefixes every text-tower tensor except lm_head.
	TextPrefix = "model.language_model."
	// EmbedName is the token embedding [vocab, hidden].
	EmbedName = TextPrefix + "embed_tokens.weight"
	// FinalNormName is the final RMSNorm weight [hidden].
	FinalNormName = TextPrefix + "norm.weight"
	// LMHeadName is the output projection [vocab, hidden] (absent when tied).
	LMHeadName = "lm_head.weight"
	// ScaleSuffix turns an FP8 weight name into its block-scale companion:
	// "<module>.weight" + ScaleSuffix = "<module>.weight_scale_inv".
	ScaleSuffix = "_scale_inv"
)

// DefaultBlockSize is the FP8 scale block edge used when the config has no
// quantization_config.weight_block_size.
const DefaultBlockSize = 128

// LayerPrefix returns "model.language_model.layers.{i}".
func LayerPrefix(i int) string { return fmt.Sprintf("%slayers.%d", TextPrefix, i) }

// WeightSpec is one expected checkpoint tensor.
type WeightSpec struct {
	Name  string
	Shape []int
	// DType is the type the released checkpoints store: BF16, F32 for the
	// hc_*, A_log, dt_bias, conv, e_score_correction_bias and
	// compress_ape tensors, F8E4M3 for FP8 modules in the FP8 layout, and F32
	// for their "<name>_scale_inv" block scales. Readers accept any float type.
	DType safetensors.DType
	// FP8Eligible marks the weights that are block-quantized to FP8 e4m3 in
	// the FP8 checkpoint (architecture §2.3), less modules_to_not_convert.
	FP8Eligible bool
}

// BlockSize returns the FP8 scale block (rows, columns).
func (c *Config) BlockSize() [2]int {
	if c.Quant != nil && c.Quant.WeightBlockSize[0] > 0 && c.Quant.WeightBlockSize[1] > 0 {
		return c.Quant.WeightBlockSize
	}
	return [2]int{DefaultBlockSize, DefaultBlockSize}
}

// ScaleShape returns the shape of the block-scale tensor of an FP8 weight of
// shape [n, k]: [ceil(n/block rows), ceil(k/block cols)].
func (c *Config) ScaleShape(n, k int) []int {
	bs := c.BlockSize()
	return []int{ceilDiv(n, bs[0]), ceilDiv(k, bs[1])}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// notConverted reports whether module (a tensor name without ".weight") is
// excluded from FP8 by quantization_config.modules_to_not_convert (an entry
// matches when it is a substring of the module name, as in transformers).
func (c *Config) notConverted(name string) bool {
	if c.Quant == nil {
		return false
	}
	module := strings.TrimSuffix(name, ".weight")
	for _, m := range c.Quant.ModulesToNotConvert {
		if m != "" && strings.Contains(module, m) {
			return true
		}
	}
	return false
}

// WeightCatalog lists every trunk tensor (layers 0..num_hidden_layers-1 plus
// the embedding, final norm and untied lm_head) with its expected shape.
// With fp8 the FP8-eligible weights get DType F8E4M3 and are each followed by
// their "<name>_scale_inv" companion (F32, [ceil(N/128), ceil(K/128)]).
// MTP layers (index ≥ num_hidden_layers) and the vision tower are not listed.
// A DSA layer whose indexer is shared has no indexer tensors.
func (c *Config) WeightCatalog(fp8 bool) []WeightSpec {
	D, H := c.HiddenSize, c.HCMult
	var out []WeightSpec
	add := func(name string, dt safetensors.DType, shape ...int) {
		out = append(out, WeightSpec{Name: name, Shape: shape, DType: dt})
	}
	bf16 := func(name string, shape ...int) { add(name, safetensors.BF16, shape...) }
	f32 := func(name string, shape ...int) { add(name, safetensors.F32, shape...) }
	quant := func(name string, n, k int) {
		eligible := !c.notConverted(name)
		if fp8 && eligible {
			out = append(out, WeightSpec{Name: name, Shape: []int{n, k}, DType: safetensors.F8E4M3, FP8Eligible: true},
				WeightSpec{Name: name + ScaleSuffix, Shape: c.ScaleShape(n, k), DType: safetensors.F32})
			return
		}
		out = append(out, WeightSpec{Name: name, Shape: []int{n, k}, DType: safetensors.BF16, FP8Eligible: eligible})
	}
	bf16(EmbedName, c.VocabSize, D)
	for i := 0; i < c.NumHiddenLayers; i++ {
		p := LayerPrefix(i)
		bf16(p+".input_layernorm.weight", D)
		bf16(p+".post_attention_layernorm.weight", D)
		for _, site := range []string{"attn", "ffn"} {
			f32(p+".hc_"+site+"_fn", c.HCMix(), H*D)
			f32(p+".hc_"+site+"_base", c.HCMix())
			f32(p+".hc_"+site+"_scale", 3)
		}
		a := p + ".self_attn."
		switch {
		case c.IsKDA(i):
			P, nh, hd, K := c.KDAProjDim(), c.LinearNumHeads, c.LinearHeadDim, c.LinearConvKernelDim
			for _, x := range []string{"q", "k", "v"} {
				bf16(a+x+"_proj.weight", P, D)
			}
			for _, x := range []string{"q", "k", "v"} {
				f32(a+x+"_conv1d.weight", P, 1, K)
			}
			bf16(a+"f_a_proj.weight", hd, D)
			bf16(a+"f_b_proj.weight", P, hd)
			f32(a+"dt_bias", P)
			f32(a+"A_log", nh)
			bf16(a+"b_proj.weight", nh, D)
			bf16(a+"g_a_proj.weight", hd, D)
			bf16(a+"g_b_proj.weight", P, hd)
			bf16(a+"o_norm.weight", hd)
			bf16(a+"o_proj.weight", D, P)
		case c.IsDSA(i):
			nh := c.NumAttentionHeads
			quant(a+"q_a_proj.weight", c.QLoraRank, D)
			bf16(a+"q_a_layernorm.weight", c.QLoraRank)
			quant(a+"q_b_proj.weight", nh*c.QKHeadDim(), c.QLoraRank)
			quant(a+"kv_a_proj_with_mqa.weight", c.KVLoraRank+c.QKRopeHeadDim, D)
			bf16(a+"kv_a_layernorm.weight", c.KVLoraRank)
			bf16(a+"kv_b_proj.weight", nh*(c.QKNopeHeadDim+c.VHeadDim), c.KVLoraRank)
			quant(a+"o_proj.weight", D, nh*c.VHeadDim)
			if c.HasOwnIndexer(i) {
				x := a + "indexer."
				bf16(x+"wq_b.weight", c.IndexNHeads*c.IndexHeadDim, c.QLoraRank)
				bf16(x+"wk.weight", c.IndexHeadDim, D)
				bf16(x+"k_norm.weight", c.IndexHeadDim)
				bf16(x+"k_norm.bias", c.IndexHeadDim)
				bf16(x+"weights_proj.weight", c.IndexNHeads, D)
				if c.IndexKPoolCompress {
					bf16(x+"index_kpool_compress_gate", c.IndexHeadDim, D)
					f32(x+"index_kpool_compress_ape", c.IndexKPool, c.IndexHeadDim)
				}
			}
		}
		m := p + ".mlp."
		switch {
		case c.IsMoE(i):
			E, I := c.NRoutedExperts, c.MoEIntermediateSize
			bf16(m+"gate.weight", E, D)
			f32(m+"gate.e_score_correction_bias", E)
			for e := 0; e < E; e++ {
				x := fmt.Sprintf("%sexperts.%d.", m, e)
				quant(x+"gate_proj.weight", I, D)
				quant(x+"up_proj.weight", I, D)
				quant(x+"down_proj.weight", D, I)
			}
			if S := c.SharedIntermediateSize(); S > 0 {
				quant(m+"shared_experts.gate_proj.weight", S, D)
				quant(m+"shared_experts.up_proj.weight", S, D)
				quant(m+"shared_experts.down_proj.weight", D, S)
			}
		case i < len(c.MLPLayerTypes) && c.MLPLayerTypes[i] == MLPDense:
			I := c.IntermediateSize
			quant(m+"gate_proj.weight", I, D)
			quant(m+"up_proj.weight", I, D)
			quant(m+"down_proj.weight", D, I)
		}
	}
	bf16(FinalNormName, D)
	if !c.TieWordEmbeddings {
		bf16(LMHeadName, c.VocabSize, D)
	}
	return out
}
