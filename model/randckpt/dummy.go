package randckpt

import (
	"errors"
	"fmt"

	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
)

// DummyOptions control Dummy.
type DummyOptions struct {
	// Seed and FP8 are Write's (Options): the same seed and layout give
	// the very bytes Write writes.
	Seed int64
	FP8  bool
	// Source describes the weights in messages, logs and reports (it must
	// say that they are random: "dummy weights (random, seed 1) of preset
	// tiny").
	Source string
	// Dir is the directory the config (and tokenizer) came from ("" for a
	// preset): the checkpoint's Dir.
	Dir string
}

// Dummy returns cfg's random weights as a checkpoint made in memory, with
// no file written (model.load_format: dummy): the tensors, dtypes, shapes,
// FP8 block scales and bytes of Write(dir, cfg, Options{Seed, FP8}), and
// its config (the quantization_config Write puts in config.json). Each
// tensor (an FP8 weight with its block scale) is generated the first time
// it is read, its values drawn in parallel (Write's generator: chunks of
// PCG streams keyed by seed, name and chunk, so the bytes do not depend on
// the order or the parallelism); a tensor whose readers all released it
// (safetensors.File.Release: a device backend once it uploaded it) is
// freed, and generated again if read again.
func Dummy(cfg *model.Config, o DummyOptions) (*model.Checkpoint, error) {
	if cfg == nil {
		return nil, errors.New("randckpt: nil config")
	}
	if o.Source == "" {
		return nil, errors.New("randckpt: dummy weights need a source description")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("randckpt: %w", err)
	}
	cfg = withLayout(cfg, o.FP8)
	units := unitsOf(cfg, o.FP8)
	groups := make([][]safetensors.GenTensor, len(units))
	for i, u := range units {
		groups[i] = []safetensors.GenTensor{{Name: u.weight.Name, DType: u.weight.DType, Shape: u.weight.Shape}}
		if u.scale != nil {
			groups[i] = append(groups[i], safetensors.GenTensor{Name: u.scale.Name, DType: u.scale.DType, Shape: u.scale.Shape})
		}
	}
	g := &generator{seed: uint64(o.Seed), block: cfg.BlockSize()}
	fill := func(i int, dst [][]byte) error {
		var scale []byte
		if units[i].scale != nil {
			scale = dst[1]
		}
		return g.fillUnit(units[i], dst[0], scale)
	}
	f, err := safetensors.NewGenerated(o.Source, groups, map[string]string{"format": "pt"}, fill)
	if err != nil {
		return nil, fmt.Errorf("randckpt: %w", err)
	}
	ck, err := model.NewGenerated(cfg, o.Source, o.Dir, f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("randckpt: %w", err)
	}
	return ck, nil
}

// withLayout returns a copy of cfg with the quantization_config of the
// layout Write writes: FP8 (e4m3, dynamic activations, cfg's block size and
// modules_to_not_convert when it has them, else 128×128) or none.
func withLayout(cfg *model.Config, fp8 bool) *model.Config {
	cfg = cfg.Clone()
	if !fp8 {
		cfg.Quant = nil
		return cfg
	}
	q := &model.QuantConfig{Method: "fp8", Fmt: "e4m3", ActivationScheme: "dynamic", WeightBlockSize: [2]int{128, 128}}
	if cfg.Quant != nil {
		q.WeightBlockSize = cfg.Quant.WeightBlockSize
		q.ModulesToNotConvert = cfg.Quant.ModulesToNotConvert
	}
	cfg.Quant = q
	return cfg
}

// unitsOf lists the tensors of cfg's checkpoint in the layout (the trunk's
// catalog, then the MTP layers'), each FP8 weight with its block scale.
func unitsOf(cfg *model.Config, fp8 bool) []unit {
	cat := append(cfg.WeightCatalog(fp8), cfg.MTPWeightCatalog(fp8)...)
	var units []unit
	for i := 0; i < len(cat); i++ {
		u := unit{weight: cat[i]}
		if i+1 < len(cat) && cat[i+1].Name == model.ScaleName(cat[i].Name) {
			u.scale = &cat[i+1]
			i++
		}
		units = append(units, u)
	}
	return units
}
