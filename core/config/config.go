// Package config loads the engine configuration: which passes run, in which
// order and with which options, the (simulated) parallel topology, LoRA
// adapters, debug switches and plugin settings. YAML files are read with
// koanf, decoded strictly (a misspelt key is an error that names it), and
// GLMFLASH_ENGINE_* environment variables override scalar keys
// (GLMFLASH_ENGINE_PARALLEL__ATTENTION_TP_SIZE=2 sets
// parallel.attention_tp_size; "__" separates levels).
package config

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/glmflash/glmflash/configs"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/internal/regular"
	"github.com/glmflash/glmflash/internal/strict"
	"github.com/glmflash/glmflash/model"
	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/env"
	"github.com/knadh/koanf/providers/rawbytes"
	"github.com/knadh/koanf/v2"
)

// EnvPrefix is the prefix of environment overrides.
const EnvPrefix = "GLMFLASH_ENGINE_"

// PassConfig requests one pass.
type PassConfig struct {
	Name    string         `koanf:"name"`
	Enabled *bool          `koanf:"enabled"` // default true
	Options map[string]any `koanf:"options"`
	// Dir is the directory of the file the entry was read from: relative
	// path options are relative to it.
	Dir string `koanf:"-" json:"-"`
}

// On reports whether the pass is enabled.
func (p PassConfig) On() bool { return p.Enabled == nil || *p.Enabled }

// Parallel is the attention tensor-parallel topology that eligibility
// predicates see. Execution is single-process; other values simulate the
// topology a multi-rank deployment would have.
type Parallel struct {
	AttentionTPSize int `koanf:"attention_tp_size"`
	AttentionTPRank int `koanf:"attention_tp_rank"`
}

// LoRAAdapter names modules an adapter targets (e.g. "k_proj"); applying
// adapters is not implemented, but their targets make fusion ineligible.
type LoRAAdapter struct {
	Name    string   `koanf:"name"`
	Targets []string `koanf:"targets"`
	Layers  []int    `koanf:"layers"` // empty: every layer
}

// LoRA lists adapters.
type LoRA struct {
	Adapters []LoRAAdapter `koanf:"adapters"`
}

// Debug switches.
type Debug struct {
	// VerifyEachPass runs the IR verifier after every pass (default true).
	VerifyEachPass *bool `koanf:"verify_each_pass"`
	// CaptureHidden lists layers whose residual streams must be observable
	// after the layer (hidden-state capture for debugging).
	CaptureHidden []int `koanf:"capture_hidden"`
}

// Plugins configures external pass plugins (executables named
// glmflash-pass-* in Dir). A plugin runs only if its SHA-256 is listed in
// Checksums or SumsFile, unless AllowUnverified is set.
type Plugins struct {
	Dir       string            `koanf:"dir"`
	Checksums map[string]string `koanf:"checksums"` // plugin file name → hex SHA-256
	SumsFile  string            `koanf:"sums_file"` // sidecar "sha256  name" lines
	TimeoutMS int               `koanf:"timeout_ms"`
	// StartTimeoutMS bounds a plugin's start and its Describe call
	// (default 10000).
	StartTimeoutMS int `koanf:"start_timeout_ms"`
	// AllowUnverified runs plugins that have no expected checksum (a
	// plugin whose checksum is listed and differs never runs).
	AllowUnverified bool `koanf:"allow_unverified"`
}

// MaxPluginTimeoutMS bounds plugins.timeout_ms and start_timeout_ms (10 min).
const MaxPluginTimeoutMS = 600_000

// Engine is the whole engine configuration.
type Engine struct {
	// Device is the backend that runs the model: "cpu" (default) or "cuda";
	// --device overrides it.
	Device   string       `koanf:"device"`
	Passes   []PassConfig `koanf:"passes"`
	Parallel Parallel     `koanf:"parallel"`
	LoRA     LoRA         `koanf:"lora"`
	Debug    Debug        `koanf:"debug"`
	Plugins  Plugins      `koanf:"plugins"`
	// Source is where the configuration came from (file path or "default").
	Source string `koanf:"-"`
}

// VerifyEachPass reports the effective debug.verify_each_pass.
func (e *Engine) VerifyEachPass() bool {
	return e.Debug.VerifyEachPass == nil || *e.Debug.VerifyEachPass
}

// Enabled returns the enabled passes in order.
func (e *Engine) Enabled() []PassConfig {
	var out []PassConfig
	for _, p := range e.Passes {
		if p.On() {
			out = append(out, p)
		}
	}
	return out
}

// Default is the built-in configuration (configs/engine.yaml, embedded):
// every built-in pass on, in order.
func Default() *Engine {
	b, err := configs.FS.ReadFile("engine.yaml")
	if err != nil {
		panic(err)
	}
	e, err := Parse(b, "built-in configs/engine.yaml")
	if err != nil {
		panic(err)
	}
	return e
}

// Load reads a YAML file and applies environment overrides.
func Load(path string) (*Engine, error) {
	b, err := regular.ReadFile(path, regular.ConfigLimit)
	if err != nil {
		return nil, fmt.Errorf("engine config: %w", err)
	}
	e, err := parse(b, path, true)
	if err != nil {
		return nil, err
	}
	for i := range e.Passes {
		e.Passes[i].Dir = filepath.Dir(path) // relative path options are relative to the file
	}
	return e, nil
}

// Parse decodes YAML bytes (no environment overrides); source names them in
// errors.
func Parse(b []byte, source string) (*Engine, error) { return parse(b, source, false) }

