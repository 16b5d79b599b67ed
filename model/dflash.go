package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"

	"github.com/glmflash/glmflash/internal/regular"
	"github.com/glmflash/glmflash/model/safetensors"
)

// DFlashArchitecture is the architectures entry of a DFlash drafter's
// config.json (z-lab's DFlashDraftModel).
const DFlashArchitecture = "DFlashDraftModel"

// DFlashConfig is a DFlash block drafter's configuration (z-lab/dflash's
// DFlashDraftModel over a Qwen3Config): num_hidden_layers Qwen3 decoder
// layers whose attention reads the block's rows and the context rows
// fc·concat(target hidden rows) normed by hidden_norm; the embedding and the
// LM head are the target's.
type DFlashConfig struct {
	// BlockSize is block_size: the draft block's rows (the pending token
	// and BlockSize−1 masks); each forward proposes BlockSize−1 drafts.
	BlockSize int
	// TargetLayerIDs (dflash_config.target_layer_ids) are the target's
	// decoder layers whose output hidden rows the drafter reads, in the
	// order fc concatenates them; MaskTokenID (dflash_config.mask_token_id)
	// is the block's mask token.
	TargetLayerIDs []int
	MaskTokenID    int
	// NumTargetLayers is num_target_layers: the target's decoder layers.
	NumTargetLayers                                      int
	HiddenSize, IntermediateSize                         int
	NumHiddenLayers, NumAttentionHeads, NumKeyValueHeads int
	HeadDim                                              int
	RMSNormEps, RopeTheta                                float64
	// VocabSize is vocab_size when the config gives it (0: absent); it
	// must then be the target's.
	VocabSize int
	// HiddenAct is hidden_act ("silu", the only one implemented).
	HiddenAct string
}

// DefaultTargetLayerIDs is z-lab's build_target_layer_ids: the layers a
// drafter of draftLayers layers reads when its config names none.
func DefaultTargetLayerIDs(targetLayers, draftLayers int) []int {
	if draftLayers == 1 {
		return []int{targetLayers / 2}
	}
	start, end := 1, targetLayers-3
	out := make([]int, draftLayers)
	for i := range out {
		out[i] = int(math.RoundToEven(float64(start) + float64(i*(end-start))/float64(draftLayers-1))) // Python round: half to even
	}
	return out
}

