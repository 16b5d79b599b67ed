package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/text"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/chat"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/glmflash/glmflash/model/tokenizer"
	"github.com/spf13/cobra"
)

// modelFlags are the flags of a command that reads glmflash's
// configuration: --config (repeatable), --device, and the flags of the
// model section (--model DIR, or --preset NAME with --seed, --cache-dir and
// --fp8; --check-tensors). The configuration is the built-in defaults, the
// --config files in order, the environment (GLMFLASH_<KEY PATH>), then the
// flags the user gave: the same story on every command.
type modelFlags struct {
	cmd       *cobra.Command
	files     []string
	device    string
	precision string
	tp        int
	// speculative is --speculative (METHOD[:STEPS|:PRESET]); draftModel
	// --draft-model (a DFlash drafter's directory).
	speculative string
	draftModel  string
	dir         string
	preset      string
	seed        int64
	cacheDir    string
	fp8         bool
	// loadFormat is --load-format (model.load_format); set is --set
	// (model.set: FIELD=VALUE, repeatable).
	loadFormat string
	set        []string
	// checkTensors scans every weight for NaN/Inf after opening.
	checkTensors bool
	// extra are keys a command sets from flags of its own (serve's
	// addresses), applied after the others.
	extra []config.Flag
	cfg   *config.Config // loaded
	// opened is the directory open used.
	opened string
	own    map[string]bool // the flags registered here
}

func (m *modelFlags) registered(names ...string) {
	if m.own == nil {
		m.own = map[string]bool{}
	}
	for _, n := range names {
		m.own[n] = true
	}
}

// addConfig adds --config.
func (m *modelFlags) addConfig(cmd *cobra.Command) {
	m.cmd = cmd
	m.registered("config")
	cmd.Flags().StringArrayVar(&m.files, "config", nil, "configuration file (YAML: engine and serving sections; repeatable, later files override earlier ones) over the built-in defaults (configs/engine.yaml, configs/serve.yaml)")
}

// addDevice adds --device (the device key).
func (m *modelFlags) addDevice(cmd *cobra.Command) {
	m.cmd = cmd
	m.registered("device")
	cmd.Flags().StringVar(&m.device, "device", "", "backend that runs the model: "+strings.Join(backend.Names(), " or ")+" (default: the configuration's device, cpu)")
}

// addSpeculative adds --speculative (the speculative section's keys).
func (m *modelFlags) addSpeculative(cmd *cobra.Command) {
	m.cmd = cmd
	m.registered("speculative", "draft-model")
	cmd.Flags().StringVar(&m.speculative, "speculative", "", "speculative decoding: off, mtp (5-1-6), mtp:N (N draft steps), mtp:S-1-N (a preset: 5-1-6, 1-1-2) or dflash (a DFlash block drafter: --draft-model) (default: the configuration's speculative section, off)")
	cmd.Flags().StringVar(&m.draftModel, "draft-model", "", "the DFlash drafter's checkpoint directory for --speculative dflash (speculative.draft_model; with a -dflash preset, default: the one it writes)")
}

// speculativeFlags turns --speculative's value into configuration keys.
func speculativeFlags(v string) ([]config.Flag, error) {
	method, arg, _ := strings.Cut(v, ":")
	fl := []config.Flag{{Key: "speculative.method", Value: method, Name: "--speculative"}}
	switch {
	case arg == "":
	case method == "off":
		return nil, fmt.Errorf("--speculative: off takes no steps, got %q", v)
	case strings.Contains(arg, "-"):
		fl = append(fl, config.Flag{Key: "speculative.preset", Value: arg, Name: "--speculative"}, config.Flag{Key: "speculative.num_steps", Value: 0, Name: "--speculative"})
	default:
		n, err := strconv.Atoi(arg)
		if err != nil {
			return nil, fmt.Errorf("--speculative: %q is not METHOD, METHOD:STEPS or METHOD:PRESET", v)
		}
		fl = append(fl, config.Flag{Key: "speculative.num_steps", Value: n, Name: "--speculative"}, config.Flag{Key: "speculative.preset", Value: "", Name: "--speculative"})
	}
	return fl, nil
}

// addPrecision adds --precision (the precision key).
func (m *modelFlags) addPrecision(cmd *cobra.Command) {
	m.cmd = cmd
	m.registered("precision")
	cmd.Flags().StringVar(&m.precision, "precision", "", "fp32 (the parity mode) or bf16 (GEMMs take bf16 activations, fp32 accumulation) (default: the configuration's precision, fp32)")
}

