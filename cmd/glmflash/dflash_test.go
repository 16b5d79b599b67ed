package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// init-random --preset tiny-dflash writes the trunk and, in <out>/dflash,
// a drafter that opens; bench --speculative dflash runs it (its greedy
// tokens checked against plain decoding's by bench itself), from the
// directory with --draft-model and from the preset alone (its own drafter);
// with --load-format dummy the preset writes no drafter: one must be given.
func TestDFlashInitRandomAndBench(t *testing.T) {
	out := filepath.Join(t.TempDir(), "ck")
	msg, err := runCLI(t, "init-random", "--preset", "tiny-dflash", "--out", out)
	require.NoError(t, err)
	require.Contains(t, msg, "DFlash drafter, 2 layers, block 8, target layers [1 5]")
	_, err = os.Stat(filepath.Join(out, "dflash", "model.safetensors"))
	require.NoError(t, err)
	common := []string{"--prompt", "4", "--decode-steps", "6", "--reps", "1", "--warmup", "0", "--batch", "1", "--limits", writeLimits(t, 100, 200, 49)}
	msg, err = runCLI(t, append([]string{"bench", "--model", out, "--speculative", "dflash", "--draft-model", filepath.Join(out, "dflash")}, common...)...)
	require.NoError(t, err)
	require.Contains(t, msg, "sched decode batch 1 dflash "+filepath.Join(out, "dflash"))
	msg, err = runCLI(t, append([]string{"bench", "--preset", "tiny-dflash", "--cache-dir", t.TempDir(), "--speculative", "dflash"}, common...)...)
	require.NoError(t, err)
	require.Contains(t, msg, "dflash")
	require.Contains(t, msg, "acceptance length")
	_, err = runCLI(t, append([]string{"bench", "--preset", "tiny-dflash", "--load-format", "dummy", "--speculative", "dflash"}, common...)...)
	require.ErrorContains(t, err, "speculative.draft_model: model.load_format dummy")
	msg, err = runCLI(t, append([]string{"bench", "--preset", "tiny-dflash", "--load-format", "dummy", "--speculative", "dflash", "--draft-model", filepath.Join(out, "dflash")}, common...)...)
	require.NoError(t, err, "dummy trunk weights beside a drafter on disk")
	require.Contains(t, msg, "sched decode batch 1 dflash ")
	_, err = runCLI(t, append([]string{"bench", "--model", out, "--speculative", "dflash"}, common...)...)
	require.ErrorContains(t, err, "speculative.draft_model")
	_, err = runCLI(t, append([]string{"bench", "--model", out, "--speculative", "dflash:3", "--draft-model", out}, common...)...)
	require.ErrorContains(t, err, "speculative.num_steps")
}

// init-random --drafter-only writes a -dflash preset's drafter alone (the
// trunk then comes from --load-format dummy), byte-identical to the one a
// full init-random writes with the same seed; it is refused elsewhere.
func TestInitRandomDrafterOnly(t *testing.T) {
	full := filepath.Join(t.TempDir(), "full")
	_, err := runCLI(t, "init-random", "--preset", "tiny-dflash", "--out", full, "--seed", "3")
	require.NoError(t, err)
	only := filepath.Join(t.TempDir(), "only")
	msg, err := runCLI(t, "init-random", "--preset", "tiny-dflash", "--out", only, "--seed", "3", "--drafter-only")
	require.NoError(t, err)
	require.Contains(t, msg, "DFlash drafter, 2 layers")
	_, err = os.Stat(filepath.Join(only, "config.json"))
	require.ErrorIs(t, err, os.ErrNotExist, "no trunk written")
	for _, f := range []string{"config.json", "model.safetensors"} {
		a, err := os.ReadFile(filepath.Join(full, "dflash", f))
		require.NoError(t, err)
		b, err := os.ReadFile(filepath.Join(only, "dflash", f))
		require.NoError(t, err)
		require.Equal(t, a, b, f)
	}
	common := []string{"--prompt", "4", "--decode-steps", "4", "--reps", "1", "--warmup", "0", "--batch", "1", "--limits", writeLimits(t, 100, 200, 49)}
	msg, err = runCLI(t, append([]string{"bench", "--preset", "tiny", "--load-format", "dummy", "--seed", "3", "--speculative", "dflash", "--draft-model", filepath.Join(only, "dflash")}, common...)...)
	require.NoError(t, err)
	require.Contains(t, msg, "dflash")
	_, err = runCLI(t, "init-random", "--preset", "tiny", "--out", t.TempDir(), "--drafter-only")
	require.ErrorContains(t, err, "--drafter-only needs a -dflash preset")
	_, err = runCLI(t, "init-random", "--preset", "tiny-dflash", "--out", t.TempDir(), "--drafter-only", "--fp8")
	require.ErrorContains(t, err, "--drafter-only writes the bfloat16 drafter alone")
	_, err = runCLI(t, "init-random", "--preset", "tiny-dflash", "--out", only, "--seed", "3", "--drafter-only")
	require.ErrorContains(t, err, "already holds")
}
