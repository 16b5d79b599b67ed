package model

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/glmflash/glmflash/model/safetensors"

	"github.com/stretchr/testify/require"
)

// PoisonCopy copies the fixture checkpoint into dir with one element of
// tensor name set to NaN (BF16 0x7fc0); tests of --check-tensors use it.
func poisonCopy(t *testing.T, dir, name string) {
	t.Helper()
	for _, f := range []string{ConfigFile, SingleFile} {
		b, err := os.ReadFile(filepath.Join(fixtureDir, f))
		require.NoError(t, err)
		if f == SingleFile {
			n := binary.LittleEndian.Uint64(b)
			var hdr map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(b[8:8+n], &hdr))
			var e struct {
				DType   string  `json:"dtype"`
				Offsets []int64 `json:"data_offsets"`
			}
			require.NoError(t, json.Unmarshal(hdr[name], &e))
			require.Equal(t, "BF16", e.DType)
			off := 8 + int64(n) + e.Offsets[0] + 2 // the second element
			binary.LittleEndian.PutUint16(b[off:], 0x7fc0)
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
}

func TestCheckTensorsFindsNaN(t *testing.T) {
	ck, err := Open(fixtureDir)
	require.NoError(t, err)
	require.NoError(t, ck.CheckTensors())
	ck.Close()
	d := t.TempDir()
	name := "model.language_model.layers.2.mlp.up_proj.weight"
	poisonCopy(t, d, name)
	ck, err = Open(d)
	require.NoError(t, err, "the checkpoint opens: only the optional check reads every value")
	defer ck.Close()
	require.ErrorContains(t, ck.CheckTensors(), "tensor "+name+": 1 non-finite values (the first at element 1 is NaN)")
}

// A non-finite FP8 block scale is reported on the scale tensor, with its
// block; a NaN code on the weight (issue 37: a NaN scale blamed the weight).
func TestCheckTensorsNamesTheFP8Scale(t *testing.T) {
	var top map[string]any
	require.NoError(t, json.Unmarshal(fixtureConfigJSON(t), &top))
	top["quantization_config"] = map[string]any{"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": []int{8, 8}}
	cfgJSON, err := json.Marshal(top)
	require.NoError(t, err)
	name := "model.language_model.layers.3.self_attn.q_b_proj.weight"
	n, k := 64, 48
	sn, sk := n/8, k/8
	open := func(codes []byte, scale []float32) *Checkpoint {
		sraw := make([]byte, 4*len(scale))
		for i, v := range scale {
			binary.LittleEndian.PutUint32(sraw[4*i:], math.Float32bits(v))
		}
		st := safetensors.WriteTensor{Name: name + ScaleSuffix, DType: safetensors.F32, Shape: []int{sn, sk}, Data: sraw}
		ck, err := Open(writeCheckpoint(t, cfgJSON, fp8Tensors(t, codes, []int{n, k}, st)))
		require.NoError(t, err)
		t.Cleanup(func() { ck.Close() })
		return ck
	}
	codes := make([]byte, n*k)
	for i := range codes {
		codes[i] = 0x38 // 1.0
	}
	scale := make([]float32, sn*sk)
	for i := range scale {
		scale[i] = 0.5
	}
	require.NoError(t, open(codes, scale).CheckTensors())

	bad := slices.Clone(scale)
	bad[sk+2] = float32(math.NaN())
	bad[3*sk] = float32(math.Inf(1))
	err = open(codes, bad).CheckTensors()
	require.ErrorContains(t, err, "tensor "+name+ScaleSuffix+": 2 non-finite block scales (the first, block [1, 2] of "+name+", is NaN)")
	require.NotContains(t, err.Error(), "tensor "+name+":", "the weight is not blamed")

	nanCode := slices.Clone(codes)
	nanCode[5] = 0x7F
	err = open(nanCode, scale).CheckTensors()
	require.ErrorContains(t, err, "tensor "+name+": 1 non-finite values (the first at element 5 is NaN)")
	require.NotContains(t, err.Error(), ScaleSuffix)
}