// addTP adds --tp (parallel.tp_size).
func (m *modelFlags) addTP(cmd *cobra.Command) {
	m.cmd = cmd
	m.registered("tp")
	cmd.Flags().IntVar(&m.tp, "tp", 0, "tensor-parallel ranks (parallel.tp_size): the model's heads, MLP/expert intermediate dimensions and vocabulary split over N ranks meeting at all-reduces; on the cpu backend the ranks are goroutines of this process (default: the configuration's, 1)")
}

// add adds --model and, with allowPreset, --preset, --seed, --cache-dir and
// --fp8 (the model section).
func (m *modelFlags) add(cmd *cobra.Command, allowPreset bool) {
	d := config.Default().Model
	m.cmd = cmd
	m.registered("model")
	cmd.Flags().StringVar(&m.dir, "model", "", "checkpoint directory (config.json + safetensors)")
	if allowPreset {
		m.registered("preset", "seed", "cache-dir", "fp8")
		cmd.Flags().StringVar(&m.preset, "preset", "", "use a random checkpoint of this preset ("+strings.Join(randckpt.PresetNames(), ", ")+") instead of --model (default: the configuration's, "+d.Preset+")")
		cmd.Flags().Int64Var(&m.seed, "seed", d.Seed, "seed of the preset's random weights")
		cmd.Flags().StringVar(&m.cacheDir, "cache-dir", d.CacheDir, "where preset checkpoints are written")
		cmd.Flags().BoolVar(&m.fp8, "fp8", false, "write the preset in the native FP8 layout")
		m.addLoad(cmd, false)
	}
}

// addLoad adds --load-format and --set (model.load_format, model.set) and,
// withSeed, --seed and --fp8 (for a command without add's preset flags:
// serve).
func (m *modelFlags) addLoad(cmd *cobra.Command, withSeed bool) {
	m.cmd = cmd
	m.registered("load-format", "set")
	cmd.Flags().StringVar(&m.loadFormat, "load-format", "", "how the weights are obtained: auto (= safetensors: the checkpoint's files, or the preset's written once into --cache-dir) or dummy (random weights of the right dtypes, shapes and FP8 scales made in memory from --seed, no file read or written: over --preset, or --model DIR holding only config.json and a tokenizer) (default: the configuration's model.load_format, auto)")
	cmd.Flags().StringArrayVar(&m.set, "set", nil, "FIELD=VALUE: a text_config field set to a JSON value (model.set; repeatable), over the preset or, with --load-format dummy, the config.json of --model, e.g. --set num_hidden_layers=20")
	if withSeed {
		m.registered("seed", "fp8")
		cmd.Flags().Int64Var(&m.seed, "seed", config.Default().Model.Seed, "seed of the preset's (or the dummy weights') random weights")
		cmd.Flags().BoolVar(&m.fp8, "fp8", false, "the preset in the native FP8 layout (written, or made with --load-format dummy)")
	}
}

// setFlags turns --set's FIELD=VALUE entries into the model.set key (each
// VALUE JSON).
func setFlags(set []string) ([]config.Flag, error) {
	m := map[string]any{}
	for _, kv := range set {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsAny(k, ". ") {
			return nil, fmt.Errorf("--set %q: want FIELD=VALUE (a text_config field, a JSON value)", kv)
		}
		var val any
		if err := json.Unmarshal([]byte(v), &val); err != nil {
			return nil, fmt.Errorf("--set %s: %q is not a JSON value: %w", k, v, err)
		}
		m[k] = val
	}
	return []config.Flag{{Key: "model.set", Value: m, Name: "--set"}}, nil
}

// addCheckTensors adds --check-tensors (commands that run the model).
func (m *modelFlags) addCheckTensors(cmd *cobra.Command) {
	m.cmd = cmd
	m.registered("check-tensors")
	cmd.Flags().BoolVar(&m.checkTensors, "check-tensors", false, "read every weight once at load and refuse a checkpoint holding NaN or infinite values")
}

func (m *modelFlags) changed(name string) bool {
	return m.own[name] && m.cmd.Flags().Changed(name)
}

