// Package config is glmflash's configuration: one YAML file whose engine
// sections (device, passes, parallel, lora, debug, plugins) and serving
// sections (model, server, runtime) every command reads the same way, over
// built-in defaults (configs/engine.yaml and configs/serve.yaml, embedded),
// under environment variables (GLMFLASH_<KEY PATH>, "__" between levels)
// and command-line flags. Loading is strict and every error names the key
// and where it came from (load.go); studies (core/attrib) use the same
// loader.
package config

import (
	"encoding/hex"
	"fmt"
	"github.com/glmflash/glmflash/core/reasoning"
	"github.com/glmflash/glmflash/core/toolcall"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/glmflash/glmflash/configs"
	"github.com/glmflash/glmflash/core/access"
	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model"
)

// Config is the whole configuration.
type Config struct {
	// Device is the backend that runs the model: "cpu" or "cuda".
	Device string `koanf:"device"`
	// Precision is "fp32" (the parity mode) or "bf16" (GEMMs take bf16
	// activations, fp32 accumulation: the fast mode), parsed once by
	// Validate ("" becomes fp32).
	Precision backend.Precision `koanf:"precision"`
	// CUDA configures the CUDA backend.
	CUDA     CUDA         `koanf:"cuda"`
	Passes   []PassConfig `koanf:"passes"`
	Parallel Parallel     `koanf:"parallel"`
	LoRA     LoRA         `koanf:"lora"`
	Debug    Debug        `koanf:"debug"`
	Plugins  Plugins      `koanf:"plugins"`
	Model    Model        `koanf:"model"`
	Server   Server       `koanf:"server"`
	Runtime  Runtime      `koanf:"runtime"`
	// Speculative configures speculative decoding (serving).
	Speculative Speculative `koanf:"speculative"`

	// Source is the configuration file ("built-in" without one).
	Source string `koanf:"-"`
	// Sources says where each key came from.
	Sources *Sources `koanf:"-"`
}

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

// Parallel is the tensor-parallel topology (docs/tensor-parallel.md): the
// engine runs TPSize ranks (all in this process: goroutines over an
// in-process all-reduce on the cpu backend), each holding its shard of the
// attention heads, the MLP and expert intermediate dimensions and the
// vocabulary; the passes' eligibility sees each rank's real size and
// rank. Attention data parallelism (attention TP below TP) and expert
// parallelism (all-to-all) are refused: not implemented.
type Parallel struct {
	// TPSize is the tensor-parallel ranks (1: one device).
	TPSize int `koanf:"tp_size"`
	// AttentionTPSize must equal TPSize (0: TPSize).
	AttentionTPSize int `koanf:"attention_tp_size"`
	// AttentionTPRank must be 0: one process runs every rank.
	AttentionTPRank int `koanf:"attention_tp_rank"`
	// EPSize is the expert-parallel ranks: 1 (the experts are split along
	// their intermediate dimension over the TP ranks, EP1).
	EPSize int `koanf:"ep_size"`
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
	Dir       string            `koanf:"dir" path:""`
	Checksums map[string]string `koanf:"checksums"`         // plugin file name → hex SHA-256
	SumsFile  string            `koanf:"sums_file" path:""` // sidecar "sha256  name" lines
	TimeoutMS int               `koanf:"timeout_ms"`
	// StartTimeoutMS bounds a plugin's start and its Describe call
	// (default 10000).
	StartTimeoutMS int `koanf:"start_timeout_ms"`
	// AllowUnverified runs plugins that have no expected checksum (a
	// plugin whose checksum is listed and differs never runs).
	AllowUnverified bool `koanf:"allow_unverified"`
	// AllowParityMismatch serves a program in which a plugin pass fired
	// even when it fails the load-time parity probe (engine.Parity: its
	// logits on a built-in probe against the program without passes);
	// ParityTolerance is that probe's relative bound (0: 0.01).
	AllowParityMismatch bool    `koanf:"allow_parity_mismatch"`
	ParityTolerance     float64 `koanf:"parity_tolerance"`
}

// MaxPluginTimeoutMS bounds plugins.timeout_ms and start_timeout_ms (10 min).
const MaxPluginTimeoutMS = 600_000

// CUDA configures the CUDA backend.
type CUDA struct {
	// GraphMaxTokens bounds the batches captured into CUDA graphs and
	// replayed (default 64; -1: no graphs, every kernel launched eagerly).
	GraphMaxTokens int `koanf:"graph_max_tokens"`
	// GraphTokenBuckets are the token counts of the bucket graphs: a batch
	// of more tokens than graph_max_tokens (prompt chunks beside decode
	// tokens, a long prefill) up to the largest bucket is padded to the
	// smallest bucket that holds it and replays that bucket's graph. Unset
	// or [0]: none (such batches launch eagerly; off by default until
	// make test-gpu proves them on an H200: the emulator has), e.g.
	// [64, 128, 256, 512, 1024, 2048, 4096] turns them on; ascending, each
	// in [1, 65536], at most MaxGraphTokenBuckets.
	GraphTokenBuckets []int `koanf:"graph_token_buckets"`
	// MaxGraphs bounds the CUDA graphs a program keeps (exact shapes and
	// buckets together); past it the least recently replayed is destroyed.
	// 0: 256; else in [1, 65536].
	MaxGraphs int `koanf:"max_graphs"`
	// GemvFP8Kernel is the kernel of the one-row fp8 GEMVs of many blocks
	// (MoE expert tiles, fused gate/up): "" (glmf_gemv_f1_fp8p, persistent
	// blocks), glmf_gemv_f1_fp8 or glmf_gemv_f1; all give the same bits.
	GemvFP8Kernel string `koanf:"gemv_fp8_kernel"`
}

