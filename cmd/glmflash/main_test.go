package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/model/tokenizer"
	"github.com/stretchr/testify/require"
)

// runCLI runs the command in process and returns its stdout and error.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	root.SetArgs(append([]string{"--log-level", "warn"}, args...))
	old := os.Stdout
	r, w, err := os.Pipe()
	require.NoError(t, err)
	os.Stdout = w
	done := make(chan string)
	go func() {
		var b bytes.Buffer
		_, _ = io.Copy(&b, r) // until the pipe closes; a read error leaves what came
		done <- b.String()
	}()
	err = root.Execute()
	w.Close()
	os.Stdout = old
	return <-done, err
}

const fixture = "../../testdata/glm5next-tiny-a"

func TestEvalPassesOnFixture(t *testing.T) {
	out, err := runCLI(t, "eval", "--model", fixture+"/checkpoint", "--reference", fixture+"/reference.safetensors", "--tol", "1e-4")
	require.NoError(t, err)
	require.Contains(t, out, "all 7 cases within")
	require.Contains(t, out, "extend.1")
}

func TestEvalFailsWhenToleranceIsTooTight(t *testing.T) {
	_, err := runCLI(t, "eval", "--model", fixture+"/checkpoint", "--reference", fixture+"/reference.safetensors", "--tol", "1e-9")
	require.ErrorContains(t, err, "exceed --tol")
}

// eval --precision bf16 on the cpu runs the GEMMs on bf16 activations:
// the figures differ from the fp32 reference (the bf16 path really ran) but
// stay finite, and they are reported, not gated.
func TestEvalPrecisionBF16OnCPU(t *testing.T) {
	out, err := runCLI(t, "eval", "--model", fixture+"/checkpoint", "--reference", fixture+"/reference.safetensors", "--precision", "bf16")
	require.NoError(t, err, "bf16 figures are reported, not gated")
	t.Log("\n" + out)
	require.Contains(t, out, "reported")
	i := strings.Index(out, "max |Δlogit| ")
	require.GreaterOrEqual(t, i, 0, out)
	var d float64
	var cases, differ, rows int
	_, err = fmt.Sscanf(out[i:], "max |Δlogit| %g over %d cases, %d of %d greedy argmaxes differ", &d, &cases, &differ, &rows)
	require.NoError(t, err, out)
	require.Greater(t, d, 1e-4, "bf16 activations must move the logits")
	require.False(t, math.IsInf(d, 0) || math.IsNaN(d), "max |Δlogit| %v", d)
	require.Equal(t, 7, cases)
	require.Less(t, differ, rows, "greedy agreement is reported and not nil")
}

// An MTP reference (the MTP fixture) runs the trunk and the MTP layer: the
// table has the MTP columns, and a tolerance too tight fails naming them.
func TestEvalRunsMTPReference(t *testing.T) {
	const mtp = "../../testdata/glm5next-tiny-mtp"
	out, err := runCLI(t, "eval", "--model", mtp+"/checkpoint", "--reference", mtp+"/reference.safetensors", "--tol", "1e-4")
	require.NoError(t, err)
	require.Contains(t, out, "mtp logits")
	require.Contains(t, out, "all 3 MTP cases within")
	_, err = runCLI(t, "eval", "--model", mtp+"/checkpoint", "--reference", mtp+"/reference.safetensors", "--tol", "1e-9")
	require.ErrorContains(t, err, "MTP cases exceed --tol")
}

func TestGenerateIsDeterministic(t *testing.T) {
	args := []string{"generate", "--model", fixture + "/checkpoint", "--prompt-ids", "5,6,7", "--max-tokens", "6", "--temperature", "0.8", "--sample-seed", "3"}
	a, err := runCLI(t, args...)
	require.NoError(t, err)
	b, err := runCLI(t, args...)
	require.NoError(t, err)
	line := func(s string) string {
		for _, l := range strings.Split(s, "\n") {
			if strings.HasPrefix(l, "output") {
				return l
			}
		}
		return ""
	}
	require.NotEmpty(t, line(a))
	require.Equal(t, line(a), line(b))
}

func TestGraphDump(t *testing.T) {
	out, err := runCLI(t, "graph", "--model", fixture+"/checkpoint", "--mode", "decode", "--format", "summary")
	require.NoError(t, err)
	require.Contains(t, out, "kda_attn               6")
}

// copyDir copies a checkpoint so a test can damage it.
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	entries, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644))
	}
	return dst
}