// ParseDFlashConfig parses a DFlash drafter's config.json and validates
// it. Settings the drafter does not implement are refused naming their key:
// attention_bias or mlp_bias true, sliding windows (use_sliding_window
// true, a "sliding_attention" entry of layer_types), rope_scaling or a
// rope_parameters rope_type other than default, a hidden_act other than
// silu, tie_word_embeddings true.
func ParseDFlashConfig(data []byte, source string) (*DFlashConfig, error) {
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
	p := &parser{m: top, src: source}
	nerr := len(p.errs)
	if arch, _ := p.strList("architectures"); !slices.Contains(arch, DFlashArchitecture) && len(p.errs) == nerr {
		p.fail("architectures", "want a list holding %q (a DFlash drafter's config), got %s", DFlashArchitecture, jsonText(top["architectures"]))
	}
	required := func(key string) int {
		if _, ok := p.get(key); !ok {
			p.fail(key, "missing (required by a DFlash drafter)")
			return 0
		}
		return p.int(key, 0)
	}
	c := &DFlashConfig{
		BlockSize:         required("block_size"),
		NumTargetLayers:   required("num_target_layers"),
		HiddenSize:        required("hidden_size"),
		IntermediateSize:  required("intermediate_size"),
		NumHiddenLayers:   required("num_hidden_layers"),
		NumAttentionHeads: required("num_attention_heads"),
		RMSNormEps:        p.float("rms_norm_eps", 1e-6),
		RopeTheta:         p.float("rope_theta", 10000),
		VocabSize:         p.int("vocab_size", 0),
		HiddenAct:         p.string("hidden_act", "silu"),
	}
	c.NumKeyValueHeads = p.int("num_key_value_heads", c.NumAttentionHeads)
	hd := 0
	if c.NumAttentionHeads > 0 {
		hd = c.HiddenSize / c.NumAttentionHeads
	}
	c.HeadDim = p.int("head_dim", hd)
	for _, key := range []string{"attention_bias", "mlp_bias", "use_sliding_window", "tie_word_embeddings"} {
		if p.bool(key, false) {
			p.fail(key, "true is not implemented by the DFlash drafter (want false or absent)")
		}
	}
	if v, ok := p.get("rope_scaling"); ok {
		p.fail("rope_scaling", "%s is not implemented by the DFlash drafter (want null or absent)", jsonText(v))
	}
	// transformers ≥ 5 writes RoPE as rope_parameters {rope_type, rope_theta}
	if rp, ok := p.get("rope_parameters"); ok {
		rm, isMap := rp.(map[string]any)
		if !isMap {
			p.fail("rope_parameters", "want an object, got %s", jsonText(rp))
		} else {
			sub := &parser{m: rm, src: source + ": rope_parameters"}
			if t := sub.string("rope_type", "default"); t != "default" {
				sub.fail("rope_type", "%q is not implemented by the DFlash drafter (want \"default\")", t)
			}
			for k := range rm {
				if k != "rope_type" && k != "rope_theta" {
					sub.fail(k, "is not implemented by the DFlash drafter (rope_parameters takes rope_type default and rope_theta)")
				}
			}
			if _, ok := sub.get("rope_theta"); ok {
				theta := sub.float("rope_theta", c.RopeTheta)
				if _, top := p.get("rope_theta"); top && theta != c.RopeTheta {
					sub.fail("rope_theta", "%g disagrees with the top-level rope_theta %g", theta, c.RopeTheta)
				}
				c.RopeTheta = theta
			}
			p.errs = append(p.errs, sub.errs...)
		}
	}
	if lt, ok := p.strList("layer_types"); ok {
		for i, t := range lt {
			if t != "full_attention" {
				p.fail(fmt.Sprintf("layer_types[%d]", i), "%q is not implemented by the DFlash drafter (want \"full_attention\")", t)
			}
		}
	}
	dc, ok := p.get("dflash_config")
	dm, isMap := dc.(map[string]any)
	switch {
	case !ok:
		p.fail("dflash_config", "missing (it gives mask_token_id)")
	case !isMap:
		p.fail("dflash_config", "want an object, got %s", jsonText(dc))
	default:
		sub := &parser{m: dm, src: source + ": dflash_config"}
		if _, ok := sub.get("mask_token_id"); !ok {
			sub.fail("mask_token_id", "missing (the block's mask token)")
		}
		c.MaskTokenID = sub.int("mask_token_id", 0)
		if v, ok := sub.get("target_layer_ids"); ok {
			c.TargetLayerIDs, _ = sub.intList("target_layer_ids", v)
		} else if c.NumTargetLayers > 0 && c.NumHiddenLayers > 0 {
			c.TargetLayerIDs = DefaultTargetLayerIDs(c.NumTargetLayers, c.NumHiddenLayers)
		}
		p.errs = append(p.errs, sub.errs...)
	}
	if err := errors.Join(p.errs...); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	return c, nil
}

