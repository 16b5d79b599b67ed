package config

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/glmflash/glmflash/configs"
	"github.com/glmflash/glmflash/core/backend"
	"github.com/stretchr/testify/require"
)

func writeYAML(t *testing.T, s string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.yaml")
	require.NoError(t, os.WriteFile(p, []byte(s), 0o644))
	return p
}

func load(t *testing.T, yaml string, env ...string) (*Config, error) {
	t.Helper()
	o := Options{Environ: append([]string{}, env...)}
	if yaml != "" {
		o.Files = []string{writeYAML(t, yaml)}
	}
	return Load(o)
}

// The built-in defaults are the shipped files: every built-in pass on, the
// small preset on loopback addresses.
func TestDefaultsAreTheShippedFiles(t *testing.T) {
	d := Default()
	require.Len(t, d.Enabled(), 5)
	require.True(t, d.VerifyEachPass())
	require.Equal(t, "cpu", d.Device)
	require.Equal(t, "small", d.Model.Preset)
	require.Equal(t, int64(1), d.Model.Seed)
	require.Equal(t, ".cache/glmflash", d.Model.CacheDir)
	require.Equal(t, "127.0.0.1:50051", d.Server.GRPCAddr)
	require.Equal(t, "127.0.0.1:8000", d.Server.HTTPAddr)
	require.Equal(t, "", d.Server.MetricsAddr, "/metrics is on the HTTP port; a port of its own only when asked")
	require.Equal(t, 30*time.Second, d.Server.DrainTimeout)
	require.True(t, d.Server.Reflection)
	require.Equal(t, 0, d.Runtime.Slots, "the memory planner sizes the slots")
	require.Zero(t, d.Runtime.MemoryFraction, "the device's default")
	require.Equal(t, "small", d.ServedName())
	require.Equal(t, "built-in configs/engine.yaml", d.Sources.Of("passes"))
	require.Equal(t, "built-in configs/serve.yaml", d.Sources.Of("runtime.slots"))
	// a file that says nothing is the defaults
	c, err := load(t, "{}\n")
	require.NoError(t, err)
	require.Equal(t, d.Requests(), c.Requests())
}

// Every YAML file under configs/ loads as a --config file.
func TestEveryShippedFileLoads(t *testing.T) {
	require.NoError(t, fs.WalkDir(configs.FS, ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || strings.HasPrefix(p, "studies/") {
			return err
		}
		_, err = Load(Options{Files: []string{filepath.Join("..", "..", "configs", p)}, Environ: []string{}})
		require.NoError(t, err, p)
		return nil
	}))
}

