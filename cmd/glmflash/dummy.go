package main

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/text"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/chat"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/model/tokenizer"
)

// dummySource says what dummy weights are (model.load_format: dummy), in
// logs, GetModelInfo and bench's report: random, their seed, and the
// config they follow.
func dummySource(mc config.Model) string {
	var b strings.Builder
	fmt.Fprintf(&b, "dummy weights (random, seed %d, model.load_format dummy: no checkpoint) ", mc.Seed)
	if mc.Dir != "" {
		fmt.Fprintf(&b, "for the config of %s", mc.Dir)
	} else {
		fmt.Fprintf(&b, "of preset %s", mc.Preset)
		if mc.FP8 {
			b.WriteString(" (FP8 layout)")
		}
	}
	if len(mc.Set) > 0 {
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(mc.Set)) {
			kv = append(kv, fmt.Sprintf("%s=%v", k, mc.Set[k]))
		}
		fmt.Fprintf(&b, " with %s", strings.Join(kv, ", "))
	}
	return b.String()
}

// openDummy makes the random weights of model.load_format dummy in memory
// (randckpt.Dummy): the config is the preset's (model.preset, FP8 layout
// with model.fp8) or the config.json of model.dir, a directory that must
// hold no weights, in its own layout (FP8 when it has a
// quantization_config); model.set applies to either. Tensors are generated
// when a program first reads them.
func openDummy(mc config.Model) (*model.Checkpoint, error) {
	set, _, err := presetSet(mc.Set)
	if err != nil {
		return nil, err
	}
	var cfg *model.Config
	fp8 := mc.FP8
	if mc.Dir != "" {
		if err := noWeights(mc.Dir); err != nil {
			return nil, err
		}
		if cfg, err = model.ReadConfig(mc.Dir); err != nil {
			return nil, fmt.Errorf("model.load_format: dummy takes the config of model.dir: %w", err)
		}
		if len(set) > 0 {
			if cfg, err = cfg.WithSet(set, filepath.Join(mc.Dir, model.ConfigFile)+" with model.set"); err != nil {
				return nil, fmt.Errorf("model.set: %w", err)
			}
		}
		fp8 = cfg.Quant != nil
	} else if cfg, err = randckpt.PresetWith(mc.Preset, set); err != nil {
		if len(set) > 0 {
			return nil, fmt.Errorf("model.set: %w", err)
		}
		return nil, err
	}
	src := dummySource(mc)
	ck, err := randckpt.Dummy(cfg, randckpt.DummyOptions{Seed: mc.Seed, FP8: fp8, Source: src, Dir: mc.Dir})
	if err != nil {
		return nil, err
	}
	layout := "bf16"
	if fp8 {
		layout = "fp8"
	}
	log.Warn().Str("source", src).Str("layout", layout).Int("layers", cfg.NumHiddenLayers).
		Float64("weights_gib", float64(ck.TensorBytes())/(1<<30)).
		Msg("dummy weights: random, made in memory (model.load_format: dummy): not a checkpoint, outputs are meaningless")
	return ck, nil
}

// noWeights refuses a model.dir that holds a checkpoint's weights under
// model.load_format dummy: its random weights would be taken for the
// checkpoint's.
func noWeights(dir string) error {
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("model.dir: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("model.dir: %s is not a directory", dir)
	}
	found, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if _, err := os.Stat(filepath.Join(dir, model.IndexFile)); err == nil {
		found = append(found, filepath.Join(dir, model.IndexFile))
	}
	if len(found) > 0 {
		return fmt.Errorf("model.load_format: dummy makes random weights, but model.dir %s holds a checkpoint's (%s): load it with load_format auto, or give a directory holding only config.json (and a tokenizer)", dir, filepath.Base(found[0]))
	}
	return nil
}

// dummyTextModel is the tokenizer and chat template of a dummy preset:
// those Write gives the preset's checkpoint (randckpt.TokenizerFiles),
// made in memory.
func dummyTextModel(vocab int) (*text.Model, error) {
	tokJSON, cfgJSON, err := randckpt.TokenizerFiles(vocab)
	if err != nil {
		return nil, fmt.Errorf("dummy tokenizer: %w", err)
	}
	tk, err := tokenizer.Parse(tokJSON)
	if err != nil {
		return nil, fmt.Errorf("dummy tokenizer: %w", err)
	}
	tm := &text.Model{Tok: tk}
	tm.Chat, err = chat.Parse(cfgJSON, "")
	switch {
	case errors.Is(err, chat.ErrNoTemplate):
		log.Warn().Msg("no chat template: chat requests are refused")
	case err != nil:
		tm.Chat, tm.ChatError = nil, err
	}
	return tm, nil
}

// fillDummy makes every dummy weight now, on every core, before an engine
// runs them on the CPU, whose backend reads them all and keeps them
// (Checkpoint.Fill); on CUDA each is made as it is uploaded, then freed.
// Weights read from a checkpoint, and commands that run no engine (graph),
// make nothing.
func fillDummy(device string, ck *model.Checkpoint) error {
	if !ck.Generated() || device == "cuda" {
		return nil
	}
	t0 := time.Now()
	if err := ck.Fill(runtime.GOMAXPROCS(0)); err != nil {
		return err
	}
	log.Info().Str("took", time.Since(t0).Round(time.Millisecond).String()).Float64("gib", float64(ck.ResidentBytes())/(1<<30)).Msg("dummy weights generated")
	return nil
}
