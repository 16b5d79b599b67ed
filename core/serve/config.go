package serve

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/glmflash/glmflash/core/access"
	"github.com/glmflash/glmflash/internal/regular"
	"github.com/glmflash/glmflash/internal/strict"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/rawbytes"
	"github.com/knadh/koanf/v2"
)

// Config is the `glmflash serve` configuration file. It is self-contained
// (it does not use core/config, the engine configuration package).
type Config struct {
	Model   ModelConfig   `koanf:"model"`
	Server  ServerConfig  `koanf:"server"`
	Runtime RuntimeConfig `koanf:"runtime"`
}

// ModelConfig names the checkpoint: a directory, or a random preset
// written once into CacheDir.
type ModelConfig struct {
	Name     string `koanf:"name"` // the name HTTP clients give as "model" (default: the directory's base name, or the preset's)
	Dir      string `koanf:"dir"`
	Preset   string `koanf:"preset"`
	Seed     int64  `koanf:"seed"`
	CacheDir string `koanf:"cache_dir"`
	FP8      bool   `koanf:"fp8"`
	// CheckTensors reads every weight at load and refuses NaN/Inf values.
	CheckTensors bool `koanf:"check_tensors"`
}

// ServerConfig is the network side.
type ServerConfig struct {
	GRPCAddr     string        `koanf:"grpc_addr"`
	HTTPAddr     string        `koanf:"http_addr"`    // the OpenAI-compatible HTTP API; "" disables it
	MetricsAddr  string        `koanf:"metrics_addr"` // "" disables the metrics endpoint
	DrainTimeout time.Duration `koanf:"drain_timeout"`
	// MaxResponseBytes bounds one reply (a Score's logits above all): a
	// request whose reply would be larger is refused before any work.
	MaxResponseBytes int `koanf:"max_response_bytes"`
	// MaxRequestBytes bounds one received message.
	MaxRequestBytes int `koanf:"max_request_bytes"`
	// TLS serves gRPC and the HTTP API over TLS (mutual TLS with
	// client_ca_file).
	TLS access.TLS `koanf:"tls"`
	// Auth requires API keys (Authorization: Bearer KEY) on gRPC and the
	// HTTP API; health checks need none.
	Auth access.Auth `koanf:"auth"`
	// Reflection registers gRPC server reflection (default true).
	Reflection bool `koanf:"reflection"`
	// KeepaliveTime pings an idle connection after this long, and
	// KeepaliveTimeout closes it when the ping is not answered in time.
	KeepaliveTime    time.Duration `koanf:"keepalive_time"`
	KeepaliveTimeout time.Duration `koanf:"keepalive_timeout"`
	// MaxConnectionAge closes a connection this old (0: never), after
	// MaxConnectionAgeGrace for its calls to finish (0: no bound): the way
	// to be rid of clients that stop reading.
	MaxConnectionAge      time.Duration `koanf:"max_connection_age"`
	MaxConnectionAgeGrace time.Duration `koanf:"max_connection_age_grace"`
	// ExposePaths shows absolute paths (model directory, configuration and
	// plugin files) in GetModelInfo; by default only their base names.
	ExposePaths bool `koanf:"expose_paths"`
}

// RuntimeConfig sizes the engine and the scheduler; zero means the default.
type RuntimeConfig struct {
	Slots            int `koanf:"slots"`              // cache slots (default 8)
	MaxRunning       int `koanf:"max_running"`        // default: slots
	MaxQueue         int `koanf:"max_queue"`          // default 64; negative: none wait
	MaxBatchTokens   int `koanf:"max_batch_tokens"`   // default max(256, max_running)
	PrefillChunk     int `koanf:"prefill_chunk"`      // default 64
	ContextLimit     int `koanf:"context_limit"`      // default max_position_embeddings
	DefaultMaxTokens int `koanf:"default_max_tokens"` // when a request has none (default 256)
}

// ServedName is the model's name in the HTTP API: model.name, else the
// checkpoint directory's base name, else the preset's name.
func (c Config) ServedName() string {
	switch {
	case c.Model.Name != "":
		return c.Model.Name
	case c.Model.Dir != "":
		return filepath.Base(filepath.Clean(c.Model.Dir))
	}
	return c.Model.Preset
}

