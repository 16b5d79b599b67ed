package main

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
		io.Copy(&b, r)
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
			os.WriteFile(st(d), b[:len(b)/2], 0o644)
		}, "model.safetensors"},
		{"bad header json", func(d string) {
			b, _ := os.ReadFile(st(d))
			copy(b[8:], []byte("{nope"))
			os.WriteFile(st(d), b, 0o644)
		}, "model.safetensors"},
		{"unknown dtype", func(d string) {
			b, _ := os.ReadFile(st(d))
			n := binary.LittleEndian.Uint64(b)
			h := strings.Replace(string(b[8:8+n]), `"BF16"`, `"BQ16"`, 1)
			copy(b[8:], h)
			os.WriteFile(st(d), b, 0o644)
		}, "BQ16"},
		{"wrong tensor shape", func(d string) {
			b, _ := os.ReadFile(st(d))
			n := binary.LittleEndian.Uint64(b)
			h := strings.Replace(string(b[8:8+n]), `"shape":[256,64]`, `"shape":[64,256]`, 1)
			copy(b[8:], h)
			os.WriteFile(st(d), b, 0o644)
		}, "shape"},
		{"inconsistent config", func(d string) {
			b, _ := os.ReadFile(filepath.Join(d, "config.json"))
			os.WriteFile(filepath.Join(d, "config.json"), []byte(strings.Replace(string(b), `"index_kpool": 4`, `"index_kpool": 3`, 1)), 0o644)
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
