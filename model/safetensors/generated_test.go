package safetensors

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A generated File: groups filled on first read with the fill's bytes, a
// fill error named with the tensor and not kept (the next read tries
// again), Check nil, Release a no-op on a file read from disk, and the
// constructor's refusals.
func TestGenerated(t *testing.T) {
	calls := 0
	fail := true
	fill := func(g int, dst [][]byte) error {
		calls++
		if g == 1 && fail {
			return errors.New("no luck")
		}
		for i, d := range dst {
			for j := range d {
				d[j] = byte(10*g + i)
			}
		}
		return nil
	}
	f, err := NewGenerated("gen", [][]GenTensor{
		{{Name: "a", DType: BF16, Shape: []int{2, 3}}, {Name: "a_scale", DType: F32, Shape: []int{1}}},
		{{Name: "b", DType: F8E4M3, Shape: []int{4}}},
	}, nil, fill)
	require.NoError(t, err)
	assert.True(t, f.Generated())
	assert.Equal(t, Generated, f.Mode())
	assert.Equal(t, "generated", f.Mode().String())
	assert.NoError(t, f.Check())
	assert.Equal(t, []string{"a", "a_scale", "b"}, f.Names())
	a, err := f.Bytes("a")
	require.NoError(t, err)
	assert.Equal(t, []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, a)
	s, err := f.Float32("a_scale") // a hold taken and given back
	require.NoError(t, err)
	assert.Len(t, s, 1)
	assert.EqualValues(t, 12+4, f.ResidentBytes())
	_, err = f.Bytes("b")
	assert.ErrorContains(t, err, "safetensors gen: generating b: no luck")
	fail = false
	b, err := f.Bytes("b")
	require.NoError(t, err)
	assert.Equal(t, []byte{10, 10, 10, 10}, b)
	assert.EqualValues(t, 2, f.Fills())
	assert.Equal(t, 3, calls)
	_, err = f.Bytes("c")
	assert.ErrorContains(t, err, "no tensor c")
	require.NoError(t, f.Close())
	assert.Zero(t, f.ResidentBytes())
	_, err = f.Bytes("a")
	assert.ErrorContains(t, err, "closed")

	for _, c := range []struct {
		groups [][]GenTensor
		fill   GenFill
		want   string
	}{
		{nil, nil, "no fill function"},
		{[][]GenTensor{{}}, fill, "group 0 is empty"},
		{[][]GenTensor{{{DType: BF16}}}, fill, "has no name"},
		{[][]GenTensor{{{Name: "x", DType: BF16}}, {{Name: "x", DType: BF16}}}, fill, "tensor x is listed twice"},
		{[][]GenTensor{{{Name: "x", DType: BF16, Shape: []int{-1}}}}, fill, "negative dimension"},
	} {
		_, err := NewGenerated("gen", c.groups, nil, c.fill)
		assert.ErrorContains(t, err, c.want)
	}
}
