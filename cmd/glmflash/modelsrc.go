package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/glmflash/glmflash/core/graph"
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
	cmd      *cobra.Command // set by add: which flags were given
	opened   string         // the directory open used
	// checkTensors scans every weight for NaN/Inf after opening.
	checkTensors bool
}

// addCheckTensors adds --check-tensors (commands that run the model).
func (m *modelFlags) addCheckTensors(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&m.checkTensors, "check-tensors", false, "read every weight once at load and refuse a checkpoint holding NaN or infinite values")
}

// open returns the checkpoint the flags name, checked with --check-tensors.
func (m *modelFlags) open() (*model.Checkpoint, error) {
	ck, err := m.openOnly()
	if err != nil || !m.checkTensors {
		return ck, err
	}
	log.Info().Str("dir", ck.Dir()).Msg("checking every tensor for NaN and infinite values (--check-tensors)")
	if err := ck.CheckTensors(); err != nil {
		ck.Close()
		return nil, err
	}
	return ck, nil
}

func (m *modelFlags) add(cmd *cobra.Command, allowPreset bool) {
	m.cmd = cmd
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

func (m *modelFlags) openOnly() (*model.Checkpoint, error) {
	switch {
	case m.dir != "" && m.preset != "":
		return nil, fmt.Errorf("--model and --preset are mutually exclusive")
	case m.dir != "":
		if m.cmd != nil {
			for _, f := range []string{"seed", "cache-dir", "fp8"} {
				if m.cmd.Flags().Changed(f) {
					return nil, fmt.Errorf("--%s applies to --preset only; with --model it would be ignored", f)
				}
			}
		}
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
		if err := writePreset(dir, cfg, randckpt.Options{Seed: m.seed, FP8: m.fp8}); err != nil {
			return nil, err
		}
		if err := addPresetTokenizer(dir, cfg.VocabSize); err != nil {
			return nil, err
		}
		m.opened = dir
		return model.Open(dir)
	}
	return nil, fmt.Errorf("name a model with --model DIR or --preset NAME")
}

// writePreset writes a preset's checkpoint into dir unless it is there.
// Processes may race for the same dir: each writes into a temporary folder
// of its own and renames it into place; a loser finds the winner's
// checkpoint (identical bytes: same preset and seed) and drops its own.
func writePreset(dir string, cfg *model.Config, opts randckpt.Options) error {
	if _, err := os.Stat(filepath.Join(dir, model.ConfigFile)); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("--cache-dir: %w", err)
	}
	log.Info().Str("dir", dir).Msg("writing random checkpoint")
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".tmp-")
	if err != nil {
		return fmt.Errorf("--cache-dir: %w", err)
	}
	defer os.RemoveAll(tmp) // gone after the rename; removed on failure
	if err := randckpt.Write(tmp, cfg, opts); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, model.ConfigFile)); serr == nil {
			return nil // another process finished first
		}
		return err
	}
	return nil
}

// addPresetTokenizer gives a preset checkpoint written by an older
// glmflash its tokenizer. Like writePreset it is race-free: the files are
// written into a temporary folder and renamed into place, tokenizer.json
// last (its presence means done).
func addPresetTokenizer(dir string, vocab int) error {
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err == nil {
		return nil
	}
	tmp, err := os.MkdirTemp(dir, ".tokenizer.tmp-")
	if err != nil {
		return fmt.Errorf("--cache-dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := randckpt.WriteTokenizer(tmp, vocab); err != nil {
		return err
	}
	for _, f := range []string{"tokenizer_config.json", "tokenizer.json"} {
		if err := os.Rename(filepath.Join(tmp, f), filepath.Join(dir, f)); err != nil {
			return err
		}
	}
	return nil
}

// dumpGraph prints a graph as the --dump-graph flag asks: "summary" or "text".
func dumpGraph(what string, cfg *model.Config, mode graph.Mode, logits graph.Logits) error {
	if what == "" {
		return nil
	}
	g, err := graph.Build(cfg, graph.Options{Mode: mode, Logits: logits})
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
