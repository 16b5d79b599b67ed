package config

import (
	"testing"
	"time"

	"github.com/glmflash/glmflash/model"
	"github.com/stretchr/testify/require"
)

// Numbers out of any sane range, and values of the wrong kind, are refused
// with the key named: none reaches grpc-go (max_connection_age 1ns panicked
// it), an allocation (capture_hidden [1e6]) or a pass silently.
func TestBoundsNameTheKey(t *testing.T) {
	for y, want := range map[string]string{
		"server: {max_connection_age: 1ns}":                              "server.max_connection_age (",
		"server: {max_connection_age: 999ms}":                            "must be 0 (never) or in [1s, 24h0m0s], got 999ms",
		"server: {max_connection_idle: 1ns}":                             "server.max_connection_idle (",
		"server: {max_connection_age_grace: 1000h}":                      "server.max_connection_age_grace (",
		"server: {idle_timeout: 0s}":                                     "server.idle_timeout (",
		"server: {write_timeout: 1ns}":                                   "server.write_timeout (",
		"server: {body_timeout: 100h}":                                   "server.body_timeout (",
		"server: {read_header_timeout: 0s}":                              "server.read_header_timeout (",
		"server: {min_body_rate: 0}":                                     "server.min_body_rate (",
		"server: {max_connections: 0}":                                   "server.max_connections (",
		"server: {max_connections: 10, max_connections_per_client: 11}":  "server.max_connections_per_client (",
		"server: {max_concurrent_streams: 0}":                            "server.max_concurrent_streams (",
		"server: {allowed_hosts: ['http://x.example']}":                  "server.allowed_hosts[0] (",
		"server: {allowed_hosts: ['a.*.example']}":                       "server.allowed_hosts[0] (",
		"server: {allowed_origins: ['x.example']}":                       "server.allowed_origins[0] (",
		"server: {drain_timeout: 100000h}":                               "server.drain_timeout (",
		"parallel: {attention_tp_size: 1000000000}":                      "parallel.attention_tp_size (",
		"debug: {capture_hidden: [1000000]}":                             "debug.capture_hidden[0] (",
		"debug: {capture_hidden: [1, 1]}":                                "debug.capture_hidden[1] (",
		"lora: {adapters: [{name: a, targets: [q_prj]}]}":                `lora.adapters[0].targets[0] (`,
		"lora: {adapters: [{name: a, targets: [mlp.foo.up_proj]}]}":      `"foo" is not a section`,
		"lora: {adapters: [{name: a, targets: [q_proj], layers: [-1]}]}": "lora.adapters[0].layers[0] (",
		"runtime: {slots: 1000000000}":                                   "runtime.slots (",
		"runtime: {max_queue: 1000000000}":                               "runtime.max_queue (",
		"runtime: {context_limit: 9223372036854775807}":                  "runtime.context_limit (",
		"runtime: {default_max_tokens: 9223372036854775807}":             "runtime.default_max_tokens (",
		"runtime: {max_choices: -1}":                                     "runtime.max_choices (",
		"runtime: {max_choices: 1000000000}":                             "runtime.max_choices (",
		// quoted numbers and bools are strings, whatever they spell
		`runtime: {slots: "8"}`:         `runtime.slots (`,
		`server: {reflection: "true"}`:  `server.reflection (`,
		`cuda: {graph_max_tokens: '8'}`: `cuda.graph_max_tokens (`,
	} {
		_, err := load(t, y+"\n")
		require.ErrorContains(t, err, want, y)
	}
	_, err := load(t, `runtime: {slots: "8"}`+"\n")
	require.ErrorContains(t, err, `"8" is a string, not a number (in YAML write it without quotes)`)
	_, err = load(t, "lora: {adapters: [{name: a, targets: [q_prj]}]}\n")
	require.ErrorContains(t, err, `"q_prj" is not a module of the model`)

	// An environment variable can only be text: it is parsed, lists too.
	c, err := load(t, "", "GLMFLASH_RUNTIME__SLOTS=8", "GLMFLASH_DEBUG__CAPTURE_HIDDEN=1, 2", "GLMFLASH_SERVER__REFLECTION=false",
		"GLMFLASH_SERVER__ALLOWED_HOSTS=api.example,*.internal", "GLMFLASH_SERVER__IDLE_TIMEOUT=5s")
	require.NoError(t, err)
	require.Equal(t, 8, c.Runtime.Slots)
	require.Equal(t, []int{1, 2}, c.Debug.CaptureHidden)
	require.False(t, c.Server.Reflection)
	require.Equal(t, []string{"api.example", "*.internal"}, c.Server.AllowedHosts)
	require.Equal(t, 5*time.Second, c.Server.IdleTimeout)
	// Dotted LoRA targets within a layer's sections are fine.
	_, err = load(t, "lora: {adapters: [{name: a, targets: [mlp.shared_experts.gate_proj, self_attn.q_proj, k_proj]}]}\n")
	require.NoError(t, err)
}

