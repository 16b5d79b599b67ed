package plan

import (
	"fmt"
	"slices"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/model/safetensors"
)

// RawWeights is a weight source that can hand out tensors as stored
// (model.Checkpoint is one): a device backend then uploads BF16 bytes as
// they are and keeps FP8 weights as FP8 with their block scales, without
// the float32 copy Weights makes.
type RawWeights interface {
	// Raw returns the stored bytes of a tensor (valid while the source is
	// open) and its dtype and shape.
	Raw(name string) ([]byte, safetensors.TensorInfo, error)
	// FP8Scales returns the block scales of an F8_E4M3 weight as float32,
	// [ceil(rows/block[0])][ceil(cols/block[1])], and the block size.
	FP8Scales(name string) ([]float32, [2]int, error)
}

// ReleasableWeights is a raw weight source whose bytes may be given back
// (model.Checkpoint; for generated dummy weights the memory is freed once
// no reader holds them, and made again if asked for again): Release says
// that a slice Raw handed out for name is no longer read.
type ReleasableWeights interface {
	Release(name string)
}

// CheckedWeights is a weight source whose stored bytes can stop being
// valid while they are read in place (model.Checkpoint in Guarded mode: a
// mapped file changed on disk or faulted); CheckWeights says why, nil
// while they are valid.
type CheckedWeights interface {
	CheckWeights() error
}

// CheckWeights asks the plan's weight source (CheckedWeights) whether the
// bytes Raw handed out may still be read: nil when the source cannot tell.
func (p *Plan) CheckWeights() error {
	src := p.src
	if c, ok := src.(*WeightCache); ok {
		src = c.Source()
	}
	if cw, ok := src.(CheckedWeights); ok {
		return cw.CheckWeights()
	}
	return nil
}

// RawTensor is a constant as stored in the checkpoint: one or more 2-D
// matrices (parts) laid end to end, which is the constant's row-major
// layout (a stacked weight: one part per expert; concat_rows: its inputs'
// parts in order).
type RawTensor struct {
	// DType is the stored dtype of every part: safetensors.BF16 or F8E4M3.
	DType safetensors.DType
	// Shape is the constant's shape (2-D, or 3-D for stacked weights).
	Shape []int
	Parts []RawPart
	// Block is the FP8 block size (rows, cols) of every part's scales.
	Block [2]int
	// held names the source's tensors whose bytes the parts alias
	// (ReleaseRaw gives them back).
	held []string
}

// RawPart is one stored matrix [Rows][Cols]; FP8 parts carry their block
// scales [ceil(Rows/Block[0])][ceil(Cols/Block[1])].
type RawPart struct {
	Data       []byte
	Rows, Cols int
	Scales     []float32
}

// Bytes is the stored size of t's data (scales not included).
func (t *RawTensor) Bytes() int64 {
	var n int64
	for _, p := range t.Parts {
		n += int64(len(p.Data))
	}
	return n
}

// Raw returns constant v as stored, or nil when it has no stored form the
// device can take as is: the source cannot hand out bytes, a tensor is
// neither BF16 nor F8_E4M3, the parts mix dtypes or block sizes, the value
// is derived by another fold than concat_rows or stack, or FP8 parts that
// are not the last would break the block grid (rows not a multiple of the
// block). The caller then uses Const.
func (p *Plan) Raw(v *ir.Value) (*RawTensor, error) {
	src := p.src
	if c, ok := src.(*WeightCache); ok {
		src = c.Source()
	}
	rw, ok := src.(RawWeights)
	if !ok || !p.consts[v] {
		return nil, nil
	}
	return rawOf(rw, v)
}

// ReleaseRaw says that t's bytes (from Raw) are no longer read: a backend
// that copied them (to the device) calls it, one that reads them in place
// does not. A source that can free them (ReleasableWeights: generated
// dummy weights) may; nil does nothing.
func (p *Plan) ReleaseRaw(t *RawTensor) {
	if t == nil {
		return
	}
	src := p.src
	if c, ok := src.(*WeightCache); ok {
		src = c.Source()
	}
	release(src, t.held)
	t.held = nil
}

