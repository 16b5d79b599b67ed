package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/glmflash/glmflash/core/build"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/text"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/chat"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/model/tokenizer"
	"github.com/spf13/cobra"
)

// modelFlags select a checkpoint: a directory, or a preset generated (once)
// into a cache directory.
type modelFlags struct {
	dir      string
	preset   string
	seed     int64
	cacheDir string
	fp8      bool
	opened   string // the directory open used
}

func (m *modelFlags) add(cmd *cobra.Command, allowPreset bool) {
	cmd.Flags().StringVar(&m.dir, "model", "", "checkpoint directory (config.json + safetensors)")
	if allowPreset {
		cmd.Flags().StringVar(&m.preset, "preset", "", "use a random checkpoint of this preset ("+strings.Join(randckpt.PresetNames(), ", ")+") instead of --model")
		cmd.Flags().Int64Var(&m.seed, "seed", 1, "seed of the preset's random weights")
		cmd.Flags().StringVar(&m.cacheDir, "cache-dir", defaultCacheDir(), "where preset checkpoints are written")
		cmd.Flags().BoolVar(&m.fp8, "fp8", false, "write the preset in the native FP8 layout")
	}
}

func defaultCacheDir() string {
	if d := os.Getenv("GLMFLASH_CACHE"); d != "" {
		return d
	}
	return filepath.Join(".cache", "glmflash")
}

// open returns the checkpoint the flags name.
func (m *modelFlags) open() (*model.Checkpoint, error) {
	switch {
	case m.dir != "" && m.preset != "":
		return nil, fmt.Errorf("--model and --preset are mutually exclusive")
	case m.dir != "":
		m.opened = m.dir
		ck, err := model.Open(m.dir)
		if err != nil {
			return nil, err
		}
		if err := ck.Validate(); err != nil {
			ck.Close()
			return nil, err
		}
		return ck, nil
	case m.preset != "":
		cfg, err := randckpt.Preset(m.preset)
		if err != nil {
			return nil, err
		}
		suffix := ""
		if m.fp8 {
			suffix = "-fp8"
		}
		dir := filepath.Join(m.cacheDir, fmt.Sprintf("%s-seed%d%s", m.preset, m.seed, suffix))
		if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
			log.Info().Str("preset", m.preset).Str("dir", dir).Msg("writing random checkpoint")
			tmp := dir + ".tmp"
			os.RemoveAll(tmp)
			if err := randckpt.Write(tmp, cfg, randckpt.Options{Seed: m.seed, FP8: m.fp8}); err != nil {
				return nil, err
			}
			if err := os.Rename(tmp, dir); err != nil {
				return nil, err
			}
		}
		if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); os.IsNotExist(err) {
			// written by an older glmflash: add the preset's tokenizer
			if err := randckpt.WriteTokenizer(dir, cfg.VocabSize); err != nil {
				return nil, err
			}
		}
		m.opened = dir
		return model.Open(dir)
	}
	return nil, fmt.Errorf("name a model with --model DIR or --preset NAME")
}

// dumpGraph prints a graph as the --dump-graph flag asks: "summary" or "text".
func dumpGraph(what string, cfg *model.Config, mode build.Mode, logits build.Logits) error {
	if what == "" {
		return nil
	}
	g, err := build.Build(cfg, build.Options{Mode: mode, Logits: logits})
	if err != nil {
		return err
	}
	return printGraph(what, g)
}

func printGraph(what string, g *ir.Graph) error {
	switch what {
	case "summary":
		fmt.Print(g.Summary())
	case "text":
		fmt.Print(g.Text())
	default:
		return fmt.Errorf("--dump-graph must be summary or text, got %q", what)
	}
	return nil
}

// textModel loads the tokenizer and chat template of the directory open
// used; either may be missing (nil), anything else wrong is an error.
func (m *modelFlags) textModel(vocab int) (*text.Model, error) {
	tm := &text.Model{}
	tk, err := tokenizer.Load(m.opened)
	switch {
	case err == nil:
		tm.Tok = tk
	case errors.Is(err, fs.ErrNotExist):
		log.Warn().Str("dir", m.opened).Msg("no tokenizer.json: token-id prompts only")
		return tm, nil
	default:
		return nil, err
	}
	if tk.VocabSize() > vocab {
		log.Warn().Int("tokenizer_ids", tk.VocabSize()).Int("vocab_size", vocab).Msg("the tokenizer has more ids than the model's vocabulary")
	}
	tm.Chat, err = chat.Load(m.opened)
	if errors.Is(err, chat.ErrNoTemplate) {
		log.Warn().Str("dir", m.opened).Msg("no chat template: chat requests are refused")
		err = nil
	}
	return tm, err
}
