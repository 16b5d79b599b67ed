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
// MTP layers (index ≥ num_hidden_layers, see MTPWeightCatalog) and the
// vision tower are not listed. A DSA layer whose indexer is shared has no
// indexer tensors.
func (c *Config) WeightCatalog(fp8 bool) []WeightSpec {
	D, H := c.HiddenSize, c.HCMult
	k := &catalog{c: c, fp8: fp8}
	k.bf16(EmbedName, c.VocabSize, D)
	for i := 0; i < c.NumHiddenLayers; i++ {
		p := LayerPrefix(i)
		k.bf16(p+".input_layernorm.weight", D)
		k.bf16(p+".post_attention_layernorm.weight", D)
		for _, site := range []string{"attn", "ffn"} {
			k.f32(p+".hc_"+site+"_fn", c.HCMix(), H*D)
			k.f32(p+".hc_"+site+"_base", c.HCMix())
			k.f32(p+".hc_"+site+"_scale", 3)
		}
		switch {
		case c.IsKDA(i):
			k.kda(p + ".self_attn.")
		case c.IsDSA(i):
			k.dsa(p+".self_attn.", c.HasOwnIndexer(i))
		}
		switch {
		case c.IsMoE(i):
			k.moe(p + ".mlp.")
		case i < len(c.MLPLayerTypes) && c.MLPLayerTypes[i] == MLPDense:
			I, m := c.IntermediateSize, p+".mlp."
			k.quant(m+"gate_proj.weight", I, D)
			k.quant(m+"up_proj.weight", I, D)
			k.quant(m+"down_proj.weight", D, I)
		}
	}
	k.bf16(FinalNormName, D)
	if !c.TieWordEmbeddings {
		k.bf16(LMHeadName, c.VocabSize, D)
	}
	return k.out
}

// MTPWeightCatalog lists the tensors of the MTP (NextN) layers, layer
// num_hidden_layers + k for k < num_nextn_predict_layers (architecture §2.1:
// layer 45 of the released model): enorm, hnorm, eh_proj [D, 2D] (on the
// concatenation [enorm(embedding), hnorm(hidden)]), the pre-norm layer's
// input/post-attention norms, a DSA attention with its own full indexer, a
// MoE with shared experts, and shared_head.norm. It has no mHC tensors, and
// shares the trunk's embedding and lm_head (listed by WeightCatalog). FP8
// covers the same module kinds as the trunk (§2.3): the MLA q_a, q_b,
// kv_a and o projections and every expert matrix; eh_proj stays BF16. Empty
// when the config declares no MTP layer.
func (c *Config) MTPWeightCatalog(fp8 bool) []WeightSpec {
	D := c.HiddenSize
	k := &catalog{c: c, fp8: fp8}
	for _, i := range c.MTPLayers() {
		p := LayerPrefix(i)
		k.bf16(p+".enorm.weight", D)
		k.bf16(p+".hnorm.weight", D)
		k.bf16(p+".eh_proj.weight", D, 2*D)
		k.bf16(p+".input_layernorm.weight", D)
		k.bf16(p+".post_attention_layernorm.weight", D)
		k.dsa(p+".self_attn.", true)
		k.moe(p + ".mlp.")
		k.bf16(p+".shared_head.norm.weight", D)
	}
	return k.out
}

// catalog accumulates weight specs.
type catalog struct {
	c   *Config
	fp8 bool
	out []WeightSpec
}

func (k *catalog) add(name string, dt safetensors.DType, shape ...int) {
	k.out = append(k.out, WeightSpec{Name: name, Shape: shape, DType: dt})
}

func (k *catalog) bf16(name string, shape ...int) { k.add(name, safetensors.BF16, shape...) }
func (k *catalog) f32(name string, shape ...int)  { k.add(name, safetensors.F32, shape...) }