// A misspelt or mistyped key is an error naming the key and where it came
// from; nothing is reinterpreted.
func TestStrictDecodingNamesTheKeyAndItsSource(t *testing.T) {
	for yaml, want := range map[string]string{
		"passes:\n  - name: x\n    optoins: {}\n":              "optoins",
		"paralel:\n  attention_tp_size: 2\n":                   `unknown key "paralel.attention_tp_size" in `,
		"parallel:\n  tp_size: 2\n  attention_tp_rank: 1\n":    "parallel.attention_tp_rank (",
		"parallel:\n  tp_size: 4\n  attention_tp_size: 2\n":    "must equal parallel.tp_size (4), got 2: attention data parallelism",
		"parallel:\n  attention_tp_size: 2\n":                  "must equal parallel.tp_size (1), got 2",
		"parallel:\n  ep_size: 8\n":                            "parallel.ep_size (",
		"parallel:\n  tp_size: 0\n  attention_tp_size: 2000\n": "parallel.attention_tp_size (",
		"parallel:\n  tp_size: -1\n":                           "parallel.tp_size (",
		"passes:\n  - name: a\n  - name: a\n":                  "listed twice",
		"passes: [\n":                                          "invalid YAML",
		"lora:\n  adapters:\n    - name: a\n":                  "targets must not be empty",
		"runtime: {max_runing: 3}\n":                           `unknown key "runtime.max_runing"`,
		"logging: {level: debug}\n":                            `unknown key "logging.level"`,
		"model: small\n":                                       `"model" must be a section`,
		"runtime: {slots: many}\n":                             "runtime.slots (",
		"runtime: {slots: 2.7}\n":                              "2.7 is not an integer",
		"runtime: {slots: true}\n":                             "runtime.slots",
		"server: {drain_timeout: soon}\n":                      "server.drain_timeout",
		"server: {drain_timeout: 30}\n":                        "has no unit",
		"model: {preset: small, dir: /x}\n":                    "model.dir and model.preset are mutually exclusive",
		"runtime: {slots: -1}\n":                               "runtime.slots (",
		"runtime: {memory_fraction: 1.5}\n":                    "runtime.memory_fraction (",
		"runtime: {memory_fraction: -0.1}\n":                   "runtime.memory_fraction (",
		"runtime: {memory_fraction: .nan}\n":                   "runtime.memory_fraction (",
		"server: {drain_timeout: -1s}\n":                       "server.drain_timeout (",
		"device: tpu\n":                                        `device (`,
		"precision: fp16\n":                                    `precision (`,
		"cuda: {graph_max_tokens: -2}\n":                       `cuda.graph_max_tokens (`,
		"cuda: {graph_max_tokens: 70000}\n":                    `cuda.graph_max_tokens (`,
		"cuda: {gemv_fp8_kernel: glmf_gemv_f2}\n":              `cuda.gemv_fp8_kernel (`,
		"cuda: {graph_token_buckets: [128, 64]}\n":             `cuda.graph_token_buckets (`,
		"cuda: {graph_token_buckets: [64, 64]}\n":              "buckets must ascend, got 64 after 64",
		"cuda: {graph_token_buckets: [0, 64]}\n":               `cuda.graph_token_buckets (`,
		"cuda: {graph_token_buckets: [70000]}\n":               "every bucket must be in [1, 65536]",
		"cuda: {graph_token_buckets: []}\n":                    "got an empty list",
		"cuda: {max_graphs: -1}\n":                             `cuda.max_graphs (`,
		"cuda: {max_graphs: 70000}\n":                          `cuda.max_graphs (`,
		"plugins: {timeout_ms: 2.5}\n":                         "timeout_ms",
		"debug: {capture_hidden: [1.5]}\n":                     "capture_hidden",
	} {
		_, err := load(t, yaml)
		require.ErrorContains(t, err, want, yaml)
	}
	// the source is the file
	p := writeYAML(t, "runtime: {slots: -1}\n")
	_, err := Load(Options{Files: []string{p}, Environ: []string{}})
	require.ErrorContains(t, err, "runtime.slots ("+p+"): must be ≥ 0 (0: the memory planner's), got -1")
	_, err = Load(Options{Files: []string{filepath.Join(t.TempDir(), "missing.yaml")}})
	require.ErrorContains(t, err, "missing.yaml")
}