// DefaultConfig is what an empty file means.
func DefaultConfig() Config {
	return Config{
		Model: ModelConfig{Seed: 1},
		Server: ServerConfig{GRPCAddr: "127.0.0.1:50051", HTTPAddr: "127.0.0.1:8000", MetricsAddr: "127.0.0.1:9090", DrainTimeout: 30 * time.Second,
			MaxResponseBytes: 64 << 20, MaxRequestBytes: 4 << 20, Reflection: true,
			KeepaliveTime: time.Minute, KeepaliveTimeout: 20 * time.Second},
		Runtime: RuntimeConfig{Slots: 8, DefaultMaxTokens: 256},
	}
}

// EnvPrefix starts the environment variables that override the file:
// GLMFLASH_<SECTION>__<KEY>, e.g. GLMFLASH_RUNTIME__MAX_RUNNING=16 sets
// runtime.max_running. Variables with the prefix but no "__" (such as
// GLMFLASH_CACHE) are not configuration and are ignored.
const EnvPrefix = "GLMFLASH_"

// LoadConfig reads a YAML file (path may be empty: the built-in defaults
// only, which serve DefaultPreset), then the environment (environ as
// os.Environ returns it; nil means os.Environ()). Relative paths in the
// file (model.dir, model.cache_dir, the TLS and key files) are relative to
// the file.
// Loading is strict: an unknown key, in the file or the environment, is an
// error naming it, and so is a value of the wrong type.
func LoadConfig(path string, environ []string) (Config, error) {
	k := koanf.New(".")
	source := map[string]string{} // key → where it came from
	if path != "" {
		b, err := regular.ReadFile(path, regular.ConfigLimit)
		if err != nil {
			return Config{}, fmt.Errorf("config: %w", err)
		}
		if err := k.Load(rawbytes.Provider(b), yaml.Parser()); err != nil {
			return Config{}, fmt.Errorf("config %s: %w", path, err)
		}
		for _, key := range k.Keys() {
			source[key] = path
		}
	}
	if environ == nil {
		environ = os.Environ()
	}
	envKeys := map[string]string{}
	ek := koanf.New(".")
	err := ek.Load(env.Provider(".", env.Opt{
		Prefix:      EnvPrefix,
		EnvironFunc: func() []string { return environ },
		TransformFunc: func(name, v string) (string, any) {
			rest := strings.TrimPrefix(name, EnvPrefix)
			// GLMFLASH_ENGINE_* belong to the engine (pass) configuration
			if !strings.Contains(rest, "__") || strings.HasPrefix(rest, "ENGINE_") {
				return "", nil
			}
			key := strings.ToLower(strings.ReplaceAll(rest, "__", "."))
			envKeys[key] = name
			return key, v
		},
	}), nil)
	if err != nil {
		return Config{}, fmt.Errorf("config from the environment: %w", err)
	}
	for key, name := range envKeys {
		source[key] = "environment variable " + name
	}
	if err := k.Merge(ek); err != nil {
		return Config{}, err
	}

	known := map[string]bool{}
	sections := map[string]bool{}
	collectKeys(reflect.TypeOf(Config{}), "", known, sections)
	var unknown []string
	for _, key := range k.Keys() {
		switch {
		case known[key]:
		case sections[key]:
			unknown = append(unknown, fmt.Sprintf("%q must be a section (a mapping), in %s", key, source[key]))
		default:
			unknown = append(unknown, fmt.Sprintf("unknown key %q in %s", key, source[key]))
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return Config{}, fmt.Errorf("config: %s", strings.Join(unknown, "; "))
	}

	c := DefaultConfig()
	if err := k.UnmarshalWithConf("", &c, koanf.UnmarshalConf{DecoderConfig: strict.DecoderConfig(&c)}); err != nil {
		return Config{}, fmt.Errorf("config: %s", strict.Message(err))
	}
	// Paths written in the file are relative to the file.
	for key, f := range map[string]*string{
		"model.dir": &c.Model.Dir, "model.cache_dir": &c.Model.CacheDir,
		"server.tls.cert_file": &c.Server.TLS.CertFile, "server.tls.key_file": &c.Server.TLS.KeyFile,
		"server.tls.client_ca_file": &c.Server.TLS.ClientCAFile,
		"server.auth.api_keys_file": &c.Server.Auth.APIKeysFile, "server.auth.admin_keys_file": &c.Server.Auth.AdminKeysFile,
	} {
		if path != "" && source[key] == path && *f != "" && !filepath.IsAbs(*f) {
			*f = filepath.Join(filepath.Dir(path), *f)
		}
	}
	if c.Model.Dir == "" && c.Model.Preset == "" {
		c.Model.Preset = DefaultPreset
	}
	return c, c.Validate()
}

// DefaultPreset is the model served when the configuration names none.
const DefaultPreset = "small"

// collectKeys lists the dotted keys of a config struct's leaves and sections.
func collectKeys(t reflect.Type, prefix string, leaves, sections map[string]bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		key := prefix + f.Tag.Get("koanf")
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Duration(0)) {
			sections[key] = true
			collectKeys(f.Type, key+".", leaves, sections)
			continue
		}
		leaves[key] = true
	}
}

