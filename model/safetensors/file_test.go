package safetensors

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOpenFixture(t *testing.T) {
	for _, c := range []struct {
		mode   Mode
		noMmap bool
	}{{Copy, false}, {Guarded, false}, {Guarded, true}} {
		forceNoMmap = c.noMmap
		f, err := OpenMode(fixturePath, c.mode)
		forceNoMmap = false
		require.NoError(t, err)
		assert.Equal(t, c.mode == Guarded && !c.noMmap, f.Mapped())
		assert.Equal(t, fixturePath, f.Path())
		assert.Equal(t, "pt", f.Metadata()["format"])
		name := "model.language_model.layers.0.self_attn.A_log"
		info, ok := f.Info(name)
		require.True(t, ok)
		assert.Equal(t, F32, info.DType)
		assert.Equal(t, []int{4}, info.Shape)
		raw, err := f.Bytes(name)
		require.NoError(t, err)
		assert.Len(t, raw, 16)
		vals, err := f.Float32(name)
		require.NoError(t, err)
		for i, v := range vals {
			assert.Equal(t, math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])), v)
		}
		emb, err := f.Float32("model.language_model.embed_tokens.weight")
		require.NoError(t, err)
		assert.Len(t, emb, 256*64)
		assert.Contains(t, f.Tensors(), "lm_head.weight")
		names := f.Names()
		assert.IsIncreasing(t, names)
		assert.Len(t, names, len(f.Tensors()))

		_, err = f.Bytes("nope")
		assert.ErrorContains(t, err, "no tensor nope")
		assert.ErrorContains(t, err, fixturePath)
		require.NoError(t, f.Close())
		require.NoError(t, f.Close())
		_, err = f.Bytes(name)
		assert.ErrorContains(t, err, "closed")
	}
}

func TestWriteOpenRoundTrip(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "rt.safetensors")
	w := []float32{1, -2, 3.5, 0.25, 448, -1.0 / 512}
	var tensors []WriteTensor
	for _, dt := range []DType{F32, F16, BF16, F8E4M3, F64} {
		raw := make([]byte, len(w)*dt.Size())
		require.NoError(t, FromFloat32(dt, w, raw))
		tensors = append(tensors, WriteTensor{Name: "t." + dt.String(), DType: dt, Shape: []int{2, 3}, Data: raw})
	}
	tensors = append(tensors,
		WriteTensor{Name: "ids", DType: I64, Shape: []int{2}, Data: []byte{1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0}},
		WriteTensor{Name: "scalar", DType: BOOL, Shape: nil, Data: []byte{1}},
		WriteTensor{Name: "empty", DType: F32, Shape: []int{0, 4}, Data: nil},
	)
	require.NoError(t, Write(p, tensors, map[string]string{"format": "pt", "b": "x"}))
	f, err := Open(p)
	require.NoError(t, err)
	defer f.Close()
	assert.Equal(t, map[string]string{"format": "pt", "b": "x"}, f.Metadata())
	require.Len(t, f.Tensors(), len(tensors))
	for _, tt := range tensors {
		info, ok := f.Info(tt.Name)
		require.True(t, ok, tt.Name)
		assert.Equal(t, tt.DType, info.DType)
		if tt.Shape == nil {
			assert.Empty(t, info.Shape)
		} else {
			assert.Equal(t, tt.Shape, info.Shape)
		}
		raw, err := f.Bytes(tt.Name)
		require.NoError(t, err)
		assert.Equal(t, len(tt.Data), len(raw))
		if len(tt.Data) > 0 {
			assert.Equal(t, tt.Data, raw)
		}
		if tt.DType.IsFloat() && len(tt.Data) > 0 {
			got, err := f.Float32(tt.Name)
			require.NoError(t, err)
			assert.Equal(t, w, got, tt.Name)
		}
	}
	_, err = f.Float32("ids")
	assert.ErrorContains(t, err, "tensor ids")
	// No temporary files are left behind.
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1)
}

