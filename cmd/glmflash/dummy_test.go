package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/glmflash/glmflash/internal/syncbuf"
	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// outputLine is generate's "output" line (the token ids).
func outputLine(t *testing.T, out string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "output") {
			return l
		}
	}
	t.Fatalf("no output line in %q", out)
	return ""
}

// generate --load-format dummy over a preset with --set gives the tokens of
// the same preset, overrides and seed written to the cache and loaded
// normally, writing nothing itself; a config.json directory (no weights)
// serves too, with the layer count set, and without a tokenizer takes
// token ids only.
func TestGenerateDummy(t *testing.T) {
	cache, fixtureAbs := t.TempDir(), absFixture(t)
	args := []string{"generate", "--preset", "tiny", "--set", "num_hidden_layers=4", "--seed", "2", "--prompt-ids", "5,6,7", "--max-tokens", "6"}
	written, err := runCLI(t, append(args, "--cache-dir", cache)...)
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(cache, "tiny-seed2-num_hidden_layers4", "model.safetensors"))
	require.NoError(t, err, "the auto load wrote the preset")
	empty := t.TempDir()
	t.Chdir(empty) // nothing may be written here (the default cache_dir is relative)
	dummy, err := runCLI(t, append(args, "--load-format", "dummy")...)
	require.NoError(t, err)
	require.Equal(t, outputLine(t, written), outputLine(t, dummy))
	ents, err := os.ReadDir(empty)
	require.NoError(t, err)
	require.Empty(t, ents, "dummy weights write no checkpoint")

	// the preset's tokenizer comes along, in memory
	out, err := runCLI(t, "generate", "--preset", "tiny", "--load-format", "dummy", "--prompt", "Hello", "--max-tokens", "2")
	require.NoError(t, err)
	require.Contains(t, out, "prompt   5 tokens")

	// a directory holding only config.json: its config, layers set
	dir := t.TempDir()
	b, err := os.ReadFile(filepath.Join(fixtureAbs, "checkpoint", "config.json"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644))
	out, err = runCLI(t, "generate", "--model", dir, "--load-format", "dummy", "--set", "num_hidden_layers=12", "--prompt-ids", "1,2", "--max-tokens", "2")
	require.NoError(t, err)
	require.Contains(t, out, "output")
	_, err = runCLI(t, "generate", "--model", dir, "--load-format", "dummy", "--prompt", "x", "--max-tokens", "2")
	require.ErrorContains(t, err, "no tokenizer.json")
}

// What dummy loading refuses, each naming the key or flag.
func TestDummyRefusals(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", absFixture(t) + "/checkpoint", "--load-format", "dummy"}, "model.load_format: dummy makes random weights, but model.dir"},
		{[]string{"--model", dir, "--load-format", "dummy"}, "model.load_format: dummy takes the config of model.dir"},
		{[]string{"--preset", "tiny", "--load-format", "random"}, `model.load_format`},
		{[]string{"--preset", "tiny", "--load-format", "dummy", "--cache-dir", dir}, "--cache-dir: model.load_format dummy writes no checkpoint"},
		{[]string{"--preset", "tiny", "--load-format", "dummy", "--set", "num_hidden_layers"}, "want FIELD=VALUE"},
		{[]string{"--preset", "tiny", "--load-format", "dummy", "--set", "num_hidden_layers=x"}, "is not a JSON value"},
		{[]string{"--preset", "tiny", "--load-format", "dummy", "--set", "no_such_field=1"}, "model.set: randckpt: --set no_such_field: not a text_config field"},
		{[]string{"--model", dir, "--set", "num_hidden_layers=2"}, "model.set"},
		{[]string{"--preset", "", "--load-format", "dummy"}, "model.load_format"},
	} {
		_, err := runCLI(t, append([]string{"generate", "--prompt-ids", "1", "--max-tokens", "1"}, c.args...)...)
		require.ErrorContains(t, err, c.want, "%v", c.args)
	}
	t.Setenv("GLMFLASH_MODEL__LOAD_FORMAT", "dummy") // eval has no --load-format: the key
	_, err := runCLI(t, "eval", "--model", absFixture(t)+"/checkpoint", "--reference", absFixture(t)+"/reference.safetensors")
	require.ErrorContains(t, err, "model.load_format dummy weights are random")
}

