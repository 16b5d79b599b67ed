package serve

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func writeYAML(t *testing.T, s string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "serve.yaml")
	require.NoError(t, os.WriteFile(p, []byte(s), 0o644))
	return p
}

func TestShippedConfigLoads(t *testing.T) {
	c, err := LoadConfig("../../configs/serve.yaml", []string{})
	require.NoError(t, err)
	require.Equal(t, "small", c.Model.Preset)
	require.Equal(t, "127.0.0.1:50051", c.Server.GRPCAddr)
	require.Equal(t, "127.0.0.1:9090", c.Server.MetricsAddr)
	require.Equal(t, 30*time.Second, c.Server.DrainTimeout)
	require.Equal(t, 8, c.Runtime.Slots)
}

func TestConfigFileAndEnvironment(t *testing.T) {
	p := writeYAML(t, `
model: {dir: /models/x}
server: {grpc_addr: "127.0.0.1:7000", drain_timeout: 2s}
runtime: {max_running: 4, prefill_chunk: 32}
`)
	env := []string{
		"GLMFLASH_RUNTIME__MAX_RUNNING=6", // overrides the file
		"GLMFLASH_SERVER__METRICS_ADDR=",  // disables metrics
		"GLMFLASH_CACHE=/tmp/elsewhere",   // not configuration (no "__")
		"HOME=/root",
	}
	c, err := LoadConfig(p, env)
	require.NoError(t, err)
	require.Equal(t, "/models/x", c.Model.Dir)
	require.Equal(t, int64(1), c.Model.Seed, "default kept")
	require.Equal(t, "127.0.0.1:7000", c.Server.GRPCAddr)
	require.Equal(t, "", c.Server.MetricsAddr)
	require.Equal(t, 2*time.Second, c.Server.DrainTimeout)
	require.Equal(t, 6, c.Runtime.MaxRunning)
	require.Equal(t, 32, c.Runtime.PrefillChunk)
	require.Equal(t, 8, c.Runtime.Slots)
}

func TestConfigIsStrict(t *testing.T) {
	cases := map[string]struct{ yaml, env, want string }{
		"unknown key":       {yaml: "model: {preset: small}\nruntime: {max_runing: 3}\n", want: `unknown key "runtime.max_runing"`},
		"unknown section":   {yaml: "model: {preset: small}\nlogging: {level: debug}\n", want: `unknown key "logging.level"`},
		"section as scalar": {yaml: "model: small\n", want: `"model" must be a section`},
		"unknown env key":   {yaml: "model: {preset: small}\n", env: "GLMFLASH_SERVER__GRPC_ADR=x", want: `unknown key "server.grpc_adr" in environment variable GLMFLASH_SERVER__GRPC_ADR`},
		"wrong type":        {yaml: "model: {preset: small}\nruntime: {slots: many}\n", want: "slots"},
		"bad duration":      {yaml: "model: {preset: small}\nserver: {drain_timeout: soon}\n", want: "drain_timeout"},
		"two models":        {yaml: "model: {preset: small, dir: /x}\n", want: "mutually exclusive"},
		"bad slots":         {yaml: "model: {preset: small}\nruntime: {slots: 0}\n", want: "runtime.slots"},
		"negative drain":    {yaml: "model: {preset: small}\nserver: {drain_timeout: -1s}\n", want: "server.drain_timeout"},
		"not yaml":          {yaml: "model: [\n", want: "config"},
	}
	for name, c := range cases {
		var env []string
		if c.env != "" {
			env = []string{c.env}
		} else {
			env = []string{}
		}
		_, err := LoadConfig(writeYAML(t, c.yaml), env)
		require.ErrorContains(t, err, c.want, name)
	}
	_, err := LoadConfig(filepath.Join(t.TempDir(), "missing.yaml"), []string{})
	require.Error(t, err)
}

// The operator options decode from YAML and the environment, and their
// values are checked.
func TestOperatorOptions(t *testing.T) {
	p := writeYAML(t, `
model: {preset: small}
server:
  reflection: false
  expose_paths: true
  keepalive_time: 30s
  max_connection_age: 1h
  max_connection_age_grace: 30s
  max_response_bytes: 1048576
  tls: {cert_file: c.pem, key_file: k.pem}
  auth: {api_keys_file: keys.txt}
`)
	c, err := LoadConfig(p, []string{"GLMFLASH_SERVER__TLS__CLIENT_CA_FILE=ca.pem"})
	require.NoError(t, err)
	require.False(t, c.Server.Reflection)
	require.True(t, c.Server.ExposePaths)
	require.Equal(t, time.Hour, c.Server.MaxConnectionAge)
	require.Equal(t, "ca.pem", c.Server.TLS.ClientCAFile)
	require.Equal(t, filepath.Join(filepath.Dir(p), "keys.txt"), c.Server.Auth.APIKeysFile, "relative to the file")
	require.Equal(t, filepath.Join(filepath.Dir(p), "c.pem"), c.Server.TLS.CertFile)
	require.True(t, DefaultConfig().Server.Reflection)
	for y, want := range map[string]string{
		"server: {tls: {cert_file: c.pem}}":        "server.tls: cert_file and key_file are both required",
		"server: {keepalive_time: 0s}":             "server.keepalive_time",
		"server: {max_connection_age: -1s}":        "max_connection_age",
		"server: {max_response_bytes: 10}":         "server.max_response_bytes",
		"server: {auth: {api_key_file: keys.txt}}": `unknown key "server.auth.api_key_file"`,
	} {
		_, err := LoadConfig(writeYAML(t, "model: {preset: small}\n"+y+"\n"), []string{})
		require.ErrorContains(t, err, want, y)
	}
}

func TestBuiltInDefaultsAndRelativePaths(t *testing.T) {
	c, err := LoadConfig("", []string{})
	require.NoError(t, err)
	require.Equal(t, DefaultPreset, c.Model.Preset, "no model named: the built-in default")
	require.Equal(t, "127.0.0.1:8000", c.Server.HTTPAddr)
	require.Equal(t, "small", c.ServedName())

	p := writeYAML(t, "model: {dir: ckpt, cache_dir: ../cache, name: mine}\n")
	c, err = LoadConfig(p, []string{})
	require.NoError(t, err)
	require.Equal(t, filepath.Join(filepath.Dir(p), "ckpt"), c.Model.Dir, "relative to the file")
	require.Equal(t, filepath.Join(filepath.Dir(p), "../cache"), c.Model.CacheDir)
	require.Empty(t, c.Model.Preset)
	require.Equal(t, "mine", c.ServedName())

	c, err = LoadConfig(p, []string{"GLMFLASH_MODEL__DIR=rel/from/cwd"})
	require.NoError(t, err)
	require.Equal(t, "rel/from/cwd", c.Model.Dir, "the environment's paths are the user's, relative to the working directory")
}