// config loads the configuration once.
func (m *modelFlags) config() (*config.Config, error) {
	if m.cfg != nil {
		return m.cfg, nil
	}
	var flags []config.Flag
	if m.changed("device") {
		if !slices.Contains(backend.Names(), m.device) {
			return nil, fmt.Errorf("--device: unknown device %q (have %s)", m.device, strings.Join(backend.Names(), ", "))
		}
		flags = append(flags, config.Flag{Key: "device", Value: m.device, Name: "--device"})
	}
	if m.changed("precision") {
		flags = append(flags, config.Flag{Key: "precision", Value: m.precision, Name: "--precision"})
	}
	if m.changed("tp") {
		flags = append(flags, config.Flag{Key: "parallel.tp_size", Value: m.tp, Name: "--tp"})
	}
	if m.changed("speculative") {
		f, err := speculativeFlags(m.speculative)
		if err != nil {
			return nil, err
		}
		flags = append(flags, f...)
	}
	if m.changed("draft-model") {
		flags = append(flags, config.Flag{Key: "speculative.draft_model", Value: m.draftModel, Name: "--draft-model"})
	}
	if m.changed("model") && m.changed("preset") {
		return nil, fmt.Errorf("--model and --preset are mutually exclusive")
	}
	for _, f := range []struct {
		flag, key string
		v         any
	}{{"model", "model.dir", m.dir}, {"preset", "model.preset", m.preset}, {"seed", "model.seed", m.seed},
		{"cache-dir", "model.cache_dir", m.cacheDir}, {"fp8", "model.fp8", m.fp8}, {"check-tensors", "model.check_tensors", m.checkTensors},
		{"load-format", "model.load_format", m.loadFormat}} {
		if m.changed(f.flag) {
			flags = append(flags, config.Flag{Key: f.key, Value: f.v, Name: "--" + f.flag})
		}
	}
	if m.changed("set") {
		f, err := setFlags(m.set)
		if err != nil {
			return nil, err
		}
		flags = append(flags, f...)
	}
	c, err := config.Load(config.Options{Files: m.files, Flags: append(flags, m.extra...)})
	if err != nil {
		return nil, err
	}
	if c.Model.Dummy() && m.changed("cache-dir") {
		return nil, fmt.Errorf("--cache-dir: model.load_format dummy writes no checkpoint; it would be ignored")
	}
	if c.Model.Dir != "" {
		for _, f := range []string{"seed", "cache-dir", "fp8"} {
			if f == "seed" && c.Model.Dummy() {
				continue // seeds the dummy weights
			}
			if m.changed(f) {
				return nil, fmt.Errorf("--%s applies to --preset only; with --model it would be ignored", f)
			}
		}
	}
	m.cfg = c
	return c, nil
}

// open returns the checkpoint the configuration names (model.dir, or the
// preset model.preset written once under model.cache_dir), checked with
// model.check_tensors.
func (m *modelFlags) open() (*model.Checkpoint, error) {
	c, err := m.config()
	if err != nil {
		return nil, err
	}
	if sp := c.Speculative; sp.DFlash() && sp.DraftModel == "" && c.Model.Dummy() {
		return nil, fmt.Errorf("speculative.draft_model: model.load_format dummy makes the trunk in memory and writes no -dflash preset drafter: give the drafter's directory (--draft-model)")
	}
	ck, err := openModel(c.Model)
	if err != nil {
		return nil, err
	}
	m.opened = ck.Dir()
	if sp := &c.Speculative; sp.DFlash() && sp.DraftModel == "" && randckpt.IsDFlashPreset(c.Model.Preset) {
		sp.DraftModel = filepath.Join(ck.Dir(), randckpt.DFlashDir) // the preset's own drafter
	}
	if !c.Model.CheckTensors {
		return ck, nil
	}
	log.Info().Str("dir", ck.Dir()).Msg("checking every tensor for NaN and infinite values (model.check_tensors, --check-tensors)")
	if err := ck.CheckTensors(); err != nil {
		ck.Close()
		return nil, err
	}
	return ck, nil
}

