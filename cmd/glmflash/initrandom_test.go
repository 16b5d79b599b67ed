package main

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/model"
	"github.com/stretchr/testify/require"
)

// init-random refuses an --out that already holds a checkpoint (or any
// files) and leaves it untouched; --force replaces it.
func TestInitRandomRefusesToOverwrite(t *testing.T) {
	d := t.TempDir()
	_, err := runCLI(t, "init-random", "--preset", "tiny", "--out", d, "--seed", "1")
	require.NoError(t, err)
	before, err := os.ReadFile(filepath.Join(d, "model.safetensors"))
	require.NoError(t, err)
	_, err = runCLI(t, "init-random", "--preset", "tiny", "--out", d, "--seed", "2")
	require.ErrorContains(t, err, "already holds a checkpoint")
	require.ErrorContains(t, err, "--force")
	after, err := os.ReadFile(filepath.Join(d, "model.safetensors"))
	require.NoError(t, err)
	require.Equal(t, before, after, "the checkpoint is untouched")
	_, err = runCLI(t, "init-random", "--preset", "tiny", "--out", d, "--seed", "2", "--force")
	require.NoError(t, err)
	after, err = os.ReadFile(filepath.Join(d, "model.safetensors"))
	require.NoError(t, err)
	require.NotEqual(t, before, after)
	// a file in the way
	f := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(f, []byte("x"), 0o644))
	_, err = runCLI(t, "init-random", "--preset", "tiny", "--out", f)
	require.ErrorContains(t, err, "not a directory")
}

// Processes that write the same random preset at once all succeed and see
// the same checkpoint (each writes a private temporary folder and renames it).
func TestConcurrentPresetWrites(t *testing.T) {
	cache := t.TempDir()
	const n = 4
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ck, err := openModel(config.Model{Preset: "tiny", Seed: 7, CacheDir: cache})
			if err == nil {
				err = ck.Validate()
				ck.Close()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "writer %d", i)
	}
	ents, err := os.ReadDir(cache)
	require.NoError(t, err)
	require.Len(t, ents, 1, "no temporary folder is left behind")
	require.Equal(t, "tiny-seed7", ents[0].Name())
}

// init-random writes an -mtp preset with its MTP layer, checked after writing.
func TestInitRandomMTPPreset(t *testing.T) {
	d := filepath.Join(t.TempDir(), "ck")
	out, err := runCLI(t, "init-random", "--preset", "tiny-mtp", "--out", d, "--fp8")
	require.NoError(t, err)
	require.Contains(t, out, "8 layers + 1 MTP layer(s)")
	ck, err := model.Open(d)
	require.NoError(t, err)
	defer ck.Close()
	require.NoError(t, ck.ValidateMTP())
}