// GLMFLASH_<KEY PATH> variables override the file, flags override both;
// errors name the variable or the flag.
func TestEnvironmentAndFlags(t *testing.T) {
	p := writeYAML(t, "model: {dir: /models/x}\nserver: {grpc_addr: \"127.0.0.1:7000\", drain_timeout: 2s}\nruntime: {max_running: 4, prefill_chunk: 32}\nparallel: {attention_tp_size: 1}\n")
	env := []string{
		"GLMFLASH_RUNTIME__MAX_RUNNING=6",            // overrides the file
		"GLMFLASH_SERVER__METRICS_ADDR=",             // disables metrics
		"GLMFLASH_PARALLEL__TP_SIZE=4",               // an engine key, same convention
		"GLMFLASH_PARALLEL__ATTENTION_TP_SIZE=4",     //
		"GLMFLASH_DEVICE=cpu",                        // a top-level key
		"GLMFLASH_PRECISION=bf16",                    //
		"GLMFLASH_CUDA__GRAPH_MAX_TOKENS=-1",         // a CUDA key
		"GLMFLASH_CUDA_EMULATOR=/x.so", "HOME=/root", // not configuration
		"GLMFLASH_DEBUG__CAPTURE_HIDDEN=1,2", // a list
	}
	c, err := Load(Options{Files: []string{p}, Environ: env, Flags: []Flag{{Key: "runtime.prefill_chunk", Value: 16, Name: "--chunk"}}})
	require.NoError(t, err)
	require.Equal(t, "/models/x", c.Model.Dir)
	require.Empty(t, c.Model.Preset, "model.dir replaces the default preset")
	require.Equal(t, int64(1), c.Model.Seed, "default kept")
	require.Equal(t, "127.0.0.1:7000", c.Server.GRPCAddr)
	require.Equal(t, "", c.Server.MetricsAddr)
	require.Equal(t, 2*time.Second, c.Server.DrainTimeout)
	require.Equal(t, 6, c.Runtime.MaxRunning)
	require.Equal(t, 16, c.Runtime.PrefillChunk)
	require.Equal(t, 0, c.Runtime.Slots)
	require.Equal(t, 4, c.Parallel.TPSize)
	require.Equal(t, 4, c.Parallel.AttentionTPSize)
	require.Equal(t, []int{1, 2}, c.Debug.CaptureHidden)
	require.Equal(t, backend.BF16, c.Precision)
	require.Equal(t, -1, c.CUDA.GraphMaxTokens)
	require.Equal(t, "environment variable GLMFLASH_RUNTIME__MAX_RUNNING", c.Sources.Of("runtime.max_running"))
	require.Equal(t, "flag --chunk", c.Sources.Of("runtime.prefill_chunk"))
	require.Equal(t, p, c.Sources.Of("server.grpc_addr"))

	for e, want := range map[string]string{
		"GLMFLASH_SERVER__GRPC_ADR=x":                   `unknown key "server.grpc_adr" in environment variable GLMFLASH_SERVER__GRPC_ADR`,
		"GLMFLASH_RUNTIME__SLOTS=2.7":                   `runtime.slots (environment variable GLMFLASH_RUNTIME__SLOTS): "2.7" is not an integer`,
		"GLMFLASH_RUNTIME__SLOTS=-3":                    "runtime.slots (environment variable GLMFLASH_RUNTIME__SLOTS): must be ≥ 0",
		"GLMFLASH_SERVER__DRAIN_TIMEOUT=30":             "drain_timeout",
		"GLMFLASH_ENGINE_PARALLEL__ATTENTION_TP_SIZE=2": "GLMFLASH_PARALLEL__ATTENTION_TP_SIZE",
		"GLMFLASH_PARALLEL__ATTENTION_TP_SIZE=2.0":      "attention_tp_size",
	} {
		_, err := Load(Options{Files: []string{p}, Environ: []string{e}})
		require.ErrorContains(t, err, want, e)
	}
	_, err = Load(Options{Files: []string{p}, Environ: []string{}, Flags: []Flag{{Key: "runtime.slots", Value: -2, Name: "--slots"}}})
	require.ErrorContains(t, err, "runtime.slots (flag --slots): must be ≥ 0 (0: the memory planner's), got -2")
	// a flag's model.preset replaces the file's model.dir
	c, err = Load(Options{Files: []string{p}, Environ: []string{}, Flags: []Flag{{Key: "model.preset", Value: "tiny", Name: "--preset"}}})
	require.NoError(t, err)
	require.Equal(t, "tiny", c.Model.Preset)
	require.Empty(t, c.Model.Dir)
}

// Relative paths in a file are relative to the file; those of the
// environment, of flags and of the built-in defaults to the working
// directory.
func TestRelativePaths(t *testing.T) {
	p := writeYAML(t, `
model: {dir: ckpt, cache_dir: ../cache, name: mine}
server:
  tls: {cert_file: c.pem, key_file: /abs/k.pem}
  auth: {api_keys_file: keys.txt}
plugins: {dir: plugins, sums_file: plugins/SHA256SUMS}
passes:
  - name: prefill-autotune
    options: {table_dir: tables}
`)
	dir := filepath.Dir(p)
	c, err := Load(Options{Files: []string{p}, Environ: []string{"GLMFLASH_SERVER__TLS__CLIENT_CA_FILE=ca.pem"}})
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, "ckpt"), c.Model.Dir)
	require.Equal(t, filepath.Join(dir, "../cache"), c.Model.CacheDir)
	require.Equal(t, filepath.Join(dir, "c.pem"), c.Server.TLS.CertFile)
	require.Equal(t, "/abs/k.pem", c.Server.TLS.KeyFile)
	require.Equal(t, "ca.pem", c.Server.TLS.ClientCAFile, "the environment's paths are relative to the working directory")
	require.Equal(t, filepath.Join(dir, "keys.txt"), c.Server.Auth.APIKeysFile)
	require.Equal(t, filepath.Join(dir, "plugins"), c.Plugins.Dir)
	require.Equal(t, filepath.Join(dir, "plugins/SHA256SUMS"), c.Plugins.SumsFile)
	require.Equal(t, dir, c.Requests()[0].Dir, "pass path options are relative to the file")
	require.Equal(t, "mine", c.ServedName())
	d := Default()
	require.Equal(t, ".cache/glmflash", d.Model.CacheDir)
	require.Empty(t, d.Requests()[0].Dir)
}