// Malformed checkpoints and inputs give an error naming the culprit, never a panic.
func TestMalformedInputsNameTheProblem(t *testing.T) {
	ref := fixture + "/reference.safetensors"
	st := func(dir string) string { return filepath.Join(dir, "model.safetensors") }
	cases := []struct {
		name   string
		damage func(dir string)
		want   string
	}{
		{"truncated safetensors", func(d string) {
			b, _ := os.ReadFile(st(d))
			require.NoError(t, os.WriteFile(st(d), b[:len(b)/2], 0o644))
		}, "model.safetensors"},
		{"bad header json", func(d string) {
			b, _ := os.ReadFile(st(d))
			copy(b[8:], []byte("{nope"))
			require.NoError(t, os.WriteFile(st(d), b, 0o644))
		}, "model.safetensors"},
		{"unknown dtype", func(d string) {
			b, _ := os.ReadFile(st(d))
			n := binary.LittleEndian.Uint64(b)
			h := strings.Replace(string(b[8:8+n]), `"BF16"`, `"BQ16"`, 1)
			copy(b[8:], h)
			require.NoError(t, os.WriteFile(st(d), b, 0o644))
		}, "BQ16"},
		{"wrong tensor shape", func(d string) {
			b, _ := os.ReadFile(st(d))
			n := binary.LittleEndian.Uint64(b)
			h := strings.Replace(string(b[8:8+n]), `"shape":[256,64]`, `"shape":[64,256]`, 1)
			copy(b[8:], h)
			require.NoError(t, os.WriteFile(st(d), b, 0o644))
		}, "shape"},
		{"inconsistent config", func(d string) {
			b, _ := os.ReadFile(filepath.Join(d, "config.json"))
			require.NoError(t, os.WriteFile(filepath.Join(d, "config.json"), []byte(strings.Replace(string(b), `"index_kpool": 4`, `"index_kpool": 3`, 1)), 0o644))
		}, "index_kpool"},
		{"missing config", func(d string) { os.Remove(filepath.Join(d, "config.json")) }, "config.json"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := copyDir(t, fixture+"/checkpoint")
			c.damage(d)
			_, err := runCLI(t, "eval", "--model", d, "--reference", ref)
			require.Error(t, err)
			require.Contains(t, err.Error(), c.want)
		})
	}
	_, err := runCLI(t, "generate", "--model", fixture+"/checkpoint", "--prompt-ids", "1,999")
	require.ErrorContains(t, err, "--prompt-ids")
	_, err = runCLI(t, "generate", "--model", fixture+"/checkpoint", "--prompt-ids", "1,x")
	require.ErrorContains(t, err, "--prompt-ids")
	_, err = runCLI(t, "generate", "--model", fixture+"/checkpoint", "--prompt-ids", "1", "--top-p", "0")
	require.ErrorContains(t, err, "top_p")
	_, err = runCLI(t, "eval", "--model", fixture+"/checkpoint", "--reference", "/nonexistent/reference.safetensors")
	require.ErrorContains(t, err, "reference")
}

func TestMissingTensorIsNamed(t *testing.T) {
	d := t.TempDir()
	_, err := runCLI(t, "init-random", "--preset", "tiny", "--out", d)
	require.NoError(t, err)
	// rewrite the checkpoint without one tensor by renaming it in the header
	p := filepath.Join(d, "model.safetensors")
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	n := binary.LittleEndian.Uint64(b)
	h := strings.Replace(string(b[8:8+n]), "layers.3.self_attn.kv_b_proj.weight", "layers.3.self_attn.kv_b_proj.wXight", 1)
	copy(b[8:], h)
	require.NoError(t, os.WriteFile(p, b, 0o644))
	_, err = runCLI(t, "generate", "--model", d, "--prompt-ids", "1,2")
	require.ErrorContains(t, err, "layers.3.self_attn.kv_b_proj.weight")
}