// MaxGraphTokenBuckets bounds the entries of cuda.graph_token_buckets.
const MaxGraphTokenBuckets = 32

// CheckGraphBuckets says what is wrong with a cuda.graph_token_buckets
// list: unset (nil), [0] (none) or ascending token counts in [1, 65536].
func CheckGraphBuckets(b []int) error {
	switch {
	case b == nil || len(b) == 1 && b[0] == 0:
		return nil
	case len(b) == 0:
		return fmt.Errorf("must list token counts, or be [0] (no bucket graphs), got an empty list")
	case len(b) > MaxGraphTokenBuckets:
		return fmt.Errorf("at most %d buckets, got %d", MaxGraphTokenBuckets, len(b))
	}
	for i, n := range b {
		if n < 1 || n > 1<<16 {
			return fmt.Errorf("every bucket must be in [1, 65536] ([0] alone: none), got %d at index %d", n, i)
		}
		if i > 0 && n <= b[i-1] {
			return fmt.Errorf("buckets must ascend, got %d after %d", n, b[i-1])
		}
	}
	return nil
}

// GemvFP8Kernels are the values cuda.gemv_fp8_kernel takes besides ""
// (kernels/cuda's GemvFP8Kernels; tests/ checks they agree).
var GemvFP8Kernels = []string{"glmf_gemv_f1_fp8p", "glmf_gemv_f1_fp8", "glmf_gemv_f1"}

// Model names the checkpoint: a directory, or a random preset written once
// into CacheDir.
type Model struct {
	Name     string `koanf:"name"` // the name HTTP clients give as "model" (default: the directory's base name, or the preset's)
	Dir      string `koanf:"dir" path:""`
	Preset   string `koanf:"preset"`
	Seed     int64  `koanf:"seed"`
	CacheDir string `koanf:"cache_dir" path:""`
	FP8      bool   `koanf:"fp8"`
	// Set scales a preset: text_config fields set to other values (e.g.
	// {n_routed_experts: 64}); the checkpoint is cached under a name that
	// includes them.
	Set map[string]any `koanf:"set"`
	// CheckTensors reads every weight at load and refuses NaN/Inf values.
	CheckTensors bool `koanf:"check_tensors"`
	// SpecialTokensInContent lets the text of special tokens in user and
	// tool messages become those tokens when a chat is encoded; by default
	// (false) it is encoded as text, so that a user cannot forge the
	// template's turns (the template's own special tokens are tokens
	// either way).
	SpecialTokensInContent bool `koanf:"special_tokens_in_content"`
	// ToolCallParser reads the model's tool calls back out of its chat
	// output (toolcall.Formats): "glm45" (the default: GLM-4.5's
	// <tool_call>name <arg_key>/<arg_value> format), "json"
	// (<tool_call>{"name": …, "arguments": …}</tool_call>) or "none"
	// (requests with tools are refused).
	ToolCallParser string `koanf:"tool_call_parser"`
	// ReasoningParser splits the chat output's reasoning
	// (reasoning_content) from its answer (reasoning.Formats): "glm45"
	// (the default: <think>…</think>) or "none" (all of it is content).
	ReasoningParser string `koanf:"reasoning_parser"`
	// Weights is how the checkpoint's files are held: "auto" (the
	// default: copy on the CPU, guarded on CUDA; Validate resolves it),
	// "copy" reads them into memory at load, so that a file truncated or
	// overwritten while serving changes nothing (it costs the checkpoint's
	// size in memory); "guarded" maps them read-only (no memory of their
	// own beyond the page cache) and refuses every request with the reason
	// once a file changed on disk (its identity is checked before each
	// batch) or faulted (SIGBUS on a truncated file).
	Weights string `koanf:"weights"`
	// LoadFormat is how the weights are obtained (vLLM's --load-format):
	// "auto" or "safetensors" (the default: read from model.dir's
	// safetensors files, or from the preset's checkpoint written once into
	// cache_dir) or "dummy" (random weights of the right dtypes, shapes and
	// FP8 block scales made in memory from model.seed, no file read or
	// written: for model.preset, over model.set; for model.dir, a directory
	// holding config.json (and a tokenizer) but no weights, over model.set
	// too). Dummy weights are reported as such wherever the model is named.
	LoadFormat string `koanf:"load_format"`
}