// openModel opens a checkpoint directory, or writes a preset's random
// checkpoint once into the cache directory and opens it; with
// model.load_format dummy it makes random weights in memory instead
// (openDummy).
func openModel(mc config.Model) (*model.Checkpoint, error) {
	if mc.Dummy() {
		return openDummy(mc)
	}
	mode, err := safetensors.ParseMode(mc.Weights)
	if err != nil {
		return nil, fmt.Errorf("model.weights: %w", err)
	}
	if mc.Dir != "" {
		ck, err := model.OpenWith(mc.Dir, model.OpenOptions{Weights: mode})
		if err != nil {
			return nil, err
		}
		if err := ck.Validate(); err != nil {
			ck.Close()
			return nil, err
		}
		return ck, nil
	}
	set, setName, err := presetSet(mc.Set)
	if err != nil {
		return nil, err
	}
	cfg, err := randckpt.PresetWith(mc.Preset, set)
	if err != nil {
		if len(set) > 0 {
			return nil, fmt.Errorf("model.set: %w", err)
		}
		return nil, err
	}
	suffix := setName
	if mc.FP8 {
		suffix += "-fp8"
	}
	dir := filepath.Join(mc.CacheDir, fmt.Sprintf("%s-seed%d%s", mc.Preset, mc.Seed, suffix))
	if err := writePreset(dir, mc.Preset, cfg, randckpt.Options{Seed: mc.Seed, FP8: mc.FP8}); err != nil {
		return nil, err
	}
	if err := addPresetTokenizer(dir, cfg.VocabSize); err != nil {
		return nil, err
	}
	return model.OpenWith(dir, model.OpenOptions{Weights: mode})
}

// presetSet turns model.set into the JSON values randckpt.PresetWith
// takes, and a name for the cached checkpoint's folder that says them
// ("-n_routed_experts64", keys sorted).
func presetSet(m map[string]any) (map[string]json.RawMessage, string, error) {
	if len(m) == 0 {
		return nil, "", nil
	}
	keys := slices.Sorted(maps.Keys(m))
	set := make(map[string]json.RawMessage, len(m))
	var name strings.Builder
	for _, k := range keys {
		raw, err := json.Marshal(m[k])
		if err != nil {
			return nil, "", fmt.Errorf("model.set.%s: %w", k, err)
		}
		set[k] = raw
		v := strings.Map(func(r rune) rune {
			if r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '.' || r == '-' {
				return r
			}
			return -1
		}, string(raw))
		fmt.Fprintf(&name, "-%s%s", k, v)
	}
	return set, name.String(), nil
}

// source describes the model the configuration names, for logs and
// GetModelInfo: dummy weights say so (dummySource).
func source(mc config.Model) string {
	if mc.Dummy() {
		return dummySource(mc)
	}
	if mc.Preset != "" {
		return fmt.Sprintf("preset %s (seed %d)", mc.Preset, mc.Seed)
	}
	return mc.Dir
}

// writePreset writes a preset's checkpoint into dir unless it is there.
// Processes may race for the same dir: each writes into a temporary folder
// of its own and renames it into place; a loser finds the winner's
// checkpoint (identical bytes: same preset and seed) and drops its own.
// A -dflash preset's drafter is written in its dflash subdirectory.
func writePreset(dir, preset string, cfg *model.Config, opts randckpt.Options) error {
	if _, err := os.Stat(filepath.Join(dir, model.ConfigFile)); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("model.cache_dir: %w", err)
	}
	log.Info().Str("dir", dir).Msg("writing random checkpoint")
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".tmp-")
	if err != nil {
		return fmt.Errorf("model.cache_dir: %w", err)
	}
	defer os.RemoveAll(tmp) // gone after the rename; removed on failure
	if err := randckpt.Write(tmp, cfg, opts); err != nil {
		return err
	}
	if randckpt.IsDFlashPreset(preset) {
		d, err := randckpt.DFlashPreset(preset, cfg)
		if err != nil {
			return err
		}
		if err := randckpt.WriteDFlash(filepath.Join(tmp, randckpt.DFlashDir), d, randckpt.Options{Seed: opts.Seed}); err != nil {
			return err
		}
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
		return fmt.Errorf("model.cache_dir: %w", err)
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
// used (a dummy preset's: made in memory; a dummy model.dir's: the
// directory's); either may be missing (nil: token-id prompts only, chat
// refused). A chat template that does not load
// (or fails its probe) is not served, with the reason kept in ChatError
// for the API to show: completions are served without it. Anything else
// wrong is an error.
func (m *modelFlags) textModel(vocab int) (*text.Model, error) {
	if m.cfg != nil && m.cfg.Model.Dummy() && m.cfg.Model.Dir == "" {
		return dummyTextModel(vocab) // the preset's, made in memory
	}
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
	switch {
	case errors.Is(err, chat.ErrNoTemplate):
		log.Warn().Str("dir", m.opened).Msg("no chat template: chat requests are refused")
	case err != nil:
		tm.Chat, tm.ChatError = nil, err
		log.Warn().Err(err).Msg("the chat template does not load: chat requests are refused, completions are served")
	}
	return tm, nil
}