func TestPassesListAndExplain(t *testing.T) {
	out, err := runCLI(t, "passes", "list")
	require.NoError(t, err)
	for _, p := range []string{"kda-projection-fusion", "mhc-post-pre-fusion", "dsa-pooled-metadata", "host-length-reuse", "prefill-autotune", "max_tokens: int = 0"} {
		require.Contains(t, out, p)
	}
	out, err = runCLI(t, "passes", "explain", "--model", fixture+"/checkpoint", "--config", "../../configs/engine.yaml", "--mode", "decode")
	require.NoError(t, err)
	require.Contains(t, out, "kda-projection-fusion  yes        6")
	require.Contains(t, out, "terminal layer")
	out, err = runCLI(t, "passes", "explain", "--model", fixture+"/checkpoint", "--config", "../../configs/presets/baseline.yaml", "--dump", "after", "--format", "json")
	require.NoError(t, err)
	require.Contains(t, out, `"requested": false`)
	d := t.TempDir()
	bad := filepath.Join(d, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("passes:\n  - name: kda-projection-fusion\n    options: {frm: full}\n"), 0o644))
	_, err = runCLI(t, "passes", "explain", "--model", fixture+"/checkpoint", "--config", bad)
	require.ErrorContains(t, err, `unknown option "frm"`)
	require.NoError(t, os.WriteFile(bad, []byte("passes:\n  - name: kda-projection-fusoin\n"), 0o644))
	_, err = runCLI(t, "eval", "--model", fixture+"/checkpoint", "--reference", fixture+"/reference.safetensors", "--config", bad)
	require.ErrorContains(t, err, `unknown pass "kda-projection-fusoin"`)
	out, err = runCLI(t, "passes", "explain", "--model", fixture+"/checkpoint", "--dump", "before")
	require.NoError(t, err)
	require.Contains(t, out, "=== kda-projection-fusion: graph before")
}

func TestEvalPassesWithEveryPreset(t *testing.T) {
	for _, c := range []string{"../../configs/presets/baseline.yaml", "../../configs/presets/all.yaml", "../../configs/engine.yaml"} {
		// keep tuning tables out of the source tree
		b, err := os.ReadFile(c)
		require.NoError(t, err)
		tdir := t.TempDir()
		c = filepath.Join(tdir, filepath.Base(c))
		require.NoError(t, os.WriteFile(c, []byte(strings.ReplaceAll(string(b), "table_dir: ../tuning", "table_dir: "+tdir)), 0o644))
		out, err := runCLI(t, "eval", "--config", c, "--model", fixture+"/checkpoint", "--reference", fixture+"/reference.safetensors", "--tol", "1e-4")
		require.NoError(t, err, c)
		require.Contains(t, out, "all 7 cases within")
	}
}

// A serving-level study starts one real `glmflash serve` per arm and drives
// it over gRPC; parity and fired passes come back through the API.
func TestServingLevelStudy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and starts servers")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "glmflash")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, string(out))
	b, err := os.ReadFile(bin)
	require.NoError(t, err)
	good := fmt.Sprintf("%x", sha256.Sum256(b))
	study := filepath.Join(dir, "s.yaml")
	write := func(sum string) {
		require.NoError(t, os.WriteFile(study, []byte(`name: serving-smoke
model: {dir: `+absFixture(t)+`/checkpoint}
level: serving
serving: {binary: `+bin+`, binary_sha256: "`+sum+`"}
arms: {baseline: true, all: true}
workloads:
  - {name: chat, input_len: 10, output_len: 5, requests: 4, concurrency: [1, 2], seed: 3}
repetitions: 1
warmup: 0
`), 0o644))
	}
	// another checksum: refused before any arm starts, nothing written
	write(strings.Repeat("0", 64))
	_, err = runCLI(t, "attribute", "--study", study, "--out", filepath.Join(dir, "bad"), "--quiet")
	require.ErrorContains(t, err, "serving.binary: checksum verification failed: SHA-256 of "+bin+" is "+good)
	require.NoDirExists(t, filepath.Join(dir, "bad"))
	// its checksum: the arms' servers run the verified copy
	write(good)
	res, err := runCLI(t, "attribute", "--study", study, "--out", filepath.Join(dir, "out"), "--quiet")
	require.NoError(t, err)
	require.Contains(t, res, "0 mismatches")
	require.Contains(t, res, "kda-projection-fusion")
	b, err = os.ReadFile(filepath.Join(dir, "out", "results.jsonl"))
	require.NoError(t, err)
	require.Equal(t, 6, strings.Count(string(b), "\n")) // 3 arms (baseline, A/A, all) × 2 cells × 1 round
	require.Contains(t, string(b), `"level":"serving"`)
}