func TestPluginSettings(t *testing.T) {
	sum := strings.Repeat("ab", 32)
	c, err := Parse([]byte("plugins:\n  dir: /opt/p\n  allow_unverified: true\n  timeout_ms: 500\n  checksums:\n    glmflash-pass-x: "+sum+"\n"), "f.yaml")
	require.NoError(t, err)
	require.True(t, c.Plugins.AllowUnverified)
	require.Equal(t, sum, c.Plugins.Checksums["glmflash-pass-x"])
	require.False(t, Default().Plugins.AllowUnverified)
	_, err = Parse([]byte("plugins:\n  checksums:\n    glmflash-pass-x: abc\n"), "f.yaml")
	require.ErrorContains(t, err, "plugins.checksums.glmflash-pass-x")
	_, err = Parse([]byte("plugins:\n  allow_unverifed: true\n"), "f.yaml")
	require.ErrorContains(t, err, "allow_unverifed")
}

// The operator options decode and are checked.
func TestOperatorOptions(t *testing.T) {
	c, err := load(t, `
server:
  reflection: false
  expose_paths: true
  keepalive_time: 30s
  max_connection_age: 1h
  max_connection_age_grace: 30s
  max_response_bytes: 1048576
`)
	require.NoError(t, err)
	require.False(t, c.Server.Reflection)
	require.True(t, c.Server.ExposePaths)
	require.Equal(t, time.Hour, c.Server.MaxConnectionAge)
	for y, want := range map[string]string{
		"server: {tls: {cert_file: c.pem}}":        "server.tls: cert_file and key_file are both required",
		"server: {keepalive_time: 0s}":             "server.keepalive_time",
		"server: {max_connection_age: -1s}":        "max_connection_age",
		"server: {max_response_bytes: 10}":         "server.max_response_bytes",
		"server: {auth: {api_key_file: keys.txt}}": `unknown key "server.auth.api_key_file"`,
		"model: {weights: mmap}":                   `"mmap" is not auto, copy or guarded`,
		"plugins: {parity_tolerance: 2}":           "plugins.parity_tolerance",
		"plugins: {parity_tolerance: .nan}":        "plugins.parity_tolerance",
	} {
		_, err := load(t, y+"\n")
		require.ErrorContains(t, err, want, y)
	}
}

// No YAML, and no environment, makes the loader panic.
func FuzzLoad(f *testing.F) {
	b, err := os.ReadFile(filepath.Join("..", "..", "configs", "engine.yaml"))
	require.NoError(f, err)
	f.Add(string(b), "")
	for _, s := range []string{
		"passes: []\n",
		"passes:\n  - name: x\n    enabled: false\n    options: {a: [1,2]}\n",
		"model: {dir: /x}\nserver: {drain_timeout: 3s}\nruntime: {slots: 4}\n",
		"model: small\n",
		"runtime: {slots: [1, 2]}\n",
		"a: {b: {c: {d: 1}}}\n",
		"speculative: {method: mtp, preset: 5-1-6, index_share: true}\n",
		"speculative: {method: mtp, num_steps: 40}\n",
	} {
		f.Add(s, "GLMFLASH_RUNTIME__SLOTS=3")
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, s, env string) {
		p := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		_, _ = Load(Options{Files: []string{p}, Environ: []string{env}})
		_, _ = Parse([]byte(s), "fuzz")
	})
}

