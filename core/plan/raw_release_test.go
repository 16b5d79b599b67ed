package plan

import (
	"fmt"
	"testing"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// holdSource is a raw weight source that counts the holds Raw hands out
// and Release gives back.
type holdSource struct {
	dtypes map[string]safetensors.DType
	holds  map[string]int
}

func (s *holdSource) Raw(name string) ([]byte, safetensors.TensorInfo, error) {
	dt, ok := s.dtypes[name]
	if !ok {
		return nil, safetensors.TensorInfo{}, fmt.Errorf("no %s", name)
	}
	s.holds[name]++
	return make([]byte, 2*4*dt.Size()), safetensors.TensorInfo{Name: name, DType: dt, Shape: []int{2, 4}}, nil
}

func (s *holdSource) FP8Scales(string) ([]float32, [2]int, error) {
	return []float32{1}, [2]int{128, 128}, nil
}

func (s *holdSource) Release(name string) { s.holds[name]-- }

func (s *holdSource) Float32(string, ...int) ([]float32, error) { return nil, fmt.Errorf("not here") }

// TestRawHolds: a RawTensor holds every tensor its parts alias, ReleaseRaw
// gives them all back, and a Raw that comes back nil (the parts' dtypes
// differ) or fails holds nothing.
func TestRawHolds(t *testing.T) {
	src := &holdSource{holds: map[string]int{}, dtypes: map[string]safetensors.DType{
		"e0": safetensors.BF16, "e1": safetensors.BF16, "e2": safetensors.F8E4M3}}
	g := ir.New("holds")
	stacked := g.AddStackedWeight("e{e}", 2, 2, 4)
	mixed := g.AddStackedWeight("e{e}", 3, 2, 4)
	missing := g.AddStackedWeight("e{e}", 4, 2, 4)
	p := &Plan{src: src, consts: map[*ir.Value]bool{stacked: true, mixed: true, missing: true}}

	raw, err := p.Raw(stacked)
	require.NoError(t, err)
	require.NotNil(t, raw)
	assert.Len(t, raw.Parts, 2)
	assert.Equal(t, map[string]int{"e0": 1, "e1": 1}, src.holds)
	p.ReleaseRaw(raw)
	assert.Equal(t, map[string]int{"e0": 0, "e1": 0}, src.holds)
	p.ReleaseRaw(raw) // once only
	p.ReleaseRaw(nil)
	assert.Equal(t, map[string]int{"e0": 0, "e1": 0}, src.holds)

	raw, err = p.Raw(mixed)
	require.NoError(t, err)
	assert.Nil(t, raw, "bf16 and fp8 parts: no stored form")
	assert.Equal(t, map[string]int{"e0": 0, "e1": 0, "e2": 0}, src.holds)

	_, err = p.Raw(missing)
	assert.ErrorContains(t, err, "no e3")
	assert.Equal(t, map[string]int{"e0": 0, "e1": 0, "e2": 0}, src.holds)
}