// release gives back the holds on names (ReleasableWeights).
func release(src any, names []string) {
	if r, ok := src.(ReleasableWeights); ok {
		for _, n := range names {
			r.Release(n)
		}
	}
}

func rawOf(rw RawWeights, v *ir.Value) (t *RawTensor, err error) {
	var parts []*RawTensor
	defer func() { // nothing stays held for a nil result
		if t == nil {
			for _, pt := range parts {
				release(rw, pt.held)
			}
		}
	}()
	switch {
	case v.Producer == nil:
		names := v.LeafNames()
		want := v.Shape
		if v.Stack > 0 {
			want = v.Shape[1:]
		}
		if len(want) != 2 {
			return nil, nil
		}
		for _, name := range names {
			t, err := rawLeaf(rw, name, want)
			if t == nil || err != nil {
				return nil, err
			}
			parts = append(parts, t)
		}
	case v.Producer.Op == ir.OpConcatRows || v.Producer.Op == ir.OpStack:
		if len(v.Producer.Outputs) != 1 {
			return nil, nil
		}
		for _, in := range v.Producer.Inputs {
			t, err := rawOf(rw, in)
			if t == nil || err != nil {
				return nil, err
			}
			parts = append(parts, t)
		}
	default:
		return nil, nil
	}
	out := &RawTensor{DType: parts[0].DType, Shape: slices.Clone(v.Shape), Block: parts[0].Block}
	for i, t := range parts {
		if t.DType != out.DType || t.Block != out.Block {
			return nil, nil
		}
		out.held = append(out.held, t.held...)
		for j, pt := range t.Parts {
			last := i == len(parts)-1 && j == len(t.Parts)-1
			if out.DType == safetensors.F8E4M3 && !last && v.Producer != nil && v.Producer.Op == ir.OpConcatRows && pt.Rows%out.Block[0] != 0 {
				return nil, nil
			}
			out.Parts = append(out.Parts, pt)
		}
	}
	return out, nil
}

// rawLeaf is one checkpoint tensor as stored (nil when its dtype is not
// BF16 or F8_E4M3).
func rawLeaf(rw RawWeights, name string, want []int) (t *RawTensor, err error) {
	data, info, err := rw.Raw(name)
	if err != nil {
		return nil, err
	}
	defer func() {
		if t == nil {
			release(rw, []string{name})
		}
	}()
	if !slices.Equal(info.Shape, want) {
		return nil, fmt.Errorf("tensor %s: shape %v, want %v", name, info.Shape, want)
	}
	t = &RawTensor{DType: info.DType, Shape: want, held: []string{name}}
	part := RawPart{Data: data, Rows: want[0], Cols: want[1]}
	switch info.DType {
	case safetensors.BF16:
	case safetensors.F8E4M3:
		s, block, err := rw.FP8Scales(name)
		if err != nil {
			return nil, err
		}
		part.Scales, t.Block = s, block
	default:
		return nil, nil
	}
	if int64(len(data)) != int64(want[0])*int64(want[1])*int64(info.DType.Size()) {
		return nil, fmt.Errorf("tensor %s: %d bytes, want %d×%d %s", name, len(data), want[0], want[1], info.DType)
	}
	t.Parts = []RawPart{part}
	return t, nil
}

// ConstKey names a constant independently of the plan it came from: the
// checkpoint reference for weights, the folding op with its attributes
// (slice_cols' columns) over its inputs' keys for derived weights. Plans of
// one Source give equal keys to equal constants, so a backend can share one
// bound copy between them.
func ConstKey(v *ir.Value) string {
	if v.Producer == nil {
		return fmt.Sprintf("%s#%d", v.Ref, v.Stack)
	}
	k := v.Producer.Op + v.Producer.Attrs.Format()
	if len(v.Producer.Outputs) > 1 {
		for i, o := range v.Producer.Outputs {
			if o == v {
				k += fmt.Sprintf("#%d", i)
			}
		}
	}
	k += "("
	for i, in := range v.Producer.Inputs {
		if i > 0 {
			k += ","
		}
		k += ConstKey(in)
	}
	return k + ")"
}