// quant adds an FP8-eligible weight [n, in] (and, in the FP8 layout, its scale).
func (k *catalog) quant(name string, n, in int) {
	eligible := !k.c.notConverted(name)
	if k.fp8 && eligible {
		k.out = append(k.out, WeightSpec{Name: name, Shape: []int{n, in}, DType: safetensors.F8E4M3, FP8Eligible: true},
			WeightSpec{Name: name + ScaleSuffix, Shape: k.c.ScaleShape(n, in), DType: safetensors.F32})
		return
	}
	k.out = append(k.out, WeightSpec{Name: name, Shape: []int{n, in}, DType: safetensors.BF16, FP8Eligible: eligible})
}

// kda adds a KDA token mixer's tensors under prefix a ("….self_attn.").
func (k *catalog) kda(a string) {
	c := k.c
	D, P, nh, hd, K := c.HiddenSize, c.KDAProjDim(), c.LinearNumHeads, c.LinearHeadDim, c.LinearConvKernelDim
	for _, x := range []string{"q", "k", "v"} {
		k.bf16(a+x+"_proj.weight", P, D)
	}
	for _, x := range []string{"q", "k", "v"} {
		k.f32(a+x+"_conv1d.weight", P, 1, K)
	}
	k.bf16(a+"f_a_proj.weight", hd, D)
	k.bf16(a+"f_b_proj.weight", P, hd)
	k.f32(a+"dt_bias", P)
	k.f32(a+"A_log", nh)
	k.bf16(a+"b_proj.weight", nh, D)
	k.bf16(a+"g_a_proj.weight", hd, D)
	k.bf16(a+"g_b_proj.weight", P, hd)
	k.bf16(a+"o_norm.weight", hd)
	k.bf16(a+"o_proj.weight", D, P)
}

// dsa adds a DSA/MLA token mixer's tensors under prefix a, with the
// indexer's when ownIndexer.
func (k *catalog) dsa(a string, ownIndexer bool) {
	c := k.c
	D, nh := c.HiddenSize, c.NumAttentionHeads
	k.quant(a+"q_a_proj.weight", c.QLoraRank, D)
	k.bf16(a+"q_a_layernorm.weight", c.QLoraRank)
	k.quant(a+"q_b_proj.weight", nh*c.QKHeadDim(), c.QLoraRank)
	k.quant(a+"kv_a_proj_with_mqa.weight", c.KVLoraRank+c.QKRopeHeadDim, D)
	k.bf16(a+"kv_a_layernorm.weight", c.KVLoraRank)
	k.bf16(a+"kv_b_proj.weight", nh*(c.QKNopeHeadDim+c.VHeadDim), c.KVLoraRank)
	k.quant(a+"o_proj.weight", D, nh*c.VHeadDim)
	if !ownIndexer {
		return
	}
	x := a + "indexer."
	k.bf16(x+"wq_b.weight", c.IndexNHeads*c.IndexHeadDim, c.QLoraRank)
	k.bf16(x+"wk.weight", c.IndexHeadDim, D)
	k.bf16(x+"k_norm.weight", c.IndexHeadDim)
	k.bf16(x+"k_norm.bias", c.IndexHeadDim)
	k.bf16(x+"weights_proj.weight", c.IndexNHeads, D)
	if c.IndexKPoolCompress {
		k.bf16(x+"index_kpool_compress_gate", c.IndexHeadDim, D)
		k.f32(x+"index_kpool_compress_ape", c.IndexKPool, c.IndexHeadDim)
	}
}

// moe adds a MoE block's tensors under prefix m ("….mlp.").
func (k *catalog) moe(m string) {
	c := k.c
	D, E, I := c.HiddenSize, c.NRoutedExperts, c.MoEIntermediateSize
	k.bf16(m+"gate.weight", E, D)
	k.f32(m+"gate.e_score_correction_bias", E)
	for e := 0; e < E; e++ {
		x := fmt.Sprintf("%sexperts.%d.", m, e)
		k.quant(x+"gate_proj.weight", I, D)
		k.quant(x+"up_proj.weight", I, D)
		k.quant(x+"down_proj.weight", D, I)
	}
	if S := c.SharedIntermediateSize(); S > 0 {
		k.quant(m+"shared_experts.gate_proj.weight", S, D)
		k.quant(m+"shared_experts.up_proj.weight", S, D)
		k.quant(m+"shared_experts.down_proj.weight", D, S)
	}
}