// Layer indices are held to the model's layers when it is known.
func TestCheckModelLayers(t *testing.T) {
	m := &model.Config{NumHiddenLayers: 4, NumNextNPredictLayers: 1}
	c, err := load(t, "debug: {capture_hidden: [4]}\n")
	require.NoError(t, err)
	require.NoError(t, c.CheckModel(m), "layer 4 is the MTP layer")
	c, err = load(t, "debug: {capture_hidden: [0, 5]}\n")
	require.NoError(t, err)
	require.ErrorContains(t, c.CheckModel(m), "debug.capture_hidden[1] (")
	require.ErrorContains(t, c.CheckModel(m), "layer 5: the model has 5 layers (0 to 4)")
	c, err = load(t, "lora: {adapters: [{name: a, targets: [q_proj], layers: [7]}]}\n")
	require.NoError(t, err)
	require.ErrorContains(t, c.CheckModel(m), "lora.adapters[0].layers[0] (")
}

// The connection limits are on by default, with the values the shipped
// file documents.
func TestConnectionLimitDefaults(t *testing.T) {
	s := Default().Server
	require.Equal(t, 75*time.Second, s.IdleTimeout)
	require.Equal(t, 10*time.Second, s.ReadHeaderTimeout)
	require.Equal(t, 10*time.Second, s.BodyTimeout)
	require.Equal(t, 4096, s.MinBodyRate)
	require.Equal(t, 30*time.Second, s.WriteTimeout)
	require.Equal(t, 4096, s.MaxConnections)
	require.Equal(t, 256, s.MaxConnectionsPerClient)
	require.Equal(t, 5*time.Minute, s.MaxConnectionIdle)
	require.Equal(t, 1024, s.MaxConcurrentStreams)
	require.Empty(t, s.AllowedHosts)
	require.Empty(t, s.AllowedOrigins)
	require.False(t, s.MetricsPlaintext)
	require.True(t, s.HTTPMetrics, "/metrics on the HTTP API's port too, as vLLM")
}

// runtime.kv_page_tokens: 0 (the default) or a page size in range, and a
// multiple of the model's index_kpool (checked with the model).
func TestKVPageTokens(t *testing.T) {
	c, err := load(t, "")
	require.NoError(t, err)
	require.Zero(t, c.Runtime.KVPageTokens)
	_, err = load(t, "runtime: {kv_page_tokens: -4}\n")
	require.ErrorContains(t, err, "runtime.kv_page_tokens (")
	require.ErrorContains(t, err, "must be in [0, 1048576] (0: 64), got -4")
	_, err = load(t, "runtime: {kv_page_tokens: 2000000}\n")
	require.ErrorContains(t, err, "runtime.kv_page_tokens (")
	m := &model.Config{NumHiddenLayers: 4, IndexKPool: 4}
	c, err = load(t, "runtime: {kv_page_tokens: 6}\n")
	require.NoError(t, err)
	err = c.CheckModel(m)
	require.ErrorContains(t, err, "runtime.kv_page_tokens (")
	require.ErrorContains(t, err, "must be a multiple of the model's index_kpool (4): a page holds whole pools, got 6")
	c, err = load(t, "runtime: {kv_page_tokens: 16}\n")
	require.NoError(t, err)
	require.NoError(t, c.CheckModel(m))
	require.Equal(t, 16, c.Runtime.KVPageTokens)
}

// runtime.kv_dtype: auto (the default), fp32, fp8 on the cpu device, or
// bf16 on the cuda device; anything else refused naming the key.
func TestKVDType(t *testing.T) {
	c, err := load(t, "")
	require.NoError(t, err)
	require.Equal(t, "auto", c.Runtime.KVDType)
	_, err = load(t, "runtime: {kv_dtype: fp16}\n")
	require.ErrorContains(t, err, "runtime.kv_dtype (")
	require.ErrorContains(t, err, `must be auto, fp32, bf16 or fp8, got "fp16"`)
	c, err = load(t, "device: cpu\nruntime: {kv_dtype: fp8}\n")
	require.NoError(t, err)
	require.Equal(t, "fp8", c.Runtime.KVDType)
	_, err = load(t, "device: cuda\nruntime: {kv_dtype: fp8}\n")
	require.ErrorContains(t, err, "runtime.kv_dtype (")
	require.ErrorContains(t, err, "fp8 KV is implemented on the cpu device only for now")
	_, err = load(t, "runtime: {kv_dtype: bf16}\n")
	require.ErrorContains(t, err, "runtime.kv_dtype (")
	require.ErrorContains(t, err, `bf16 latents are implemented on the cuda device only (device "cpu" holds fp32: auto or fp32)`)
	c, err = load(t, "device: cuda\nruntime: {kv_dtype: bf16}\n")
	require.NoError(t, err)
	require.Equal(t, "bf16", c.Runtime.KVDType)
	_, err = load(t, "runtime: {kv_dtype: fp32}\n")
	require.NoError(t, err)
}
