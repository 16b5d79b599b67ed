//go:build unix

package model

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/glmflash/glmflash/model/safetensors"
)

// A guarded checkpoint truncated under a reader goroutine: faultless turns
// the fault into the file's error; CheckWeights refuses the checkpoint from
// then on, naming the file.
func TestGuardedCheckpointFaultAndCheck(t *testing.T) {
	src := filepath.Join("..", "testdata", "glm5next-tiny-a", "checkpoint")
	dir := t.TempDir()
	ents, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644))
	}
	ck, err := OpenWith(dir, OpenOptions{Weights: safetensors.Guarded})
	require.NoError(t, err)
	defer ck.Close()
	assert.Equal(t, safetensors.Guarded, ck.WeightsMode())
	require.NoError(t, ck.CheckWeights())
	require.NoError(t, ck.VerifyWeights())
	raw, _, err := ck.Raw("lm_head.weight")
	require.NoError(t, err)
	require.NoError(t, os.Truncate(filepath.Join(dir, SingleFile), 0))
	var sum byte
	done := make(chan error)
	go func() { // a goroutine of its own, as parallelConvert's
		done <- faultless(func() error {
			for _, b := range raw {
				sum += b
			}
			return nil
		})
	}()
	err = <-done
	require.Error(t, err)
	assert.ErrorContains(t, err, "SIGBUS")
	err = ck.CheckWeights()
	require.Error(t, err)
	assert.ErrorContains(t, err, filepath.Join(dir, SingleFile))
	_, err = ck.Float32("lm_head.weight")
	assert.ErrorContains(t, err, "SIGBUS", "a faulted file hands out no more bytes")
}
