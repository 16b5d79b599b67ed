//go:build linux

package cpu_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/backend/cpu"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
)

// copyCheckpoint copies a fixture checkpoint into a temporary directory.
func copyCheckpoint(t *testing.T, fixture string) string {
	t.Helper()
	src := filepath.Join("..", "..", "..", "testdata", fixture, "checkpoint")
	dst := t.TempDir()
	ents, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644))
	}
	return dst
}

// guardedEngine opens a copied fixture with its weights held in mode and
// runs one prefill; it returns the engine, the batch and its logits.
func guardedEngine(t *testing.T, mode safetensors.Mode) (string, *engine.Engine, *backend.Batch, []float32) {
	dir := copyCheckpoint(t, "glm5next-tiny-a")
	ck, err := model.OpenWith(dir, model.OpenOptions{Weights: mode})
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	e, err := engine.New(ck.Config(), ck, engine.Options{Slots: 2})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	s, err := e.Store().Alloc()
	require.NoError(t, err)
	b := &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: []int32{1, 2, 3, 4, 5}}}}
	res, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, b)
	require.NoError(t, err)
	if mode == safetensors.Guarded {
		require.Positive(t, e.Backend().Info().Memory[cpu.MemBF16Mapped], "the test needs weights read in place")
	}
	return filepath.Join(dir, model.SingleFile), e, b, append([]float32(nil), res.Logits...)
}

// A guarded checkpoint truncated while a batch runs: the kernels' read of
// the lost pages faults (SIGBUS); the batch fails with an error naming the
// file, the process lives, and every later batch is refused with the same
// reason (before this change the process died of the signal).
func TestGuardedCheckpointTruncatedUnderABatch(t *testing.T) {
	file, e, b, _ := guardedEngine(t, safetensors.Guarded)
	cpu.SetAfterWeightsCheck(func() { require.NoError(t, os.Truncate(file, 0)) })
	b.Seqs[0].Tokens = []int32{6}
	_, err := e.Run(engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}, b)
	cpu.SetAfterWeightsCheck(nil)
	require.Error(t, err)
	assert.ErrorContains(t, err, file)
	assert.ErrorContains(t, err, "SIGBUS")
	assert.ErrorContains(t, err, "truncated to 0 bytes")
	_, err2 := e.Run(engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}, b)
	require.Error(t, err2)
	assert.ErrorContains(t, err2, "SIGBUS", "refused from then on, with the first reason")
	assert.ErrorIs(t, err, safetensors.ErrRefused)
	assert.ErrorIs(t, err2, safetensors.ErrRefused)
}

// A guarded checkpoint truncated or overwritten between batches is refused
// before the next batch reads it.
func TestGuardedCheckpointChangedBetweenBatches(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(file string) error
		want   string
	}{
		{"truncated", func(f string) error { return os.Truncate(f, 0) }, "size 0 bytes"},
		{"overwritten", func(f string) error {
			b, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			b[len(b)-1] ^= 0x40
			return os.WriteFile(f, b, 0o644) // cp over it: same inode, same size
		}, "changed on disk since they were loaded"},
	} {
		t.Run(c.name, func(t *testing.T) {
			file, e, b, _ := guardedEngine(t, safetensors.Guarded)
			require.NoError(t, c.change(file))
			b.Seqs[0].Tokens = []int32{6}
			_, err := e.Run(engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}, b)
			require.Error(t, err)
			assert.ErrorContains(t, err, file)
			assert.ErrorContains(t, err, c.want)
			assert.ErrorIs(t, err, safetensors.ErrRefused)
		})
	}
}

// The default, a copy: the checkpoint truncated, then another written over
// it, changes none of the served logits.
func TestCopiedCheckpointIgnoresTheFile(t *testing.T) {
	file, e, b, before := guardedEngine(t, safetensors.Copy)
	require.NoError(t, os.Truncate(file, 0))
	require.NoError(t, os.WriteFile(file, []byte("another checkpoint"), 0o644))
	require.NoError(t, e.Store().Free(b.Seqs[0].Slot))
	s, err := e.Store().Alloc()
	require.NoError(t, err)
	b.Seqs[0].Slot = s
	res, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, b)
	require.NoError(t, err)
	assert.Equal(t, before, res.Logits)
}

// A program compiled after its guarded checkpoint changed on disk is
// refused (engine.Program checks the weights before reading them).
func TestGuardedCheckpointChangedBeforeACompile(t *testing.T) {
	file, e, _, _ := guardedEngine(t, safetensors.Guarded)
	require.NoError(t, os.Truncate(file, 0))
	_, err := e.Program(engine.Key{Mode: graph.Decode, Logits: graph.AllLogits})
	require.Error(t, err)
	assert.ErrorContains(t, err, "program decode/all")
	assert.ErrorContains(t, err, "size 0 bytes")
}
