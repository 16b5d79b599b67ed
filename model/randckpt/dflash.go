package randckpt

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/glmflash/glmflash/model"
)

// DFlashSuffix names a preset's variant with a random DFlash drafter:
// "tiny-dflash" is the "tiny" trunk (the same tensors and bytes for a seed)
// plus a drafter checkpoint in z-lab's DFlashDraftModel format written in
// the subdirectory DFlashDir of the trunk's directory.
const DFlashSuffix = "-dflash"

// DFlashDir is the subdirectory of a -dflash preset's checkpoint that holds
// its drafter (config.json and model.safetensors): <out>/dflash.
const DFlashDir = "dflash"

// dflashPresets are the drafters' sizes per base preset (hidden_size is the
// trunk's; the target layers are z-lab's default for the trunk's depth).
// gpu: a Qwen3-8B DFlash drafter's attention (32 heads of 128, 8 K/V heads)
// and 5 layers at the released GLM MLP width, block 8 (the seed's).
var dflashPresets = map[string]model.DFlashConfig{
	"tiny":  {BlockSize: 8, NumHiddenLayers: 2, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 16, IntermediateSize: 128},
	"small": {BlockSize: 8, NumHiddenLayers: 2, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 64, IntermediateSize: 512},
	"bench": {BlockSize: 8, NumHiddenLayers: 3, NumAttentionHeads: 8, NumKeyValueHeads: 4, HeadDim: 128, IntermediateSize: 2816},
	"gpu":   {BlockSize: 8, NumHiddenLayers: 5, NumAttentionHeads: 32, NumKeyValueHeads: 8, HeadDim: 128, IntermediateSize: 12288},
}

// DFlashPreset returns the drafter of a -dflash preset for its trunk cfg
// (name may carry the suffix or not): hidden_size and num_target_layers
// the trunk's, target_layer_ids z-lab's default, the mask token the last
// id of the vocabulary, rope_theta 1e6 and rms_norm_eps 1e-6 (Qwen3's).
func DFlashPreset(name string, cfg *model.Config) (*model.DFlashConfig, error) {
	base, _ := strings.CutSuffix(name, DFlashSuffix)
	base, _ = strings.CutSuffix(base, MTPSuffix)
	p, ok := dflashPresets[base]
	if !ok {
		return nil, fmt.Errorf("randckpt: no DFlash drafter for preset %q (have %s)", name, strings.Join(dflashNames(), ", "))
	}
	d := p
	d.HiddenSize, d.NumTargetLayers = cfg.HiddenSize, cfg.NumHiddenLayers
	d.TargetLayerIDs = model.DefaultTargetLayerIDs(cfg.NumHiddenLayers, d.NumHiddenLayers)
	d.MaskTokenID, d.VocabSize = cfg.VocabSize-1, cfg.VocabSize
	d.RMSNormEps, d.RopeTheta, d.HiddenAct = 1e-6, 1e6, "silu"
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("randckpt: DFlash preset %s: %w", name, err)
	}
	if err := d.CheckTarget(cfg); err != nil {
		return nil, fmt.Errorf("randckpt: DFlash preset %s: %w", name, err)
	}
	return &d, nil
}

func dflashNames() []string {
	var out []string
	for _, n := range PresetNames() {
		if strings.HasSuffix(n, DFlashSuffix) {
			out = append(out, n)
		}
	}
	return out
}

// IsDFlashPreset reports whether a preset name asks for a drafter.
func IsDFlashPreset(name string) bool { return strings.HasSuffix(name, DFlashSuffix) }

// WriteDFlash writes a random drafter checkpoint for d into dir (created if
// needed): config.json (DFlashConfig.MarshalHF) and model.safetensors with
// the tensors of d.WeightCatalog() in bfloat16, drawn as Write draws a
// trunk's (the same seed gives the same bytes). A previous
// model.safetensors, index and shards in dir are removed first. The
// drafter has no embedding and no LM head: it uses the trunk's.
func WriteDFlash(dir string, d *model.DFlashConfig, opts Options) error {
	if d == nil {
		return fmt.Errorf("randckpt: nil DFlash config")
	}
	if err := d.Validate(); err != nil {
		return fmt.Errorf("randckpt: DFlash drafter: %w", err)
	}
	if opts.FP8 || opts.ShardBytes > 0 {
		return fmt.Errorf("randckpt: a DFlash drafter is written in bfloat16 as one file (FP8 and shards are not implemented for it)")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("randckpt: %w", err)
	}
	if err := removeWeights(dir); err != nil {
		return err
	}
	js, err := d.MarshalHF()
	if err != nil {
		return fmt.Errorf("randckpt: DFlash config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, model.ConfigFile), js, 0o644); err != nil {
		return fmt.Errorf("randckpt: %w", err)
	}
	var units []unit
	for _, s := range d.WeightCatalog() {
		units = append(units, unit{weight: s})
	}
	g := &generator{seed: uint64(opts.Seed) ^ 0xdf1a5, block: [2]int{model.DefaultBlockSize, model.DefaultBlockSize}}
	return g.writeFile(filepath.Join(dir, model.SingleFile), units)
}
