package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/spf13/cobra"
)

func newInitRandomCmd() *cobra.Command {
	var preset, out string
	var seed int64
	var fp8, force bool
	var shardMiB int
	var set []string
	var drafterOnly bool
	cmd := &cobra.Command{
		Use: "init-random --preset NAME --out DIR",
		Long: "Write a real-format checkpoint (config.json + safetensors) with random weights. A -dflash preset " +
			"(e.g. tiny-dflash, gpu-dflash) writes the base preset's trunk in DIR and a random DFlash drafter " +
			"(z-lab's DFlashDraftModel format, bfloat16) in DIR/dflash: pass it as --draft-model DIR/dflash.",
		Args:  cobra.NoArgs,
		Short: "Write a real-format checkpoint (config.json + safetensors) with random weights",
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("--out is required")
			}
			if shardMiB < 0 {
				return fmt.Errorf("--shard-mib must be ≥ 0 (0 = one file), got %d", shardMiB)
			}
			overrides := map[string]json.RawMessage{}
			for _, kv := range set {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return fmt.Errorf("--set %q: want FIELD=VALUE (a text_config field, a JSON value)", kv)
				}
				overrides[k] = json.RawMessage(v)
			}
			cfg, err := randckpt.PresetWith(preset, overrides)
			if err != nil {
				return err
			}
			if drafterOnly {
				if !randckpt.IsDFlashPreset(preset) {
					return fmt.Errorf("--drafter-only needs a -dflash preset (e.g. gpu-dflash), got %q", preset)
				}
				if fp8 || shardMiB != 0 {
					return fmt.Errorf("--drafter-only writes the bfloat16 drafter alone: --fp8 and --shard-mib apply to the trunk, which it does not write")
				}
				dir := filepath.Join(out, randckpt.DFlashDir)
				if err := checkOut(dir, force); err != nil {
					return err
				}
				return writeDFlash(preset, cfg, dir, seed)
			}
			if err := checkOut(out, force); err != nil {
				return err
			}
			log.Info().Str("preset", preset).Strs("set", set).Int64("seed", seed).Bool("fp8", fp8).Str("out", out).Msg("writing checkpoint")
			if err := randckpt.Write(out, cfg, randckpt.Options{Seed: seed, FP8: fp8, ShardBytes: int64(shardMiB) << 20}); err != nil {
				return err
			}
			ck, err := model.Open(out)
			if err != nil {
				return fmt.Errorf("written checkpoint does not open: %w", err)
			}
			defer ck.Close()
			if err := ck.Validate(); err != nil {
				return fmt.Errorf("written checkpoint does not validate: %w", err)
			}
			mtp := ""
			if cfg.HasMTP() {
				if err := ck.ValidateMTP(); err != nil {
					return fmt.Errorf("written checkpoint does not validate: %w", err)
				}
				mtp = fmt.Sprintf(" + %d MTP layer(s)", cfg.NumNextNPredictLayers)
			}
			fmt.Printf("wrote %s: preset %s, %d tensors, hidden %d, %d layers%s\n", out, preset, len(ck.Names()), cfg.HiddenSize, cfg.NumHiddenLayers, mtp)
			if randckpt.IsDFlashPreset(preset) {
				return writeDFlash(preset, cfg, filepath.Join(out, randckpt.DFlashDir), seed)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&preset, "preset", "tiny", "preset: "+strings.Join(randckpt.PresetNames(), ", "))
	cmd.Flags().StringVar(&out, "out", "", "output directory")
	cmd.Flags().Int64Var(&seed, "seed", 1, "random seed")
	cmd.Flags().BoolVar(&fp8, "fp8", false, "native FP8 layout (block-scaled e4m3 where the real checkpoint has it)")
	cmd.Flags().IntVar(&shardMiB, "shard-mib", 0, "split into shards of about this many MiB (0 = one file)")
	cmd.Flags().StringArrayVar(&set, "set", nil, "FIELD=VALUE: a text_config field of the preset set to a JSON value (repeatable), e.g. --set n_routed_experts=16 for a scaled variant")
	cmd.Flags().BoolVar(&force, "force", false, "replace the checkpoint (or other files) already in --out")
	cmd.Flags().BoolVar(&drafterOnly, "drafter-only", false, "with a -dflash preset: write only the drafter (in DIR/dflash), for a trunk served with --load-format dummy --preset BASE")
	return cmd
}

// writeDFlash writes a -dflash preset's random drafter beside its trunk
// (in <out>/dflash) and checks that it opens and fits the trunk.
func writeDFlash(preset string, cfg *model.Config, dir string, seed int64) error {
	d, err := randckpt.DFlashPreset(preset, cfg)
	if err != nil {
		return err
	}
	log.Info().Str("preset", preset).Int64("seed", seed).Str("out", dir).Msg("writing DFlash drafter")
	if err := randckpt.WriteDFlash(dir, d, randckpt.Options{Seed: seed}); err != nil {
		return err
	}
	dk, err := model.OpenDFlash(dir, model.OpenOptions{})
	if err != nil {
		return fmt.Errorf("written drafter does not open: %w", err)
	}
	defer dk.Close()
	if err := dk.DFlashConfig().CheckTarget(cfg); err != nil {
		return fmt.Errorf("written drafter: %w", err)
	}
	fmt.Printf("wrote %s: DFlash drafter, %d layers, block %d, target layers %v, mask token %d\n", dir, d.NumHiddenLayers, d.BlockSize, d.TargetLayerIDs, d.MaskTokenID)
	return nil
}

// checkOut refuses an --out that exists and is not an empty directory,
// unless force.
func checkOut(out string, force bool) error {
	st, err := os.Stat(out)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("--out %s exists and is not a directory", out)
	}
	ents, err := os.ReadDir(out)
	if err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	if len(ents) > 0 && !force {
		what := "files"
		if _, err := os.Stat(filepath.Join(out, model.ConfigFile)); err == nil {
			what = "a checkpoint"
		}
		return fmt.Errorf("--out %s already holds %s (%d entries): refusing to overwrite it (pass --force to replace it)", out, what, len(ents))
	}
	return nil
}
