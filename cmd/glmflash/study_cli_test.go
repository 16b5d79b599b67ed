package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/config"
	"github.com/stretchr/testify/require"
)

// tinyStudy writes an engine-level study on the fixture; extra is appended.
func tinyStudy(t *testing.T, dir, extra string) string {
	t.Helper()
	p := filepath.Join(dir, "study.yaml")
	require.NoError(t, os.WriteFile(p, []byte(`name: flags
model: {dir: `+absFixture(t)+`/checkpoint}
arms: {baseline: true}
passes: [{name: host-length-reuse}]
workloads:
  - {name: w, input_len: 4, output_len: 2, requests: 2, concurrency: [1], seed: 1}
repetitions: 1
warmup: 0
`+extra), 0o644))
	return p
}

// runCLIStderr runs the command in process with stderr captured too.
func runCLIStderr(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	old := os.Stderr
	r, w, err := os.Pipe()
	require.NoError(t, err)
	os.Stderr = w
	done := make(chan string)
	go func() {
		var b bytes.Buffer
		_, _ = io.Copy(&b, r) // until the pipe closes; a read error leaves what came
		done <- b.String()
	}()
	out, err := runCLI(t, args...)
	w.Close()
	os.Stderr = old
	return out, <-done, err
}

func attributeOutProbe(d string) probe {
	return probe{check: func(t *testing.T, d, _ string, _ error) {
		out := filepath.Join(d, "out")
		require.NoError(t, os.MkdirAll(out, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(out, "contributions-add-one-in.png"), []byte("old"), 0o644))
		_, err := runCLI(t, "attribute", "--study", tinyStudy(t, d, ""), "--out", out, "--quiet")
		require.ErrorContains(t, err, "--out")
		b, _ := os.ReadFile(filepath.Join(out, "contributions-add-one-in.png"))
		require.Equal(t, "old", string(b), "an earlier run's files are left alone")
		_, err = runCLI(t, "attribute", "--study", tinyStudy(t, d, ""), "--out", filepath.Join(d, "fresh"), "--quiet")
		require.NoError(t, err)
		require.FileExists(t, filepath.Join(d, "fresh", "results.jsonl"))
	}}
}

func attributeQuietProbe(d string) probe {
	return probe{check: func(t *testing.T, d, _ string, _ error) {
		study := tinyStudy(t, d, "")
		_, stderr, err := runCLIStderr(t, "attribute", "--study", study, "--out", filepath.Join(d, "a"), "--log-level", "info")
		require.NoError(t, err)
		require.Contains(t, stderr, "progress")
		_, stderr, err = runCLIStderr(t, "attribute", "--study", study, "--out", filepath.Join(d, "b"), "--log-level", "info", "--quiet")
		require.NoError(t, err)
		require.NotContains(t, stderr, "progress")
	}}
}

// A study whose requests cannot run (input_len + output_len beyond the
// context) is refused before anything is measured or written, with a
// non-zero exit (an error), never "0 mismatches".
func TestStudyThatCannotRunIsRefusedFirst(t *testing.T) {
	d := t.TempDir()
	study := tinyStudy(t, d, "")
	b, err := os.ReadFile(study)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(study, []byte(strings.Replace(string(b), "input_len: 4, output_len: 2", "input_len: 4000, output_len: 200", 1)), 0o644))
	out, err := runCLI(t, "attribute", "--study", study, "--out", filepath.Join(d, "out"), "--quiet")
	require.ErrorContains(t, err, "input_len 4000 + output_len 200 exceed the model's context limit 4096")
	require.NotContains(t, out, "mismatches")
	_, serr := os.Stat(filepath.Join(d, "out"))
	require.True(t, os.IsNotExist(serr), "nothing is written")
	ents, _ := os.ReadDir(d)
	require.Len(t, ents, 1, "no staging folder is left: only the study file")
}

// `passes bench` measures the passes it is given on and off and writes
// its JSON; an unknown pass or a bad flag is refused first.
func TestPassesBenchCLI(t *testing.T) {
	d := t.TempDir()
	js := filepath.Join(d, "pb.json")
	out, err := runCLI(t, "passes", "bench", "--model", absFixture(t)+"/checkpoint", "--pass", "host-length-reuse", "--pass", "dsa-pooled-metadata",
		"--prompt", "8", "--batch", "1", "--steps", "1", "--rounds", "2", "--warmup", "0", "--json", js)
	require.NoError(t, err)
	require.Contains(t, out, "host-length-reuse (off: no passes; 2 paired rounds)")
	require.Contains(t, out, "dsa-pooled-metadata (off: no passes; 2 paired rounds)")
	require.Contains(t, out, "decode b1")
	b, err := os.ReadFile(js)
	require.NoError(t, err)
	require.Contains(t, string(b), `"speedup"`)
	_, err = runCLI(t, "passes", "bench", "--model", absFixture(t)+"/checkpoint", "--pass", "warp-drive")
	require.ErrorContains(t, err, "--pass warp-drive: no such pass")
	_, err = runCLI(t, "passes", "bench", "--model", absFixture(t)+"/checkpoint", "--rounds", "0")
	require.ErrorContains(t, err, "--rounds must be ≥ 1")
	_, err = runCLI(t, "passes", "bench", "--model", absFixture(t)+"/checkpoint", "--against", "nothing", "--rounds", "1", "--warmup", "0", "--prompt", "4", "--steps", "1", "--batch", "1", "--pass", "host-length-reuse")
	require.ErrorContains(t, err, "--against must be baseline or all")
}

// model.set scales a preset: its values reach the generator and name the
// cached checkpoint; a field that is not a text_config field is refused
// with the key named.
func TestPresetSetScalesAndNames(t *testing.T) {
	set, name, err := presetSet(map[string]any{"n_routed_experts": 16, "num_hidden_layers": 4})
	require.NoError(t, err)
	require.Equal(t, "-n_routed_experts16-num_hidden_layers4", name)
	require.JSONEq(t, "16", string(set["n_routed_experts"]))
	d := t.TempDir()
	ck, err := openModel(config.Model{Preset: "tiny", Seed: 1, CacheDir: d, Set: map[string]any{"n_routed_experts": 4}})
	require.NoError(t, err)
	defer ck.Close()
	require.Equal(t, 4, ck.Config().NRoutedExperts)
	require.DirExists(t, filepath.Join(d, "tiny-seed1-n_routed_experts4"))
	_, err = openModel(config.Model{Preset: "tiny", Seed: 1, CacheDir: d, Set: map[string]any{"no_such_field": 4}})
	require.ErrorContains(t, err, "model.set")
	require.ErrorContains(t, err, "no_such_field")
}