// Load formats (model.load_format).
const (
	LoadAuto        = "auto"
	LoadSafetensors = "safetensors"
	LoadDummy       = "dummy"
)

// Dummy reports whether the weights are random, made in memory
// (model.load_format: dummy).
func (m Model) Dummy() bool { return m.LoadFormat == LoadDummy }

// Weights modes (model.weights).
const (
	WeightsAuto    = "auto"
	WeightsCopy    = "copy"
	WeightsGuarded = "guarded"
)

// Server is the network side of `glmflash serve`.
type Server struct {
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
	// Reflection registers gRPC server reflection.
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

	// Connection limits, on every listener (gRPC, the HTTP API, metrics).
	//
	// IdleTimeout closes an HTTP keep-alive connection that has waited this
	// long for its next request; MaxConnectionIdle a gRPC connection without
	// calls for this long (0: never).
	IdleTimeout       time.Duration `koanf:"idle_timeout"`
	MaxConnectionIdle time.Duration `koanf:"max_connection_idle"`
	// ReadHeaderTimeout bounds reading a request's headers (HTTP) and a
	// connection's handshake (gRPC, TLS included).
	ReadHeaderTimeout time.Duration `koanf:"read_header_timeout"`
	// A request body must arrive within BodyTimeout plus its size at
	// MinBodyRate bytes/s (a trickled body is refused with 408).
	BodyTimeout time.Duration `koanf:"body_timeout"`
	MinBodyRate int           `koanf:"min_body_rate"`
	// WriteTimeout bounds each write of a response (a whole reply, one
	// Server-Sent Event, one gRPC stream message): a client that stops reading is disconnected and
	// its request cancelled; a stream that makes progress is never cut.
	WriteTimeout time.Duration `koanf:"write_timeout"`
	// MaxConnections bounds the connections of each listener, and
	// MaxConnectionsPerClient those from one IP; over a bound the oldest
	// idle HTTP connection is closed to make room, else the new one is.
	MaxConnections          int `koanf:"max_connections"`
	MaxConnectionsPerClient int `koanf:"max_connections_per_client"`
	// MaxConcurrentStreams bounds the calls of one gRPC connection.
	MaxConcurrentStreams int `koanf:"max_concurrent_streams"`
	// AllowedHosts are the Host headers the HTTP API and metrics accept
	// ("*": any). Empty: on a loopback address only localhost names and
	// loopback IPs (against DNS rebinding), on any other address any.
	AllowedHosts []string `koanf:"allowed_hosts"`
	// AllowedOrigins are the browser origins ("https://app.example") that
	// may call the HTTP API (CORS); empty: none, every request with a
	// foreign Origin header is refused (403).
	AllowedOrigins []string `koanf:"allowed_origins"`
	// MetricsPlaintext serves /metrics in plain HTTP without API keys even
	// when server.tls or server.auth are on (by default metrics take the
	// same TLS and keys).
	MetricsPlaintext bool `koanf:"metrics_plaintext"`
	// HTTPMetrics serves /metrics on the HTTP API's port too (as vLLM
	// does), behind the API's TLS and keys; metrics_plaintext does not
	// apply there.
	HTTPMetrics bool `koanf:"http_metrics"`
}

// Runtime sizes the engine and the scheduler; zero means the default.
type Runtime struct {
	Slots            int `koanf:"slots"`              // state slots (sequences held); 0: the memory planner's
	MaxRunning       int `koanf:"max_running"`        // default: slots
	MaxQueue         int `koanf:"max_queue"`          // negative: none wait
	MaxBatchTokens   int `koanf:"max_batch_tokens"`   // default max(256, max_running)
	PrefillChunk     int `koanf:"prefill_chunk"`      // default 64
	ContextLimit     int `koanf:"context_limit"`      // default max_position_embeddings
	DefaultMaxTokens int `koanf:"default_max_tokens"` // when a request has none
	MaxChoices       int `koanf:"max_choices"`        // a request's n; default 16
	// KVPageTokens is the tokens per page of the paged KV caches (MLA
	// latents and indexer pooled keys), a multiple of the model's
	// index_kpool; 0: 64 (cache.DefaultPageTokens).
	KVPageTokens int `koanf:"kv_page_tokens"`
	// KVDType is the paged KV caches' dtype: auto (bf16 latents on CUDA
	// under precision bf16, fp32 otherwise), fp32, bf16 (the latents, CUDA
	// only) or fp8 (the latents and the indexer's pooled keys as e4m3 with
	// a power-of-two fp32 scale per 128 values, quantized as they are
	// written: lossy, so logits differ from fp32's within the quantization
	// error and greedy tokens may differ; about a quarter of fp32's bytes).
	KVDType string `koanf:"kv_dtype"`
	// MemoryFraction is the share of the memory free after the weights
	// (device memory on CUDA, the host's available memory on the CPU) that
	// the memory planner gives the caches and the step's workspace, in
	// (0, 1]; 0: the device's default (0.9 on CUDA, 0.5 on the CPU).
	MemoryFraction float64 `koanf:"memory_fraction"`
}

