package tests

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/glmflash/glmflash/core/attrib"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/model/chat"
	"github.com/glmflash/glmflash/model/tokenizer"
	"github.com/stretchr/testify/require"
)

// Every configuration file glmflash reads (the engine and serving file, a
// study) goes through one loader and decodes strictly: a value of the wrong
// type is an error naming the key, never reinterpreted (true is not 1, 2.7
// is not 2, 30 is not 30 ns).
func TestEveryConfigFileDecodesStrictly(t *testing.T) {
	serveBase := "model: {preset: small}\n"
	engineBase := "passes: []\n"
	studyBase := "name: s\nmodel: {preset: tiny}\narms: {baseline: true}\nworkloads:\n  - {name: w, input_len: 4, output_len: 2, requests: 2, concurrency: [1], seed: 1}\n"
	loaders := map[string]func(t *testing.T, src string) error{
		"serve": func(t *testing.T, src string) error {
			p := filepath.Join(t.TempDir(), "serve.yaml")
			require.NoError(t, os.WriteFile(p, []byte(src), 0o644))
			_, err := config.Load(config.Options{Files: []string{p}, Environ: []string{}})
			return err
		},
		"engine": func(t *testing.T, src string) error {
			p := filepath.Join(t.TempDir(), "engine.yaml")
			require.NoError(t, os.WriteFile(p, []byte(src), 0o644))
			_, err := config.Load(config.Options{Files: []string{p}, Environ: []string{}})
			return err
		},
		"study": func(t *testing.T, src string) error {
			p := filepath.Join(t.TempDir(), "study.yaml")
			require.NoError(t, os.WriteFile(p, []byte(src), 0o644))
			_, err := attrib.Load(p, func(string) bool { return true })
			return err
		},
	}
	cases := []struct {
		file, name, src, want string
	}{
		{"serve", "bool as int", serveBase + "runtime: {slots: true}\n", "slots"},
		{"serve", "float as int", serveBase + "runtime: {slots: 2.7}\n", "2.7 is not an integer"},
		{"serve", "duration without unit", serveBase + "server: {drain_timeout: 30}\n", "has no unit"},
		{"serve", "int as string", serveBase + "server: {grpc_addr: 5}\n", "grpc_addr"},
		{"serve", "int as bool", "model: {preset: small, fp8: 1}\n", "fp8"},
		{"serve", "int overflow", serveBase + "runtime: {slots: 99999999999999999999}\n", "slots"},
		{"engine", "bool as int", engineBase + "parallel: {attention_tp_size: true}\n", "attention_tp_size"},
		{"engine", "float as int", engineBase + "parallel: {attention_tp_size: 1.5}\n", "1.5 is not an integer"},
		{"engine", "float as timeout", engineBase + "plugins: {timeout_ms: 2.5}\n", "timeout_ms"},
		{"engine", "string as bool", engineBase + "plugins: {allow_unverified: yes please}\n", "allow_unverified"},
		{"engine", "float in int list", engineBase + "debug: {capture_hidden: [1.5]}\n", "capture_hidden"},
		{"study", "float as int", strings.Replace(studyBase, "requests: 2", "requests: 2.5", 1), "2.5 is not an integer"},
		{"study", "bool as int", strings.Replace(studyBase, "input_len: 4", "input_len: true", 1), "input_len"},
		{"study", "float concurrency", strings.Replace(studyBase, "concurrency: [1]", "concurrency: [1.9]", 1), "concurrency"},
		{"study", "bool as int (repetitions)", studyBase + "repetitions: true\n", "repetitions"},
	}
	require.NoError(t, loaders["serve"](t, serveBase))
	require.NoError(t, loaders["engine"](t, engineBase))
	require.NoError(t, loaders["study"](t, studyBase))
	for _, c := range cases {
		t.Run(c.file+"/"+c.name, func(t *testing.T) {
			err := loaders[c.file](t, c.src)
			require.Error(t, err)
			require.Contains(t, err.Error(), c.want)
		})
	}
	// environment variables are strings: they are parsed, strictly
	p := filepath.Join(t.TempDir(), "serve.yaml")
	require.NoError(t, os.WriteFile(p, []byte(serveBase), 0o644))
	load := func(env ...string) (*config.Config, error) {
		return config.Load(config.Options{Files: []string{p}, Environ: env})
	}
	c, err := load("GLMFLASH_RUNTIME__SLOTS=3", "GLMFLASH_SERVER__DRAIN_TIMEOUT=1m")
	require.NoError(t, err)
	require.Equal(t, 3, c.Runtime.Slots)
	_, err = load("GLMFLASH_RUNTIME__SLOTS=2.7")
	require.ErrorContains(t, err, "runtime.slots (environment variable GLMFLASH_RUNTIME__SLOTS)")
	_, err = load("GLMFLASH_SERVER__DRAIN_TIMEOUT=30")
	require.ErrorContains(t, err, "drain_timeout")
	_, err = load("GLMFLASH_PARALLEL__ATTENTION_TP_SIZE=2.0")
	require.ErrorContains(t, err, "attention_tp_size")
	ec, err := load("GLMFLASH_PARALLEL__TP_SIZE=2")
	require.NoError(t, err)
	require.Equal(t, 2, ec.Parallel.TPSize)
	require.Equal(t, 2, ec.Parallel.AttentionTPSize, "attention TP defaults to TP")
}

// A configuration file that is not a regular file of bounded size (a link
// to /dev/zero, a FIFO) is refused at once, by every loader.
func TestConfigFilesMustBeRegular(t *testing.T) {
	d := t.TempDir()
	zero := filepath.Join(d, "zero.yaml")
	require.NoError(t, os.Symlink("/dev/zero", zero))
	_, err := config.Load(config.Options{Files: []string{zero}})
	require.ErrorContains(t, err, "not a regular file")
	_, err = attrib.Load(zero, nil)
	require.ErrorContains(t, err, "not a regular file")

	// A checkpoint's text files too: tokenizer.json, tokenizer_config.json.
	ck := t.TempDir()
	require.NoError(t, os.Symlink("/dev/zero", filepath.Join(ck, "tokenizer.json")))
	require.NoError(t, syscall.Mkfifo(filepath.Join(ck, "tokenizer_config.json"), 0o644))
	_, err = tokenizer.Load(ck)
	require.ErrorContains(t, err, "not a regular file")
	_, err = chat.Load(ck)
	require.ErrorContains(t, err, "not a regular file (a FIFO)")
}