// Validate checks the drafter's sizes, naming the key of the first bad one.
func (c *DFlashConfig) Validate() error {
	var errs []error
	positive := func(key string, v int) {
		if v < 1 {
			errs = append(errs, fmt.Errorf("%s must be ≥ 1, got %d", key, v))
		}
	}
	positive("num_target_layers", c.NumTargetLayers)
	positive("hidden_size", c.HiddenSize)
	positive("intermediate_size", c.IntermediateSize)
	positive("num_hidden_layers", c.NumHiddenLayers)
	positive("num_attention_heads", c.NumAttentionHeads)
	positive("num_key_value_heads", c.NumKeyValueHeads)
	positive("head_dim", c.HeadDim)
	if c.BlockSize < 2 || c.BlockSize > MaxDFlashBlock {
		errs = append(errs, fmt.Errorf("block_size must be in [2, %d] (a block of one row drafts nothing), got %d", MaxDFlashBlock, c.BlockSize))
	}
	if c.NumKeyValueHeads > 0 && c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
		errs = append(errs, fmt.Errorf("num_key_value_heads (%d) must divide num_attention_heads (%d)", c.NumKeyValueHeads, c.NumAttentionHeads))
	}
	if c.HeadDim%2 != 0 {
		errs = append(errs, fmt.Errorf("head_dim must be even (RoPE rotates its halves), got %d", c.HeadDim))
	}
	if !(c.RMSNormEps > 0) || math.IsInf(c.RMSNormEps, 0) {
		errs = append(errs, fmt.Errorf("rms_norm_eps must be > 0, got %g", c.RMSNormEps))
	}
	if !(c.RopeTheta > 0) || math.IsInf(c.RopeTheta, 0) {
		errs = append(errs, fmt.Errorf("rope_theta must be > 0, got %g", c.RopeTheta))
	}
	if c.HiddenAct != "silu" {
		errs = append(errs, fmt.Errorf("hidden_act %q is not implemented by the DFlash drafter (want \"silu\")", c.HiddenAct))
	}
	if len(c.TargetLayerIDs) == 0 {
		errs = append(errs, fmt.Errorf("dflash_config.target_layer_ids must name at least one target layer"))
	}
	for i, l := range c.TargetLayerIDs {
		if l < 0 || (c.NumTargetLayers > 0 && l >= c.NumTargetLayers) {
			errs = append(errs, fmt.Errorf("dflash_config.target_layer_ids[%d] is %d, outside the target's layers [0, %d) (num_target_layers)", i, l, c.NumTargetLayers))
		}
	}
	if c.MaskTokenID < 0 {
		errs = append(errs, fmt.Errorf("dflash_config.mask_token_id must be ≥ 0, got %d", c.MaskTokenID))
	}
	if c.VocabSize < 0 {
		errs = append(errs, fmt.Errorf("vocab_size must be ≥ 0, got %d", c.VocabSize))
	}
	if int64(c.NumAttentionHeads)*int64(c.HeadDim) > 1<<24 || int64(len(c.TargetLayerIDs))*int64(c.HiddenSize) > 1<<26 {
		errs = append(errs, fmt.Errorf("num_attention_heads·head_dim or target layers·hidden_size is implausibly large"))
	}
	return errors.Join(errs...)
}

// MaxDFlashBlock bounds block_size (a verify span is the block; device
// stores keep per-position KDA states for it).
const MaxDFlashBlock = 32

// CheckTarget refuses a drafter that does not fit the target cfg, naming
// the key: hidden_size must be the target's, num_target_layers its decoder
// layers, every target layer id one of them, mask_token_id and vocab_size
// (when given) within its vocabulary.
func (c *DFlashConfig) CheckTarget(cfg *Config) error {
	var errs []error
	if c.HiddenSize != cfg.HiddenSize {
		errs = append(errs, fmt.Errorf("hidden_size %d is not the target's %d", c.HiddenSize, cfg.HiddenSize))
	}
	if c.NumTargetLayers != cfg.NumHiddenLayers {
		errs = append(errs, fmt.Errorf("num_target_layers %d is not the target's num_hidden_layers %d", c.NumTargetLayers, cfg.NumHiddenLayers))
	}
	for i, l := range c.TargetLayerIDs {
		if l < 0 || l >= cfg.NumHiddenLayers {
			errs = append(errs, fmt.Errorf("dflash_config.target_layer_ids[%d] is %d, outside the target's decoder layers [0, %d)", i, l, cfg.NumHiddenLayers))
		}
	}
	if c.MaskTokenID >= cfg.VocabSize {
		errs = append(errs, fmt.Errorf("dflash_config.mask_token_id %d is outside the target's vocabulary (%d tokens)", c.MaskTokenID, cfg.VocabSize))
	}
	if c.VocabSize != 0 && c.VocabSize != cfg.VocabSize {
		errs = append(errs, fmt.Errorf("vocab_size %d is not the target's %d", c.VocabSize, cfg.VocabSize))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("DFlash drafter does not fit the target: %w", err)
	}
	return nil
}