// Options say what to load besides the built-in defaults.
type Options struct {
	// Files are the --config files, each overriding the ones before (none:
	// the built-in defaults alone).
	Files []string
	// Environ is the environment in os.Environ's format; nil means
	// os.Environ(), an empty slice none.
	Environ []string
	// Flags are keys given on the command line.
	Flags []Flag
}

// exclusive keys: a later layer's model.dir replaces an earlier preset.
var exclusive = Exclusive{"model.dir", "model.preset"}

// defaults are the built-in layers: the embedded files of configs/. Their
// relative paths are relative to the working directory.
func defaults() []Layer {
	var ls []Layer
	for _, name := range configs.Defaults {
		b, err := configs.FS.ReadFile(name)
		if err != nil {
			panic(err)
		}
		l, err := BytesLayer("built-in configs/"+name, "", b)
		if err != nil {
			panic(err) // a test loads them
		}
		ls = append(ls, l)
	}
	return ls
}

// Load reads the configuration: the built-in defaults, then o.Files, the
// environment and o.Flags, each overriding the ones before; then checks it.
func Load(o Options) (*Config, error) {
	layers := defaults()
	source := "built-in"
	if len(o.Files) > 0 {
		source = strings.Join(o.Files, " + ")
	}
	for _, f := range o.Files {
		l, err := FileLayer(f)
		if err != nil {
			return nil, err
		}
		layers = append(layers, l)
	}
	c := &Config{}
	layers = append(layers, EnvLayer(o.Environ, c), FlagLayer(o.Flags))
	return decode(c, layers, source)
}

// Parse reads YAML bytes over the built-in defaults (no environment, no
// flags); source names them in errors. Relative paths in them stay as they
// are.
func Parse(b []byte, source string) (*Config, error) {
	l, err := BytesLayer(source, "", b)
	if err != nil {
		return nil, err
	}
	return decode(&Config{}, append(defaults(), l), source)
}

// Default is the built-in configuration: every built-in pass on, in order,
// the `small` preset served on loopback addresses.
func Default() *Config {
	c, err := decode(&Config{}, defaults(), "built-in")
	if err != nil {
		panic(err) // a test loads the defaults
	}
	return c
}

func decode(c *Config, layers []Layer, source string) (*Config, error) {
	src, err := Decode(c, layers, exclusive)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c.Source, c.Sources = source, src
	for i := range c.Passes {
		c.Passes[i].Dir = src.Dir("passes")
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("config: %w", src.Explain(err))
	}
	return c, nil
}

// Explain adds the source of the key a validation error names (a
// KeyError) to its message.
func (c *Config) Explain(err error) error { return c.Sources.Explain(err) }

// VerifyEachPass reports the effective debug.verify_each_pass.
func (c *Config) VerifyEachPass() bool {
	return c.Debug.VerifyEachPass == nil || *c.Debug.VerifyEachPass
}

// Enabled returns the enabled passes in order.
func (c *Config) Enabled() []PassConfig {
	var out []PassConfig
	for _, p := range c.Passes {
		if p.On() {
			out = append(out, p)
		}
	}
	return out
}

// Requests lists the enabled passes, in order, as pipeline requests.
func (c *Config) Requests() []pass.Request {
	var reqs []pass.Request
	for _, p := range c.Enabled() {
		reqs = append(reqs, pass.Request{Name: p.Name, Options: p.Options, Dir: p.Dir})
	}
	return reqs
}

// Pipeline builds the pass pipeline the configuration asks for: the enabled
// passes in their listed order, resolved among the built-in passes and
// extra (the plugin host's passes; may be nil).
func (c *Config) Pipeline(extra pass.Resolver) (*pass.Pipeline, error) {
	return pass.NewPipelineWith(c.Requests(), c.VerifyEachPass(), extra)
}

// PassEnv is the eligibility environment for model m, its weights w and
// this configuration (topology, LoRA targets, hidden-state captures).
func (c *Config) PassEnv(m *model.Config, w pass.WeightInfo) *pass.Env {
	env := pass.NewEnv(m, w)
	env.TP = pass.Topology{Size: c.Parallel.TPSize, Known: c.Parallel.TPSize > 0} // each rank's engine sets its rank
	for _, a := range c.LoRA.Adapters {
		for _, t := range a.Targets {
			env.LoRA = append(env.LoRA, pass.LoRATarget{Adapter: a.Name, Module: t, Layers: a.Layers})
		}
	}
	for _, l := range c.Debug.CaptureHidden {
		env.CaptureHidden[l] = true
	}
	return env
}

// ServedName is the model's name in the HTTP API: model.name, else the
// checkpoint directory's base name, else the preset's name.
func (c *Config) ServedName() string {
	switch {
	case c.Model.Name != "":
		return c.Model.Name
	case c.Model.Dir != "":
		return filepath.Base(filepath.Clean(c.Model.Dir))
	}
	return c.Model.Preset
}