// bench says the weights are dummy, in its report and its JSON, and
// measures them like a checkpoint's (memory by category).
func TestBenchDummy(t *testing.T) {
	js := filepath.Join(t.TempDir(), "bench.json")
	out, err := runCLI(t, "bench", "--preset", "tiny", "--load-format", "dummy", "--fp8", "--set", "num_hidden_layers=5", "--prompt", "4", "--decode-steps", "1", "--reps", "1", "--warmup", "0", "--batch", "1", "--json", js)
	require.NoError(t, err)
	require.Contains(t, out, "model    dummy weights (random, seed 1, model.load_format dummy: no checkpoint) of preset tiny (FP8 layout) with num_hidden_layers=5 (hidden 64, 5 layers")
	require.Contains(t, out, "weights_fp8")
	require.Regexp(t, `checkpoint [0-9.]+ MiB`, out)
	b, err := os.ReadFile(js)
	require.NoError(t, err)
	require.Contains(t, string(b), `"dummy_weights": true`)
}

// serve --load-format dummy serves, and GetModelInfo's source says the
// weights are dummy.
func TestServeDummy(t *testing.T) {
	root := newRoot()
	out := &syncbuf.Buffer{}
	root.SetOut(out)
	root.SetArgs([]string{"--log-level", "warn", "serve", "--preset", "tiny", "--load-format", "dummy", "--set", "num_hidden_layers=20", "--seed", "4", "--fp8", "--port", "0", "--http-port", "0"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("serve did not stop")
		}
	}()
	re := regexp.MustCompile(`serving glmflash.v1.GLMFlash on (127\.0\.0\.1:\d+)`)
	var addr string
	require.Eventually(t, func() bool {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	}, 60*time.Second, 10*time.Millisecond)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	mi, err := pb.NewGLMFlashClient(conn).GetModelInfo(context.Background(), &pb.GetModelInfoRequest{})
	require.NoError(t, err)
	require.Equal(t, "dummy weights (random, seed 4, model.load_format dummy: no checkpoint) of preset tiny (FP8 layout) with num_hidden_layers=20", mi.GetModel().GetSource())
	require.Equal(t, "fp8", mi.GetModel().GetQuantization())
	require.EqualValues(t, 20, mi.GetModel().GetNumLayers())
}

// --set adds to a file's model.set (a field given in both: the flag's).
func TestSetFlagOverFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "m.yaml")
	require.NoError(t, os.WriteFile(p, []byte("model: {preset: tiny, set: {n_routed_experts: 4, num_hidden_layers: 6}}\n"), 0o644))
	var mf modelFlags
	cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
	mf.addConfig(cmd)
	mf.add(cmd, true)
	require.NoError(t, cmd.ParseFlags([]string{"--config", p, "--set", "num_hidden_layers=3", "--set", "num_experts_per_tok=1"}))
	c, err := mf.config()
	require.NoError(t, err)
	require.Equal(t, map[string]any{"n_routed_experts": 4, "num_hidden_layers": 3.0, "num_experts_per_tok": 1.0}, c.Model.Set)
}

// A directory holding only an FP8 checkpoint's config.json (its
// quantization_config) and tokenizer: dummy weights in its FP8 layout,
// those init-random wrote for the same seed, so generate gives the
// checkpoint's tokens; the directory's tokenizer reads text.
func TestGenerateDummyFromConfigDir(t *testing.T) {
	full, cfgOnly := filepath.Join(t.TempDir(), "full"), t.TempDir()
	_, err := runCLI(t, "init-random", "--preset", "tiny", "--fp8", "--seed", "6", "--set", "num_hidden_layers=5", "--out", full)
	require.NoError(t, err)
	for _, f := range []string{"config.json", "tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(full, f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(cfgOnly, f), b, 0o644))
	}
	want, err := runCLI(t, "generate", "--model", full, "--prompt", "Hi there", "--max-tokens", "5")
	require.NoError(t, err)
	got, err := runCLI(t, "generate", "--model", cfgOnly, "--load-format", "dummy", "--seed", "6", "--prompt", "Hi there", "--max-tokens", "5")
	require.NoError(t, err)
	require.Equal(t, outputLine(t, want), outputLine(t, got))
	require.Contains(t, got, "prompt   8 tokens")
	other, err := runCLI(t, "generate", "--model", cfgOnly, "--load-format", "dummy", "--seed", "7", "--prompt", "Hi there", "--max-tokens", "5")
	require.NoError(t, err)
	require.NotEqual(t, outputLine(t, want), outputLine(t, other), "another seed, other weights")
}