func TestStudyErrorsBeforeRunning(t *testing.T) {
	d := t.TempDir()
	p := filepath.Join(d, "bad.yaml")
	for src, want := range map[string]string{
		"name: x\nmodel: {preset: tiny}\narms: {baseline: true}\nworkloads: [{name: w, input_len: 2, output_len: 2, requests: 1, concurrency: [1], sed: 1}]\n":                                                           "sed",
		"name: x\nmodel: {preset: tiny}\narms: {}\nworkloads: [{name: w, input_len: 2, output_len: 2, requests: 1, concurrency: [1]}]\n":                                                                                 "arms: the arm list is empty",
		"name: x\nmodel: {preset: tiny}\nlevel: serving\nserving: {binary: /bin/true}\narms: {baseline: true}\nworkloads: [{name: w, input_len: 2, output_len: 2, requests: 1, concurrency: [1]}]\n":                     "serving.binary_sha256 is required with serving.binary (/bin/true)",
		"name: x\nmodel: {preset: tiny}\nlevel: serving\nserving: {binary: /bin/true, binary_sha256: abc}\narms: {baseline: true}\nworkloads: [{name: w, input_len: 2, output_len: 2, requests: 1, concurrency: [1]}]\n": `serving.binary_sha256: "abc" is not a hex SHA-256`,
		"name: x\nmodel: {preset: tiny}\npasses: [{name: nope}]\narms: {baseline: true}\nworkloads: [{name: w, input_len: 2, output_len: 2, requests: 1, concurrency: [1]}]\n":                                           `passes[0].name: unknown pass "nope"`,
	} {
		require.NoError(t, os.WriteFile(p, []byte(src), 0o644))
		_, err := runCLI(t, "attribute", "--study", p)
		require.ErrorContains(t, err, want)
		require.ErrorContains(t, err, "bad.yaml")
	}
}

// --prompt encodes text with the checkpoint's tokenizer and prints the
// output as text: the decoding of the ids it reports.
func TestGenerateTextPrompt(t *testing.T) {
	cache := t.TempDir()
	out, err := runCLI(t, "generate", "--preset", "tiny", "--cache-dir", cache, "--prompt", "Hello, world", "--max-tokens", "8")
	require.NoError(t, err)
	lines := strings.Split(out, "\n")
	require.GreaterOrEqual(t, len(lines), 3)
	require.Contains(t, out, "prompt   12 tokens", "one token per byte in the tiny preset's tokenizer")
	tk, err := tokenizer.Load(filepath.Join(cache, "tiny-seed1"))
	require.NoError(t, err)
	var idsLine string
	for _, l := range lines {
		if strings.HasPrefix(l, "output") {
			idsLine = strings.TrimSpace(strings.TrimPrefix(l, "output"))
		}
	}
	ids, err := parseIDs("output", idsLine)
	require.NoError(t, err)
	require.Len(t, ids, 8)
	require.True(t, strings.HasPrefix(out, tk.Decode(ids, true)+"\n"), "the text comes first: %q", out)

	_, err = runCLI(t, "generate", "--preset", "tiny", "--cache-dir", cache, "--chat", "hi")
	require.ErrorContains(t, err, "no chat template")
	_, err = runCLI(t, "generate", "--preset", "tiny", "--cache-dir", cache, "--chat", "hi", "--prompt", "x")
	require.ErrorContains(t, err, "exactly one of")
	_, err = runCLI(t, "generate", "--model", fixture+"/checkpoint", "--prompt", "x")
	require.ErrorContains(t, err, "no tokenizer.json")
}

// Without a GPU, --device cuda fails at once and says what is missing.
func TestDeviceCUDAWithoutGPUSaysWhatIsMissing(t *testing.T) {
	if _, err := os.Stat("/dev/nvidia0"); err == nil {
		t.Skip("this machine has a GPU")
	}
	t.Setenv("GLMFLASH_CUDA_EMULATOR", "")
	for _, args := range [][]string{
		{"eval", "--device", "cuda", "--model", fixture + "/checkpoint", "--reference", fixture + "/reference.safetensors"},
		{"generate", "--device", "cuda", "--model", fixture + "/checkpoint", "--prompt-ids", "1,2"},
		{"passes", "explain", "--device", "cuda", "--model", fixture + "/checkpoint"},
	} {
		root := newRoot()
		root.SetArgs(args)
		var out strings.Builder
		root.SetOut(&out)
		err := root.Execute()
		require.Error(t, err, "%v", args)
		require.Regexp(t, "no NVIDIA driver|no usable GPU|no GPU|no cuBLAS", err.Error(), "%v", args)
	}
}