// Validate checks what can be checked before the model is known.
func (c Config) Validate() error {
	m, s, r := c.Model, c.Server, c.Runtime
	switch {
	case m.Dir != "" && m.Preset != "":
		return fmt.Errorf("config: model.dir and model.preset are mutually exclusive")
	case m.Dir == "" && m.Preset == "":
		return fmt.Errorf("config: name a model with model.dir or model.preset")
	case s.GRPCAddr == "":
		return fmt.Errorf("config: server.grpc_addr is empty")
	case s.DrainTimeout < 0:
		return fmt.Errorf("config: server.drain_timeout must be ≥ 0, got %s", s.DrainTimeout)
	case s.MaxResponseBytes < 1<<10 || s.MaxResponseBytes > 1<<30:
		return fmt.Errorf("config: server.max_response_bytes must be in [1 KiB, 1 GiB], got %d", s.MaxResponseBytes)
	case s.MaxRequestBytes < 1<<10 || s.MaxRequestBytes > 1<<30:
		return fmt.Errorf("config: server.max_request_bytes must be in [1 KiB, 1 GiB], got %d", s.MaxRequestBytes)
	case s.KeepaliveTime < time.Second:
		return fmt.Errorf("config: server.keepalive_time must be ≥ 1s, got %s", s.KeepaliveTime)
	case s.KeepaliveTimeout < time.Second:
		return fmt.Errorf("config: server.keepalive_timeout must be ≥ 1s, got %s", s.KeepaliveTimeout)
	case s.MaxConnectionAge < 0 || s.MaxConnectionAgeGrace < 0:
		return fmt.Errorf("config: server.max_connection_age and max_connection_age_grace must be ≥ 0")
	case s.TLS.Validate("server.tls") != nil:
		return fmt.Errorf("config: %w", s.TLS.Validate("server.tls"))
	case r.Slots < 1:
		return fmt.Errorf("config: runtime.slots must be ≥ 1, got %d", r.Slots)
	case r.MaxRunning < 0:
		return fmt.Errorf("config: runtime.max_running must be ≥ 0, got %d", r.MaxRunning)
	case r.MaxBatchTokens < 0:
		return fmt.Errorf("config: runtime.max_batch_tokens must be ≥ 0, got %d", r.MaxBatchTokens)
	case r.PrefillChunk < 0:
		return fmt.Errorf("config: runtime.prefill_chunk must be ≥ 0, got %d", r.PrefillChunk)
	case r.ContextLimit < 0:
		return fmt.Errorf("config: runtime.context_limit must be ≥ 0, got %d", r.ContextLimit)
	case r.DefaultMaxTokens < 1:
		return fmt.Errorf("config: runtime.default_max_tokens must be ≥ 1, got %d", r.DefaultMaxTokens)
	}
	return nil
}
