package model

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

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