// Validate checks values that typing cannot; errors are KeyErrors (Explain
// adds where the key came from).
func (c *Config) Validate() error {
	if err := c.validateEngine(); err != nil {
		return err
	}
	if err := c.validateServing(); err != nil {
		return err
	}
	if !c.Model.Dummy() { // dummy weights are held in memory of their own: no mode
		c.Model.Weights = c.Model.WeightsFor(c.Device)
	}
	return nil
}

// WeightsFor resolves model.weights for a device: auto (or unset) is copy
// on the CPU, which reads GEMM weights in place for the life of the
// server, and guarded on CUDA, which reads the files only while it uploads
// them (a host copy there would hold the checkpoint's size in RAM for
// nothing).
func (m Model) WeightsFor(device string) string {
	if m.Weights != "" && m.Weights != WeightsAuto {
		return m.Weights
	}
	if device == "cuda" {
		return WeightsGuarded
	}
	return WeightsCopy
}

func (c *Config) validateEngine() error {
	switch c.Device {
	case "":
		c.Device = "cpu"
	case "cpu", "cuda":
	default:
		return keyErr("device", "must be cpu or cuda, got %q", c.Device)
	}
	prec, err := backend.ParsePrecision(string(c.Precision))
	if err != nil {
		return keyErr("precision", "%w", err)
	}
	c.Precision = prec
	if g := c.CUDA.GraphMaxTokens; g < -1 || g > 1<<16 {
		return keyErr("cuda.graph_max_tokens", "must be -1 (no graphs), 0 (the default) or in [1, 65536], got %d", g)
	}
	if err := CheckGraphBuckets(c.CUDA.GraphTokenBuckets); err != nil {
		return keyErr("cuda.graph_token_buckets", "%w", err)
	}
	if g := c.CUDA.MaxGraphs; g < 0 || g > 1<<16 {
		return keyErr("cuda.max_graphs", "must be 0 (the default, 256) or in [1, 65536], got %d", g)
	}
	if k := c.CUDA.GemvFP8Kernel; k != "" && !slices.Contains(GemvFP8Kernels, k) {
		return keyErr("cuda.gemv_fp8_kernel", "must be one of %v (or empty: the first), got %q", GemvFP8Kernels, k)
	}
	seen := map[string]bool{}
	for i, p := range c.Passes {
		if p.Name == "" {
			return keyErr("passes", "passes[%d]: name is required", i)
		}
		if seen[p.Name] {
			return keyErr("passes", "passes[%d]: pass %q is listed twice", i, p.Name)
		}
		seen[p.Name] = true
	}
	if err := c.Parallel.validate(); err != nil {
		return err
	}
	for i, a := range c.LoRA.Adapters {
		if len(a.Targets) == 0 {
			return keyErr("lora.adapters", "lora.adapters[%d] (%s): targets must not be empty", i, a.Name)
		}
		for j, t := range a.Targets {
			if err := checkLoRATarget(t); err != nil {
				return keyErr(fmt.Sprintf("lora.adapters[%d].targets[%d]", i, j), "%v", err)
			}
		}
		if err := checkLayers(fmt.Sprintf("lora.adapters[%d].layers", i), a.Layers); err != nil {
			return err
		}
	}
	if err := checkLayers("debug.capture_hidden", c.Debug.CaptureHidden); err != nil {
		return err
	}
	if t := c.Plugins.ParityTolerance; !(t >= 0 && t <= 1) { // NaN too
		return keyErr("plugins.parity_tolerance", "must be in [0, 1] (0: the default, 0.01), got %v", t)
	}
	if c.Plugins.TimeoutMS < 0 || c.Plugins.TimeoutMS > MaxPluginTimeoutMS {
		return keyErr("plugins.timeout_ms", "must be in [0, %d] (0: the default), got %d", MaxPluginTimeoutMS, c.Plugins.TimeoutMS)
	}
	if c.Plugins.StartTimeoutMS < 0 || c.Plugins.StartTimeoutMS > MaxPluginTimeoutMS {
		return keyErr("plugins.start_timeout_ms", "must be in [0, %d] (0: the default), got %d", MaxPluginTimeoutMS, c.Plugins.StartTimeoutMS)
	}
	names := make([]string, 0, len(c.Plugins.Checksums))
	for name := range c.Plugins.Checksums {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		sum := c.Plugins.Checksums[name]
		if name == "" || strings.ContainsAny(name, `/\`) {
			return keyErr("plugins.checksums", "key %q must be a plugin file name (no directory)", name)
		}
		if !isHexSHA256(sum) {
			return keyErr("plugins.checksums."+name, "%q is not a hex SHA-256 (64 hex digits)", sum)
		}
	}
	return nil
}

func (c *Config) validateServing() error {
	m, s, r := c.Model, c.Server, c.Runtime
	tlsErr := s.TLS.Validate("server.tls") // names its keys
	switch {
	case m.Dir != "" && m.Preset != "":
		return keyErr("model", "model.dir and model.preset are mutually exclusive")
	case m.LoadFormat != "" && m.LoadFormat != LoadAuto && m.LoadFormat != LoadSafetensors && m.LoadFormat != LoadDummy:
		return keyErr("model.load_format", "%q is not auto, safetensors or dummy", m.LoadFormat)
	case m.Dummy() && m.Dir == "" && m.Preset == "":
		return keyErr("model.load_format", "dummy needs a config: model.preset (a preset's) or model.dir (a directory holding config.json)")
	case m.Dir == "" && m.Preset == "":
		return keyErr("model", "name a model with model.dir or model.preset")
	case m.Dir != "" && len(m.Set) > 0 && !m.Dummy():
		return keyErr("model.set", "scales a preset (or, with model.load_format dummy, the config.json of model.dir); model.dir names a checkpoint as it is")
	case m.Dummy() && m.Dir != "" && m.FP8:
		return keyErr("model.fp8", "with model.load_format dummy and model.dir the layout is the config.json's (FP8 with a quantization_config); model.fp8 applies to a preset")
	case m.Dummy() && m.Weights != "" && m.Weights != WeightsAuto:
		return keyErr("model.weights", "%q says how a checkpoint's files are held; model.load_format dummy reads none (leave it auto)", m.Weights)
	case m.Weights != "" && m.Weights != WeightsAuto && m.Weights != WeightsCopy && m.Weights != WeightsGuarded:
		return keyErr("model.weights", "%q is not auto, copy or guarded", m.Weights)
	case toolcall.Check(m.ToolCallParser) != nil:
		return keyErr("model.tool_call_parser", "%v", toolcall.Check(m.ToolCallParser))
	case reasoning.Check(m.ReasoningParser) != nil:
		return keyErr("model.reasoning_parser", "%v", reasoning.Check(m.ReasoningParser))
	case s.GRPCAddr == "":
		return keyErr("server.grpc_addr", "is empty")
	case s.DrainTimeout < 0:
		return keyErr("server.drain_timeout", "must be ≥ 0, got %s", s.DrainTimeout)
	case s.MaxResponseBytes < 1<<10 || s.MaxResponseBytes > 1<<30:
		return keyErr("server.max_response_bytes", "must be in [1 KiB, 1 GiB], got %d", s.MaxResponseBytes)
	case s.MaxRequestBytes < 1<<10 || s.MaxRequestBytes > 1<<30:
		return keyErr("server.max_request_bytes", "must be in [1 KiB, 1 GiB], got %d", s.MaxRequestBytes)
	case s.KeepaliveTime < time.Second:
		return keyErr("server.keepalive_time", "must be ≥ 1s, got %s", s.KeepaliveTime)
	case s.KeepaliveTimeout < time.Second:
		return keyErr("server.keepalive_timeout", "must be ≥ 1s, got %s", s.KeepaliveTimeout)
	case s.MaxConnectionAge != 0 && (s.MaxConnectionAge < time.Second || s.MaxConnectionAge > maxTimeout):
		return keyErr("server.max_connection_age", "must be 0 (never) or in [1s, %s], got %s", maxTimeout, s.MaxConnectionAge)
	case s.MaxConnectionAgeGrace < 0 || s.MaxConnectionAgeGrace > maxTimeout:
		return keyErr("server.max_connection_age_grace", "must be in [0, %s] (0: no bound), got %s", maxTimeout, s.MaxConnectionAgeGrace)
	case s.MaxConnectionIdle != 0 && (s.MaxConnectionIdle < time.Second || s.MaxConnectionIdle > maxTimeout):
		return keyErr("server.max_connection_idle", "must be 0 (never) or in [1s, %s], got %s", maxTimeout, s.MaxConnectionIdle)
	case tlsErr != nil:
		return tlsErr
	}
	if err := s.validateLimits(); err != nil {
		return err
	}
	switch {
	case r.Slots < 0:
		return keyErr("runtime.slots", "must be ≥ 0 (0: the memory planner's), got %d", r.Slots)
	case r.MemoryFraction != 0 && !(r.MemoryFraction > 0 && r.MemoryFraction <= 1): // NaN too
		return keyErr("runtime.memory_fraction", "must be in (0, 1] (0: the device's default), got %v", r.MemoryFraction)
	case r.MaxRunning < 0:
		return keyErr("runtime.max_running", "must be ≥ 0, got %d", r.MaxRunning)
	case r.MaxBatchTokens < 0:
		return keyErr("runtime.max_batch_tokens", "must be ≥ 0, got %d", r.MaxBatchTokens)
	case r.PrefillChunk < 0:
		return keyErr("runtime.prefill_chunk", "must be ≥ 0, got %d", r.PrefillChunk)
	case r.ContextLimit < 0:
		return keyErr("runtime.context_limit", "must be ≥ 0, got %d", r.ContextLimit)
	case r.DefaultMaxTokens < 1:
		return keyErr("runtime.default_max_tokens", "must be ≥ 1, got %d", r.DefaultMaxTokens)
	case r.MaxChoices < 0:
		return keyErr("runtime.max_choices", "must be ≥ 0, got %d", r.MaxChoices)
	case r.KVPageTokens < 0 || r.KVPageTokens > MaxPageTokens:
		return keyErr("runtime.kv_page_tokens", "must be in [0, %d] (0: 64), got %d", MaxPageTokens, r.KVPageTokens)
	case r.KVDType != "" && r.KVDType != "auto" && r.KVDType != "fp32" && r.KVDType != "bf16" && r.KVDType != "fp8":
		return keyErr("runtime.kv_dtype", "must be auto, fp32, bf16 or fp8, got %q", r.KVDType)
	case r.KVDType == "fp8" && c.Device == "cuda":
		return keyErr("runtime.kv_dtype", "fp8 KV is implemented on the cpu device only for now (the cuda kernels that read fp8 rows are not compiled yet): auto, fp32 or bf16")
	case r.KVDType == "bf16" && c.Device != "cuda":
		return keyErr("runtime.kv_dtype", "bf16 latents are implemented on the cuda device only (device %q holds fp32: auto or fp32)", c.Device)
	case r.MaxChoices > MaxSlots:
		return keyErr("runtime.max_choices", "must be at most %d, got %d", MaxSlots, r.MaxChoices)
	case r.Slots > MaxSlots:
		return keyErr("runtime.slots", "must be at most %d, got %d", MaxSlots, r.Slots)
	case r.MaxRunning > MaxSlots:
		return keyErr("runtime.max_running", "must be at most %d, got %d", MaxSlots, r.MaxRunning)
	case r.MaxQueue > MaxQueue:
		return keyErr("runtime.max_queue", "must be at most %d, got %d", MaxQueue, r.MaxQueue)
	case r.MaxBatchTokens > MaxTokens:
		return keyErr("runtime.max_batch_tokens", "must be at most %d, got %d", MaxTokens, r.MaxBatchTokens)
	case r.PrefillChunk > MaxTokens:
		return keyErr("runtime.prefill_chunk", "must be at most %d, got %d", MaxTokens, r.PrefillChunk)
	case r.ContextLimit > MaxTokens:
		return keyErr("runtime.context_limit", "must be at most %d, got %d", MaxTokens, r.ContextLimit)
	case r.DefaultMaxTokens > MaxTokens:
		return keyErr("runtime.default_max_tokens", "must be at most %d, got %d", MaxTokens, r.DefaultMaxTokens)
	case s.DrainTimeout > maxTimeout:
		return keyErr("server.drain_timeout", "must be at most %s, got %s", maxTimeout, s.DrainTimeout)
	case s.KeepaliveTime > maxTimeout || s.KeepaliveTimeout > maxTimeout:
		return keyErr("server.keepalive_time", "keepalive_time and keepalive_timeout must be at most %s, got %s and %s", maxTimeout, s.KeepaliveTime, s.KeepaliveTimeout)
	}
	return c.Speculative.validate(c.Model.Preset)
}

func (p *Parallel) validate() error {
	if p.TPSize == 0 {
		p.TPSize = 1 // unset
	}
	if p.TPSize < 1 || p.TPSize > MaxTPSize {
		return keyErr("parallel.tp_size", "must be in [1, %d], got %d", MaxTPSize, p.TPSize)
	}
	if p.AttentionTPSize == 0 {
		p.AttentionTPSize = p.TPSize // unset: attention as wide as the rest
	}
	if p.AttentionTPSize < 1 || p.AttentionTPSize > MaxTPSize {
		return keyErr("parallel.attention_tp_size", "must be in [1, %d], got %d", MaxTPSize, p.AttentionTPSize)
	}
	if p.AttentionTPSize != p.TPSize {
		return keyErr("parallel.attention_tp_size", "must equal parallel.tp_size (%d), got %d: attention data parallelism (attention TP below TP) is not implemented", p.TPSize, p.AttentionTPSize)
	}
	if p.AttentionTPRank != 0 {
		return keyErr("parallel.attention_tp_rank", "must be 0, got %d: one process runs every rank of parallel.tp_size", p.AttentionTPRank)
	}
	if p.EPSize == 0 {
		p.EPSize = 1
	}
	if p.EPSize != 1 {
		return keyErr("parallel.ep_size", "must be 1, got %d: expert parallelism (all-to-all) is not implemented; the experts are split along their intermediate dimension over parallel.tp_size", p.EPSize)
	}
	return nil
}

// MaxTPSize bounds parallel.tp_size and parallel.attention_tp_size (no
// model has more heads).
const MaxTPSize = 1024

// MaxLayer bounds a layer index in the configuration (debug.capture_hidden,
// lora layers); CheckModel holds them to the model's own layers.
const MaxLayer = 4096

// checkLayers refuses negative, huge and repeated layer indices.
func checkLayers(key string, layers []int) error {
	seen := map[int]int{}
	for i, l := range layers {
		if l < 0 || l >= MaxLayer {
			return keyErr(fmt.Sprintf("%s[%d]", key, i), "layer %d is outside [0, %d)", l, MaxLayer)
		}
		if j, dup := seen[l]; dup {
			return keyErr(fmt.Sprintf("%s[%d]", key, i), "layer %d is listed twice (also [%d])", l, j)
		}
		seen[l] = i
	}
	return nil
}

// LoRAModules are the linear modules of a decoder layer a LoRA adapter
// can target, and LoRAScopes the sections a dotted target may name
// ("mlp.shared_experts.gate_proj").
var (
	LoRAModules = []string{"q_proj", "k_proj", "v_proj", "o_proj", "b_proj", "f_a_proj", "f_b_proj", "g_a_proj", "g_b_proj",
		"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "wq_b", "wk", "weights_proj", "gate_proj", "up_proj", "down_proj"}
	LoRAScopes = []string{"self_attn", "indexer", "mlp", "shared_experts", "experts"}
)

func checkLoRATarget(t string) error {
	parts := strings.Split(t, ".")
	base := parts[len(parts)-1]
	if !slices.Contains(LoRAModules, base) {
		return fmt.Errorf("%q is not a module of the model (have %s, optionally under %s: \"mlp.gate_proj\")", t, strings.Join(LoRAModules, ", "), strings.Join(LoRAScopes, ", "))
	}
	for _, p := range parts[:len(parts)-1] {
		if !slices.Contains(LoRAScopes, p) {
			return fmt.Errorf("%q: %q is not a section of a layer (have %s)", t, p, strings.Join(LoRAScopes, ", "))
		}
	}
	return nil
}

// CheckModel holds the layer indices of the configuration to model m's
// layers (trunk and MTP): a layer the model does not have is an error
// naming its key, not a capture or an adapter silently ignored.
func (c *Config) CheckModel(m *model.Config) error {
	n := m.NumHiddenLayers + m.NumNextNPredictLayers
	check := func(key string, layers []int) error {
		for i, l := range layers {
			if l >= n {
				return keyErr(fmt.Sprintf("%s[%d]", key, i), "layer %d: the model has %d layers (0 to %d)", l, n, n-1)
			}
		}
		return nil
	}
	for i, a := range c.LoRA.Adapters {
		if err := check(fmt.Sprintf("lora.adapters[%d].layers", i), a.Layers); err != nil {
			return c.Explain(err)
		}
	}
	if p, kp := c.Runtime.KVPageTokens, m.IndexKPool; p != 0 && kp > 0 && p%kp != 0 {
		return c.Explain(keyErr("runtime.kv_page_tokens", "must be a multiple of the model's index_kpool (%d): a page holds whole pools, got %d", kp, p))
	}
	return c.Explain(check("debug.capture_hidden", c.Debug.CaptureHidden))
}

// Bounds of the runtime section: far above any machine's, low enough that
// no sum or product of them overflows an int.
const (
	MaxSlots  = 1 << 16
	MaxQueue  = 1 << 20
	MaxTokens = 1 << 24 // tokens of one context, batch or chunk
	// MaxPageTokens bounds runtime.kv_page_tokens.
	MaxPageTokens = 1 << 20
)

// maxTimeout bounds every timeout of the server section.
const maxTimeout = 24 * time.Hour

// MaxConnectionsBound bounds server.max_connections.
const MaxConnectionsBound = 1 << 20

func (s Server) validateLimits() error {
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"server.idle_timeout", s.IdleTimeout}, {"server.read_header_timeout", s.ReadHeaderTimeout}, {"server.body_timeout", s.BodyTimeout}, {"server.write_timeout", s.WriteTimeout}} {
		if d.v < 10*time.Millisecond || d.v > maxTimeout {
			return keyErr(d.key, "must be in [10ms, %s], got %s", maxTimeout, d.v)
		}
	}
	switch {
	case s.MinBodyRate < 1 || s.MinBodyRate > 1<<30:
		return keyErr("server.min_body_rate", "must be in [1, %d] bytes/s, got %d", 1<<30, s.MinBodyRate)
	case s.MaxConnections < 1 || s.MaxConnections > MaxConnectionsBound:
		return keyErr("server.max_connections", "must be in [1, %d], got %d", MaxConnectionsBound, s.MaxConnections)
	case s.MaxConnectionsPerClient < 1 || s.MaxConnectionsPerClient > s.MaxConnections:
		return keyErr("server.max_connections_per_client", "must be in [1, server.max_connections (%d)], got %d", s.MaxConnections, s.MaxConnectionsPerClient)
	case s.MaxConcurrentStreams < 1 || s.MaxConcurrentStreams > 1<<20:
		return keyErr("server.max_concurrent_streams", "must be in [1, %d], got %d", 1<<20, s.MaxConcurrentStreams)
	}
	for i, h := range s.AllowedHosts {
		if err := access.CheckHostPattern(h); err != nil {
			return keyErr(fmt.Sprintf("server.allowed_hosts[%d]", i), "%v", err)
		}
	}
	for i, o := range s.AllowedOrigins {
		if err := access.CheckOrigin(o); err != nil {
			return keyErr(fmt.Sprintf("server.allowed_origins[%d]", i), "%v", err)
		}
	}
	return nil
}

// isHexSHA256 reports whether s is 64 hex digits.
func isHexSHA256(s string) bool {
	_, err := hex.DecodeString(s)
	return len(s) == 64 && err == nil
}
