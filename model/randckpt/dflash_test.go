package randckpt

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/stretchr/testify/require"
)

// A -dflash preset's drafter fits its trunk; written, it opens as a DFlash
// checkpoint whose tensors are z-lab's names in bfloat16, the same bytes
// for a seed; a preset without a drafter and FP8 are refused.
func TestDFlashPresetWritesAndOpens(t *testing.T) {
	cfg, err := Preset("tiny-dflash")
	require.NoError(t, err)
	d, err := DFlashPreset("tiny-dflash", cfg)
	require.NoError(t, err)
	require.Equal(t, []int{1, 5}, d.TargetLayerIDs)
	require.Equal(t, 255, d.MaskTokenID)
	require.Equal(t, 64, d.HiddenSize)
	dir := t.TempDir()
	require.NoError(t, WriteDFlash(dir, d, Options{Seed: 3}))
	ck, err := model.OpenDFlash(dir, model.OpenOptions{})
	require.NoError(t, err)
	defer ck.Close()
	require.Equal(t, d, ck.DFlashConfig())
	_, info, err := ck.Raw("layers.1.mlp.down_proj.weight")
	require.NoError(t, err)
	require.Equal(t, safetensors.BF16, info.DType)
	require.Equal(t, []int{64, 128}, info.Shape)
	w, err := ck.Float32("fc.weight", 64, 128)
	require.NoError(t, err)
	require.NotZero(t, w[0])

	again := t.TempDir()
	require.NoError(t, WriteDFlash(again, d, Options{Seed: 3}))
	a, _ := os.ReadFile(filepath.Join(dir, model.SingleFile))
	b, _ := os.ReadFile(filepath.Join(again, model.SingleFile))
	require.Equal(t, a, b, "the same seed writes the same bytes")

	require.ErrorContains(t, WriteDFlash(t.TempDir(), d, Options{FP8: true}), "FP8 and shards are not implemented")
	_, err = Preset("huge-dflash")
	require.ErrorContains(t, err, `unknown preset "huge-dflash"`)

	// a drafter missing a tensor, or shaped for another trunk, does not open
	require.NoError(t, os.Remove(filepath.Join(dir, model.SingleFile)))
	other := *d
	other.IntermediateSize = 96
	require.NoError(t, WriteDFlash(dir, &other, Options{Seed: 3}))
	js, err := d.MarshalHF()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, model.ConfigFile), js, 0o644))
	_, err = model.OpenDFlash(dir, model.OpenOptions{})
	require.ErrorContains(t, err, "tensor layers.0.mlp.gate_proj.weight: shape [96 64], want [128 64]")
}