func TestWriteErrors(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "bad.safetensors")
	cases := []struct {
		name    string
		tensors []WriteTensor
		want    string
	}{
		{"dup", []WriteTensor{{Name: "a", DType: U8, Shape: []int{1}, Data: []byte{1}}, {Name: "a", DType: U8, Shape: []int{1}, Data: []byte{1}}}, "tensor a is listed twice"},
		{"short data", []WriteTensor{{Name: "a", DType: F32, Shape: []int{2}, Data: []byte{1}}}, "tensor a: 1 bytes, shape [2] of F32 needs 8"},
		{"bad dtype", []WriteTensor{{Name: "a", DType: Invalid, Shape: []int{1}, Data: []byte{1}}}, "tensor a: invalid dtype"},
		{"empty name", []WriteTensor{{Name: "", DType: U8, Shape: []int{1}, Data: []byte{1}}}, "empty name"},
		{"reserved", []WriteTensor{{Name: "__metadata__", DType: U8, Shape: []int{1}, Data: []byte{1}}}, "reserved"},
		{"negative", []WriteTensor{{Name: "a", DType: U8, Shape: []int{-1}}}, "negative dimension"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := Write(p, c.tensors, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			assert.Contains(t, err.Error(), p)
			_, statErr := os.Stat(p)
			assert.True(t, os.IsNotExist(statErr), "no partial file")
		})
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "temporary files cleaned up")

	err = Write(filepath.Join(dir, "missing", "x.safetensors"), nil, nil)
	assert.ErrorContains(t, err, "missing")
}

func TestStreamWriter(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s.safetensors")
	specs := []WriteTensor{{Name: "b", DType: U8, Shape: []int{2}}, {Name: "a", DType: U8, Shape: []int{1}}}
	w, err := NewWriter(p, specs, nil)
	require.NoError(t, err)
	assert.ErrorContains(t, w.WriteTensor("a", []byte{1}), "out of order, expected b")
	require.NoError(t, w.WriteTensor("b", []byte{1, 2}))
	err = w.Close()
	assert.ErrorContains(t, err, "only 1 of 2 tensors written (next: a)")
	_, statErr := os.Stat(p)
	assert.True(t, os.IsNotExist(statErr))

	w, err = NewWriter(p, specs, nil)
	require.NoError(t, err)
	require.NoError(t, w.WriteTensor("b", []byte{1, 2}))
	require.NoError(t, w.WriteTensor("a", []byte{3}))
	assert.ErrorContains(t, w.WriteTensor("c", []byte{3}), "not declared")
	require.NoError(t, w.Close())
	f, err := Open(p)
	require.NoError(t, err)
	raw, err := f.Bytes("a")
	require.NoError(t, err)
	assert.Equal(t, []byte{3}, raw)
	require.NoError(t, f.Close())

	w, err = NewWriter(p+"2", specs, nil)
	require.NoError(t, err)
	w.Abort()
	assert.Error(t, w.WriteTensor("b", []byte{1, 2}))
	_, statErr = os.Stat(p + "2")
	assert.True(t, os.IsNotExist(statErr))
}

func TestOpenTruncatedAndMalformed(t *testing.T) {
	full, err := os.ReadFile(fixturePath)
	require.NoError(t, err)
	n := binary.LittleEndian.Uint64(full)
	dir := t.TempDir()
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "truncated: 0 bytes"},
		{"short length", full[:5], "truncated: 5 bytes"},
		{"cut header", full[:8+n/2], "truncated: header length"},
		{"cut data", full[:len(full)-10], "truncated: tensors need"},
		{"huge header length", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'}, "exceeds"},
	}
	bad := make([]byte, 8+int(n))
	copy(bad, full[:8+n])
	copy(bad[8:], `{"x":`)
	cases = append(cases, struct {
		name string
		data []byte
		want string
	}{"bad json", bad, "not valid JSON"})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(dir, c.name+".safetensors")
			require.NoError(t, os.WriteFile(p, c.data, 0o644))
			_, err := Open(p)
			require.Error(t, err)
			assert.Contains(t, err.Error(), p)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	_, err = Open(filepath.Join(dir, "does-not-exist.safetensors"))
	assert.ErrorContains(t, err, "does-not-exist.safetensors")
	_, err = Open(dir)
	assert.ErrorContains(t, err, "not a regular file")

	p := writeRaw(t, `{"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}`, []byte{0})
	_, err = Open(p)
	assert.ErrorContains(t, err, `tensor w: unknown dtype "Q4"`)
	assert.ErrorContains(t, err, p)
}

// DropResident leaves every tensor readable with the same bytes, mapped or
// read into memory, and is a no-op once the file is closed.
func TestDropResidentKeepsBytes(t *testing.T) {
	for _, mode := range []Mode{Guarded, Copy} {
		f, err := OpenMode(fixturePath, mode)
		require.NoError(t, err)
		name := "model.language_model.embed_tokens.weight"
		before, err := f.Float32(name)
		require.NoError(t, err)
		raw, err := f.Bytes(name)
		require.NoError(t, err)
		rawBefore := append([]byte(nil), raw...)
		require.NoError(t, f.DropResident())
		after, err := f.Float32(name)
		require.NoError(t, err)
		assert.Equal(t, before, after)
		assert.Equal(t, rawBefore, raw) // the slice handed out before reads the same
		require.NoError(t, f.Close())
		require.NoError(t, f.DropResident())
	}
}