func parse(b []byte, source string, withEnv bool) (*Engine, error) {
	k := koanf.New(".")
	if err := k.Load(rawbytes.Provider(b), yaml.Parser()); err != nil {
		return nil, fmt.Errorf("%s: invalid YAML: %w", source, err)
	}
	if withEnv {
		err := k.Load(env.Provider(EnvPrefix, ".", func(key string) string {
			key = strings.ToLower(strings.TrimPrefix(key, EnvPrefix))
			return strings.ReplaceAll(key, "__", ".")
		}), nil)
		if err != nil {
			return nil, fmt.Errorf("%s: environment overrides: %w", source, err)
		}
	}
	var e Engine
	dc := strict.DecoderConfig(&e)
	dc.DecodeHook = mapstructure.ComposeDecodeHookFunc(mapstructure.StringToSliceHookFunc(","), strict.Hook)
	if err := k.UnmarshalWithConf("", &e, koanf.UnmarshalConf{Tag: "koanf", DecoderConfig: dc}); err != nil {
		return nil, fmt.Errorf("%s: %s", source, strict.Message(err))
	}
	e.Source = source
	if err := e.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	return &e, nil
}

// Validate checks values that YAML typing cannot.
func (e *Engine) Validate() error {
	switch e.Device {
	case "", "cpu", "cuda":
	default:
		return fmt.Errorf("device must be cpu or cuda, got %q", e.Device)
	}
	seen := map[string]bool{}
	for i, p := range e.Passes {
		if p.Name == "" {
			return fmt.Errorf("passes[%d]: name is required", i)
		}
		if seen[p.Name] {
			return fmt.Errorf("passes[%d]: pass %q is listed twice", i, p.Name)
		}
		seen[p.Name] = true
	}
	if e.Parallel.AttentionTPSize == 0 {
		e.Parallel.AttentionTPSize = 1
	}
	if e.Parallel.AttentionTPSize < 0 {
		return fmt.Errorf("parallel.attention_tp_size must be ≥ 1, got %d", e.Parallel.AttentionTPSize)
	}
	if e.Parallel.AttentionTPRank < 0 || e.Parallel.AttentionTPRank >= e.Parallel.AttentionTPSize {
		return fmt.Errorf("parallel.attention_tp_rank must be in [0, %d), got %d", e.Parallel.AttentionTPSize, e.Parallel.AttentionTPRank)
	}
	for i, a := range e.LoRA.Adapters {
		if len(a.Targets) == 0 {
			return fmt.Errorf("lora.adapters[%d] (%s): targets must not be empty", i, a.Name)
		}
	}
	for i, l := range e.Debug.CaptureHidden {
		if l < 0 {
			return fmt.Errorf("debug.capture_hidden[%d]: layer %d is negative", i, l)
		}
	}
	if e.Plugins.TimeoutMS < 0 || e.Plugins.TimeoutMS > MaxPluginTimeoutMS {
		return fmt.Errorf("plugins.timeout_ms must be in [0, %d] (0: the default), got %d", MaxPluginTimeoutMS, e.Plugins.TimeoutMS)
	}
	if e.Plugins.StartTimeoutMS < 0 || e.Plugins.StartTimeoutMS > MaxPluginTimeoutMS {
		return fmt.Errorf("plugins.start_timeout_ms must be in [0, %d] (0: the default), got %d", MaxPluginTimeoutMS, e.Plugins.StartTimeoutMS)
	}
	for _, name := range SortedOptionKeys(anyMap(e.Plugins.Checksums)) {
		sum := e.Plugins.Checksums[name]
		if name == "" || strings.ContainsAny(name, `/\`) {
			return fmt.Errorf("plugins.checksums: key %q must be a plugin file name (no directory)", name)
		}
		if !isHexSHA256(sum) {
			return fmt.Errorf("plugins.checksums.%s: %q is not a hex SHA-256 (64 hex digits)", name, sum)
		}
	}
	return nil
}

func anyMap(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// isHexSHA256 reports whether s is 64 hex digits.
func isHexSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// SortedOptionKeys returns a pass's option names, sorted (for messages).
func SortedOptionKeys(m map[string]any) []string {
	k := make([]string, 0, len(m))
	for key := range m {
		k = append(k, key)
	}
	sort.Strings(k)
	return k
}

// Requests lists the enabled passes, in order, as pipeline requests.
func (e *Engine) Requests() []pass.Request {
	var reqs []pass.Request
	for _, p := range e.Enabled() {
		reqs = append(reqs, pass.Request{Name: p.Name, Options: p.Options, Dir: p.Dir})
	}
	return reqs
}

// Pipeline builds the pass pipeline the configuration asks for: the enabled
// passes in their listed order, resolved among the built-in passes and
// extra (the plugin host's passes; may be nil).
func (e *Engine) Pipeline(extra pass.Resolver) (*pass.Pipeline, error) {
	return pass.NewPipelineWith(e.Requests(), e.VerifyEachPass(), extra)
}

// PassEnv is the eligibility environment for model m, its weights w and
// this configuration (topology, LoRA targets, hidden-state captures).
func (e *Engine) PassEnv(m *model.Config, w pass.WeightInfo) *pass.Env {
	env := pass.NewEnv(m, w)
	env.TP = pass.Topology{Size: e.Parallel.AttentionTPSize, Rank: e.Parallel.AttentionTPRank, Known: e.Parallel.AttentionTPSize > 0}
	for _, a := range e.LoRA.Adapters {
		for _, t := range a.Targets {
			env.LoRA = append(env.LoRA, pass.LoRATarget{Adapter: a.Name, Module: t, Layers: a.Layers})
		}
	}
	for _, l := range e.Debug.CaptureHidden {
		env.CaptureHidden[l] = true
	}
	return env
}
