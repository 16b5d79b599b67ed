package safetensors

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const fixturePath = "../../testdata/glm5next-tiny-a/checkpoint/model.safetensors"

// fixtureHeader returns the JSON header and data size of the fixture checkpoint.
func fixtureHeader(tb testing.TB) ([]byte, int64) {
	tb.Helper()
	b, err := os.ReadFile(fixturePath)
	require.NoError(tb, err)
	n := binary.LittleEndian.Uint64(b)
	return b[8 : 8+n], int64(len(b)) - 8 - int64(n)
}

func TestParseHeaderValid(t *testing.T) {
	h := `{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[16,28]},` +
		`"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"s":{"dtype":"I8","shape":[],"data_offsets":[28,29]},` +
		`"z":{"dtype":"F16","shape":[0,5],"data_offsets":[29,29]}}   `
	infos, md, err := ParseHeader([]byte(h), 29)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"format": "pt"}, md)
	require.Len(t, infos, 4)
	assert.Equal(t, TensorInfo{Name: "b", DType: BF16, Shape: []int{2, 3}, Begin: 16, End: 28}, infos["b"])
	assert.Equal(t, 6, infos["b"].NumElements())
	assert.Equal(t, 1, infos["s"].NumElements())
	assert.Equal(t, 0, infos["z"].NumElements())
	assert.Equal(t, int64(12), infos["b"].ByteLen())
}

func TestParseHeaderFixture(t *testing.T) {
	h, size := fixtureHeader(t)
	infos, md, err := ParseHeader(h, size)
	require.NoError(t, err)
	assert.Equal(t, "pt", md["format"])
	info := infos["model.language_model.layers.3.self_attn.q_a_proj.weight"]
	assert.Equal(t, BF16, info.DType)
	assert.Equal(t, []int{48, 64}, info.Shape)
	assert.Equal(t, F32, infos["model.language_model.layers.0.self_attn.A_log"].DType)
	// The data section is one byte too short for the last tensor.
	_, _, err = ParseHeader(h, size-1)
	assert.ErrorContains(t, err, "end past the data section")
}

func TestParseHeaderErrors(t *testing.T) {
	ok := `"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}`
	cases := []struct {
		name, header, want string
	}{
		{"not json", `{"a":`, "not valid JSON"},
		{"empty", ``, "not valid JSON"},
		{"array", `[1,2]`, "not a JSON object"},
		{"trailing", `{` + ok + `}{}`, "trailing data"},
		{"trailing garbage", `{` + ok + `} x`, "trailing data"},
		{"duplicate", `{` + ok + `,` + ok + `}`, `duplicate key "a"`},
		{"unknown dtype", `{"w":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}`, `tensor w: unknown dtype "F4"`},
		{"negative dim", `{"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, "tensor w: shape [-2] has a negative dimension"},
		{"float dim", `{"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}}`, "tensor w: bad header entry"},
		{"unordered", `{"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}`, "tensor w: data_offsets [8 0] are not ordered"},
		{"negative offset", `{"w":{"dtype":"F32","shape":[0],"data_offsets":[-4,-4]}}`, "not ordered"},
		{"three offsets", `{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}}`, "must have 2 entries"},
		{"length mismatch", `{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, "tensor w: 8 bytes"},
		{"past end", `{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, "tensor w: data_offsets [0 16] end past the data section (12 bytes)"},
		{"overlap", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[2],"data_offsets":[6,10]}}`, "tensors a [0,8) and b [6,10) overlap"},
		{"missing dtype", `{"w":{"shape":[2],"data_offsets":[0,8]}}`, "tensor w: header entry has no dtype"},
		{"missing shape", `{"w":{"dtype":"F32","data_offsets":[0,8]}}`, "tensor w: header entry has no shape"},
		{"missing offsets", `{"w":{"dtype":"F32","shape":[2]}}`, "tensor w: header entry has no data_offsets"},
		{"unknown field", `{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}}`, "tensor w: bad header entry"},
		{"entry not object", `{"w":[1]}`, "tensor w: bad header entry"},
		{"metadata not strings", `{"__metadata__":{"a":1}}`, "__metadata__ must map strings to strings"},
		{"empty name", `{"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, "empty name"},
		{"overflow", `{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, "overflows"},
		{"huge offset", `{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,99999999999999999999]}}`, "tensor w: bad header entry"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := ParseHeader([]byte(c.header), 12)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	_, _, err := ParseHeader(make([]byte, MaxHeaderSize+1), 0)
	assert.ErrorContains(t, err, "byte limit")
	_, _, err = ParseHeader([]byte(`{}`), -1)
	assert.ErrorContains(t, err, "negative data size")
}

func FuzzParseHeader(f *testing.F) {
	h, size := fixtureHeader(f)
	f.Add(h, size)
	f.Add([]byte(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`), int64(8))
	f.Add([]byte(`{"__metadata__":{"k":"v"},"a":{"dtype":"F8_E4M3","shape":[2,0],"data_offsets":[0,0]}}`), int64(0))
	f.Add([]byte(`{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[2,4]}}`), int64(4))
	f.Add([]byte(`{"a":`), int64(0))
	f.Add([]byte(`null`), int64(0))
	f.Fuzz(func(t *testing.T, header []byte, dataSize int64) {
		infos, _, err := ParseHeader(header, dataSize)
		if err != nil {
			return
		}
		for name, info := range infos {
			if info.Begin < 0 || info.End < info.Begin || info.End > dataSize {
				t.Fatalf("%s: offsets [%d,%d) outside [0,%d)", name, info.Begin, info.End, dataSize)
			}
			if int64(info.NumElements())*int64(info.DType.Size()) != info.End-info.Begin {
				t.Fatalf("%s: length mismatch", name)
			}
		}
	})
}

// writeRaw writes a safetensors file from a raw header string and data.
func writeRaw(t *testing.T, header string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "x.safetensors")
	b := make([]byte, 8, 8+len(header)+len(data))
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	b = append(b, data...)
	require.NoError(t, os.WriteFile(p, b, 0o644))
	return p
}

func TestHeaderKeysSortedAndPadded(t *testing.T) {
	p := filepath.Join(t.TempDir(), "w.safetensors")
	require.NoError(t, Write(p, []WriteTensor{
		{Name: "zeta", DType: U8, Shape: []int{3}, Data: []byte{1, 2, 3}},
		{Name: "alpha", DType: U8, Shape: []int{1}, Data: []byte{9}},
	}, map[string]string{"format": "pt"}))
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	n := binary.LittleEndian.Uint64(b)
	assert.Zero(t, (8+n)%8, "data section must be 8-byte aligned")
	h := string(b[8 : 8+n])
	assert.True(t, strings.HasPrefix(h, `{"__metadata__":{"format":"pt"},"alpha":`), h)
	assert.Less(t, strings.Index(h, `"alpha"`), strings.Index(h, `"zeta"`))
	assert.Equal(t, strings.TrimRight(h, " ")+strings.Repeat(" ", len(h)-len(strings.TrimRight(h, " "))), h)
	// Data is laid out in the order given, not the key order.
	assert.Equal(t, []byte{1, 2, 3, 9}, b[8+n:])
}