// ContextWidth is the width of the drafter's context rows: the target's
// hidden rows of every target layer, concatenated (fc's input).
func (c *DFlashConfig) ContextWidth() int { return len(c.TargetLayerIDs) * c.HiddenSize }

// KVWidth is one K (or V) row of a draft layer: num_key_value_heads·head_dim.
func (c *DFlashConfig) KVWidth() int { return c.NumKeyValueHeads * c.HeadDim }

// DFlashLayerName is draft layer l's tensor name "layers.l.<rest>".
func DFlashLayerName(l int, rest string) string { return fmt.Sprintf("layers.%d.%s", l, rest) }

// WeightCatalog lists the drafter's tensors, named as z-lab's
// DFlashDraftModel state dict names them.
func (c *DFlashConfig) WeightCatalog() []WeightSpec {
	D, I, Q, KV, hd := c.HiddenSize, c.IntermediateSize, c.NumAttentionHeads*c.HeadDim, c.KVWidth(), c.HeadDim
	bf := func(name string, shape ...int) WeightSpec {
		return WeightSpec{Name: name, Shape: shape, DType: safetensors.BF16}
	}
	specs := []WeightSpec{bf("fc.weight", D, c.ContextWidth()), bf("hidden_norm.weight", D), bf("norm.weight", D)}
	for l := 0; l < c.NumHiddenLayers; l++ {
		n := func(rest string) string { return DFlashLayerName(l, rest) }
		specs = append(specs,
			bf(n("input_layernorm.weight"), D),
			bf(n("self_attn.q_proj.weight"), Q, D),
			bf(n("self_attn.k_proj.weight"), KV, D),
			bf(n("self_attn.v_proj.weight"), KV, D),
			bf(n("self_attn.o_proj.weight"), D, Q),
			bf(n("self_attn.q_norm.weight"), hd),
			bf(n("self_attn.k_norm.weight"), hd),
			bf(n("post_attention_layernorm.weight"), D),
			bf(n("mlp.gate_proj.weight"), I, D),
			bf(n("mlp.up_proj.weight"), I, D),
			bf(n("mlp.down_proj.weight"), D, I),
		)
	}
	return specs
}