// A dotted key in a file is refused with a message naming the key and its
// place (issue 37: "config.Config: has unknown key(s): runtime.slots"),
// at any depth and in lists.
func TestDottedKeysNameTheKey(t *testing.T) {
	for yaml, want := range map[string]string{
		"runtime.slots: 4\n":                       `: key "runtime.slots" at the top level has a dot: keys are not split on dots in a file; nest it (runtime: then slots: under it)`,
		"server:\n  tls.cert_file: a.pem\n":        `: key "tls.cert_file" in server has a dot`,
		"passes:\n  - name: x\n    options.a: 1\n": `: key "options.a" in passes[0] has a dot`,
		"runtime:\n  slots: 2\nruntime.slots: 4\n": `: key "runtime.slots" at the top level has a dot`,
	} {
		p := writeYAML(t, yaml)
		_, err := Load(Options{Files: []string{p}, Environ: []string{}})
		require.ErrorContains(t, err, p+want, yaml)
		require.NotContains(t, err.Error(), "config.Config", yaml)
	}
}

// model.weights: auto (the shipped default) is copy on the CPU and guarded
// on CUDA; an explicit mode is kept on either device.
func TestWeightsModePerDevice(t *testing.T) {
	for _, c := range []struct{ yaml, device, want string }{
		{"model: {dir: /m}\n", "cpu", WeightsCopy},
		{"model: {dir: /m}\n", "cuda", WeightsGuarded},
		{"model: {dir: /m, weights: copy}\n", "cuda", WeightsCopy},
		{"model: {dir: /m, weights: guarded}\n", "cpu", WeightsGuarded},
	} {
		p := writeYAML(t, c.yaml)
		cfg, err := Load(Options{Files: []string{p}, Flags: []Flag{{Key: "device", Value: c.device, Name: "--device"}}})
		require.NoError(t, err, c.yaml)
		require.Equal(t, c.want, cfg.Model.Weights, "%s on %s", c.yaml, c.device)
	}
	require.Equal(t, WeightsGuarded, Model{}.WeightsFor("cuda"))
	require.Equal(t, WeightsCopy, Model{Weights: WeightsAuto}.WeightsFor("cpu"))
}

// model.tool_call_parser and model.reasoning_parser: glm45 by default, the
// other formats taken, anything else refused with the key named.
func TestChatParsers(t *testing.T) {
	cfg, err := Load(Options{})
	require.NoError(t, err)
	require.Equal(t, "glm45", cfg.Model.ToolCallParser)
	require.Equal(t, "glm45", cfg.Model.ReasoningParser)
	cfg, err = Load(Options{Files: []string{writeYAML(t, "model: {tool_call_parser: json, reasoning_parser: none}\n")}})
	require.NoError(t, err)
	require.Equal(t, "json", cfg.Model.ToolCallParser)
	require.Equal(t, "none", cfg.Model.ReasoningParser)
	_, err = Load(Options{Files: []string{writeYAML(t, "model: {tool_call_parser: hermes}\n")}})
	require.ErrorContains(t, err, `model.tool_call_parser`)
	require.ErrorContains(t, err, `"hermes" is not a tool-call parser (have none, glm45, json)`)
	_, err = Load(Options{Files: []string{writeYAML(t, "model: {reasoning_parser: \"\"}\n")}})
	require.ErrorContains(t, err, `model.reasoning_parser`)
}

// cuda.graph_token_buckets is unset by default (the backend's buckets),
// [0] turns bucket graphs off, an ascending list is taken as given;
// cuda.max_graphs 0 is the default bound.
func TestGraphBucketsKeys(t *testing.T) {
	c, err := load(t, "")
	require.NoError(t, err)
	require.Nil(t, c.CUDA.GraphTokenBuckets)
	require.Zero(t, c.CUDA.MaxGraphs)
	c, err = load(t, "cuda: {graph_token_buckets: [0], max_graphs: 16}\n")
	require.NoError(t, err)
	require.Equal(t, []int{0}, c.CUDA.GraphTokenBuckets)
	require.Equal(t, 16, c.CUDA.MaxGraphs)
	c, err = load(t, "cuda: {graph_token_buckets: [96, 512, 2048]}\n")
	require.NoError(t, err)
	require.Equal(t, []int{96, 512, 2048}, c.CUDA.GraphTokenBuckets)
}