// bench reports the MTP layer: measured draft steps when the checkpoint has
// it (the tiny-mtp preset), "none" when the model declares none.
func TestBenchReportsMTP(t *testing.T) {
	dir := t.TempDir()
	js := filepath.Join(dir, "bench.json")
	out, err := runCLI(t, "bench", "--preset", "tiny-mtp", "--cache-dir", dir, "--prompt", "4", "--decode-steps", "2", "--reps", "1", "--warmup", "0", "--batch", "1,2", "--json", js)
	require.NoError(t, err)
	require.Contains(t, out, "mtp      1 layer(s) from layer 8, weights present: draft steps measured")
	require.Contains(t, out, "mtp draft batch 1")
	require.Contains(t, out, "mtp draft batch 2")
	b, err := os.ReadFile(js)
	require.NoError(t, err)
	require.Contains(t, string(b), `"runnable": true`)

	out, err = runCLI(t, "bench", "--model", fixture+"/checkpoint", "--prompt", "4", "--decode-steps", "1", "--reps", "1", "--warmup", "0", "--batch", "1")
	require.NoError(t, err)
	require.Contains(t, out, "mtp      none (num_nextn_predict_layers 0)")
	require.NotContains(t, out, "mtp draft")
}

// --config is repeatable on every command: later files override earlier
// ones, over the built-in defaults (a serving file and an engine preset,
// say).
func TestConfigFilesLayer(t *testing.T) {
	d := t.TempDir()
	a := filepath.Join(d, "a.yaml")
	require.NoError(t, os.WriteFile(a, []byte("passes:\n  - name: dsa-pooled-metadata\nruntime: {slots: 3}\n"), 0o644))
	out, err := runCLI(t, "passes", "explain", "--model", fixture+"/checkpoint", "--config", a)
	require.NoError(t, err)
	require.Contains(t, out, "dsa-pooled-metadata    yes")
	require.Contains(t, out, "kda-projection-fusion  no")
	out, err = runCLI(t, "passes", "explain", "--model", fixture+"/checkpoint", "--config", a, "--config", "../../configs/engine.yaml")
	require.NoError(t, err)
	require.Contains(t, out, "kda-projection-fusion  yes", "the second file's passes replace the first's")
	bad := filepath.Join(d, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("passes:\n  - name: no-such-pass\n"), 0o644))
	_, err = runCLI(t, "serve", "--config", a, "--config", bad, "--model", fixture+"/checkpoint", "--port", "0", "--http-port", "0")
	require.ErrorContains(t, err, `unknown pass "no-such-pass"`)
}

// absFixture is the fixture's absolute path (for files written elsewhere:
// relative paths in a configuration or study file are relative to it).
func absFixture(t *testing.T) string {
	t.Helper()
	abs, err := filepath.Abs(fixture)
	require.NoError(t, err)
	return abs
}

// --tp N runs the engine on N tensor-parallel ranks through the scheduler:
// greedy and seeded-sampling outputs equal one device's; a model the ranks
// cannot split, and attention TP below TP, are refused with the key named.
func TestGenerateTensorParallel(t *testing.T) {
	line := func(s string) string {
		for _, l := range strings.Split(s, "\n") {
			if strings.HasPrefix(l, "output") {
				return l
			}
		}
		return ""
	}
	for _, extra := range [][]string{nil, {"--temperature", "0.8", "--sample-seed", "3"}} {
		args := append([]string{"generate", "--model", fixture + "/checkpoint", "--prompt-ids", "5,6,7", "--max-tokens", "6"}, extra...)
		one, err := runCLI(t, args...)
		require.NoError(t, err)
		require.NotEmpty(t, line(one))
		for _, tp := range []string{"2", "4"} {
			got, err := runCLI(t, append(args, "--tp", tp)...)
			require.NoError(t, err)
			require.Equal(t, line(one), line(got), "--tp %s %v", tp, extra)
		}
	}
	_, err := runCLI(t, "generate", "--model", "../../testdata/glm5next-tiny-b/checkpoint", "--prompt-ids", "5,6", "--max-tokens", "2", "--tp", "2")
	require.ErrorContains(t, err, "parallel.tp_size 2 does not divide the model's linear_attn_config.num_heads (KDA heads), 3")
	cfg := filepath.Join(t.TempDir(), "dp.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("parallel: {attention_tp_size: 2}\n"), 0o644))
	_, err = runCLI(t, "generate", "--config", cfg, "--model", fixture+"/checkpoint", "--prompt-ids", "5,6", "--max-tokens", "2", "--tp", "4")
	require.ErrorContains(t, err, "parallel.attention_tp_size")
	require.ErrorContains(t, err, "attention data parallelism")
}