// MarshalHF writes the drafter's config.json as z-lab's checkpoints hold
// it (a Qwen3 config with architectures DFlashDraftModel, block_size,
// num_target_layers and dflash_config); ParseDFlashConfig reads it back.
func (c *DFlashConfig) MarshalHF() ([]byte, error) {
	m := map[string]any{
		"architectures":       []string{DFlashArchitecture},
		"model_type":          "qwen3",
		"dtype":               "bfloat16",
		"block_size":          c.BlockSize,
		"num_target_layers":   c.NumTargetLayers,
		"hidden_size":         c.HiddenSize,
		"intermediate_size":   c.IntermediateSize,
		"num_hidden_layers":   c.NumHiddenLayers,
		"num_attention_heads": c.NumAttentionHeads,
		"num_key_value_heads": c.NumKeyValueHeads,
		"head_dim":            c.HeadDim,
		"rms_norm_eps":        hfFloat(c.RMSNormEps),
		"rope_theta":          hfFloat(c.RopeTheta),
		"hidden_act":          c.HiddenAct,
		"attention_bias":      false,
		"rope_scaling":        nil,
		"tie_word_embeddings": false,
		"dflash_config":       map[string]any{"target_layer_ids": c.TargetLayerIDs, "mask_token_id": c.MaskTokenID},
	}
	if c.VocabSize > 0 {
		m["vocab_size"] = c.VocabSize
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// DFlashCheckpoint is an open DFlash drafter directory: config.json and its
// safetensors files (one file, a sharded index, or every *.safetensors
// file, as Open reads a trunk's), tensors named as DFlashDraftModel's state
// dict. Its reads are a weight source (Float32, Raw, FP8Scales) like a
// trunk checkpoint's.
type DFlashCheckpoint struct {
	ck   *Checkpoint // the tensors (its trunk config is empty: never read)
	dcfg *DFlashConfig
}

// OpenDFlash opens and validates the drafter checkpoint in dir: its config
// (ParseDFlashConfig) and every tensor of its catalog (present, shaped as
// the config says, a float type).
func OpenDFlash(dir string, o OpenOptions) (*DFlashCheckpoint, error) {
	cfgPath := filepath.Join(dir, ConfigFile)
	data, err := regular.ReadFile(cfgPath, regular.ConfigLimit)
	if err != nil {
		return nil, fmt.Errorf("DFlash drafter %s: %w", dir, err)
	}
	dcfg, err := ParseDFlashConfig(data, cfgPath)
	if err != nil {
		return nil, err
	}
	// the tensors' reader needs no trunk fields: FP8 blocks are the default
	ck := &Checkpoint{dir: dir, cfg: &Config{}, mode: o.Weights, tensors: make(map[string]tensorLoc)}
	if err := ck.openTensors(); err != nil {
		ck.Close()
		return nil, fmt.Errorf("DFlash drafter: %w", err)
	}
	if err := ck.validateSpecs(dcfg.WeightCatalog()); err != nil {
		ck.Close()
		return nil, fmt.Errorf("DFlash drafter %s: %w", dir, err)
	}
	return &DFlashCheckpoint{ck: ck, dcfg: dcfg}, nil
}

// OpenDFlashFor is OpenDFlash, then the drafter's fit to the target cfg
// (DFlashConfig.CheckTarget).
func OpenDFlashFor(dir string, cfg *Config, o OpenOptions) (*DFlashCheckpoint, error) {
	d, err := OpenDFlash(dir, o)
	if err != nil {
		return nil, err
	}
	if err := d.dcfg.CheckTarget(cfg); err != nil {
		d.Close()
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return d, nil
}

// DFlashConfig is the drafter's configuration.
func (d *DFlashCheckpoint) DFlashConfig() *DFlashConfig { return d.dcfg }

// Dir is the drafter's directory.
func (d *DFlashCheckpoint) Dir() string { return d.ck.dir }

// Float32 reads a drafter tensor as float32 (shape checked when given).
func (d *DFlashCheckpoint) Float32(name string, shape ...int) ([]float32, error) {
	return d.ck.Float32(name, shape...)
}

// Raw returns a drafter tensor's stored bytes (Checkpoint.Raw).
func (d *DFlashCheckpoint) Raw(name string) ([]byte, safetensors.TensorInfo, error) {
	return d.ck.Raw(name)
}

// FP8Scales returns an FP8 drafter tensor's block scales.
func (d *DFlashCheckpoint) FP8Scales(name string) ([]float32, [2]int, error) {
	return d.ck.FP8Scales(name)
}

// CheckWeights says whether the drafter's weights may still be read
// (Checkpoint.CheckWeights).
func (d *DFlashCheckpoint) CheckWeights() error { return d.ck.CheckWeights() }

// DropResident advises the kernel to drop the mapped files' pages.
func (d *DFlashCheckpoint) DropResident() error { return d.ck.DropResident() }

// Close releases the drafter's files.
func (d *DFlashCheckpoint) Close() error { return d.ck.Close() }
