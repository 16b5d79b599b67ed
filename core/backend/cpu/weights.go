package cpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/kernels/parallel"
	"github.com/glmflash/glmflash/model/safetensors"
)

// Memory categories of the CPU backend's weights (Info().Memory keys).
const (
	// MemBF16Mapped is bf16 GEMM weights read in place from the checkpoint's
	// read-only mapping (no copy: the pages are the file's).
	MemBF16Mapped = "weights_bf16_mapped"
	// MemBF16 is bf16 weights copied once at load, off the Go heap (an
	// anonymous read-only mapping, see allocBF16): parts of a concat/stack
	// that are not one contiguous mapping, slice_cols, FP8 weights of the
	// ops that take no FP8 (embedding, linear_batched, a slice_cols input)
	// dequantized once; and, on the heap, the rare weights that had to go
	// through float32.
	MemBF16 = "weights_bf16"
	// MemFP32 is float32 constants: small vectors (norms, biases, conv and
	// mHC parameters), the weights of fp32 kernels and GEMM weights that
	// are not bf16-exact (or all of them under FP32Weights).
	MemFP32 = "weights_fp32"
	// MemFP8 is FP8 e4m3 weights (MoE experts, and the weights of linear
	// and linear_split) used as stored, in the checkpoint's mapping,
	// dequantized a tile at a time inside the GEMMs; MemFP8Scales is their
	// float32 block scales (on the heap).
	MemFP8       = "weights_fp8"
	MemFP8Scales = "weights_fp8_scales"
)

// weights is the constants the CPU backend has bound, shared by every
// program of one backend: keyed by the plan's Source and plan.ConstKey, so
// the programs of one engine (one per batch mode) hold one copy.
type weights struct {
	mu    sync.Mutex
	ids   map[any]int
	m     map[string]*boundWeight
	bytes map[string]int64
	anon  [][]uint16 // bf16 copies in anonymous mappings (allocBF16)
}

// boundWeight is one bound constant: bf16 bits (bf, a GEMM weight that is
// exactly bf16; or parts, one slice per matrix of a stacked weight),
// float32 values (f) or FP8 matrices as stored (fp8).
type boundWeight struct {
	bf    []uint16
	parts [][]uint16
	f     []float32
	// fp8 is one matrix per expert of a stacked FP8 weight (stacked), or
	// the stored matrices of a 2-D one stacked by rows (linear: one
	// checkpoint tensor, or the inputs of a concat_rows).
	fp8 []*gemm.FP8
}

func newWeights() *weights {
	return &weights{ids: map[any]int{}, m: map[string]*boundWeight{}, bytes: map[string]int64{}}
}

// close unmaps the bf16 copies; the bound weights are gone.
func (w *weights) close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var err error
	for _, a := range w.anon {
		if e := freeBF16(a); err == nil {
			err = e
		}
	}
	w.anon = nil
	w.m = map[string]*boundWeight{}
	w.bytes = map[string]int64{}
	return err
}

// copyBF16 returns n bf16 values off the heap filled by fill, read-only
// afterwards; nil (and no error) when fill reports false.
func (w *weights) copyBF16(n int, fill func([]uint16) bool) ([]uint16, error) {
	b, err := allocBF16(n)
	if err != nil {
		return nil, err
	}
	if !fill(b) {
		return nil, freeBF16(b)
	}
	if err := sealBF16(b); err != nil {
		return nil, errors.Join(err, freeBF16(b))
	}
	w.anon = append(w.anon, b)
	return b, nil
}

// memory returns a copy of the bytes held by category.
func (w *weights) memory() map[string]int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]int64, len(w.bytes))
	for k, n := range w.bytes {
		out[k] = n
	}
	return out
}

// key names constant v of plan p among the backend's bound constants.
func (w *weights) key(p *plan.Plan, v *ir.Value, kind string) string {
	id, ok := w.ids[p.Source()]
	if !ok {
		id = len(w.ids)
		w.ids[p.Source()] = id
	}
	return fmt.Sprintf("%d|%s|%s", id, kind, plan.ConstKey(v))
}

// float32 returns the float32 values of constant v (loaded through the
// plan once per backend).
func (w *weights) float32(p *plan.Plan, v *ir.Value) ([]float32, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.float32Locked(p, v)
}

func (w *weights) float32Locked(p *plan.Plan, v *ir.Value) ([]float32, error) {
	k := w.key(p, v, "f32")
	if b, ok := w.m[k]; ok {
		return b.f, nil
	}
	d, err := p.ConstErr(v)
	if err != nil {
		return nil, err
	}
	if d == nil {
		return nil, fmt.Errorf("%s is not a constant", v.Name)
	}
	w.m[k] = &boundWeight{f: d}
	w.bytes[MemFP32] += 4 * int64(len(d))
	return d, nil
}

// gemm returns GEMM weight v: bf16 bits when every value is exactly
// bf16 (and not fp32Only), else float32. A BF16 checkpoint's weight is its
// mapped bytes in place when its parts lie end to end in one mapping, else
// one packed copy; an FP8 weight (of an op that cannot take FP8: linear
// and linear_split bind through linear) is dequantized once into bf16
// (exact: the same float32 values Const would give, kept only when each is
// bf16-representable, which power-of-two block scales guarantee). Anything
// else goes through the plan's float32 values (Const).
func (w *weights) gemm(p *plan.Plan, v *ir.Value, fp32Only bool) (*boundWeight, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gemmLocked(p, v, fp32Only)
}

func (w *weights) gemmLocked(p *plan.Plan, v *ir.Value, fp32Only bool) (*boundWeight, error) {
	kind := "gemm"
	if fp32Only {
		kind = "gemm-f32"
	}
	k := w.key(p, v, kind)
	if b, ok := w.m[k]; ok {
		return b, nil
	}
	b, err := w.bind(p, v, fp32Only)
	if err != nil {
		return nil, err
	}
	w.m[k] = b
	return b, nil
}

// linear returns the weight of a linear or linear_split ([N][K]): FP8
// matrices as stored when the checkpoint holds it as F8_E4M3 (one tensor,
// or the concat_rows of several: one matrix per part, each read where it
// is, with its own block scales), else as gemm binds it. An FP8 weight is
// then never widened: the products dequantize it a tile at a time.
func (w *weights) linear(p *plan.Plan, v *ir.Value, fp32Only bool) (*boundWeight, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !fp32Only && len(v.Shape) == 2 {
		k := w.key(p, v, "fp8")
		if b, ok := w.m[k]; ok {
			return b, nil
		}
		raw, err := p.Raw(v)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", v.Name, err)
		}
		if b := w.denseFP8(raw, v.Shape[0], v.Shape[1]); b != nil {
			w.m[k] = b
			return b, nil
		}
	}
	return w.gemmLocked(p, v, fp32Only)
}

// denseFP8 binds a 2-D FP8 weight [N][K] stored as F8_E4M3 matrices of K
// columns stacked by rows (fp8Parts). nil when raw is not that.
func (w *weights) denseFP8(raw *plan.RawTensor, N, K int) *boundWeight {
	if !fp8PartsOK(raw, K) {
		return nil
	}
	rows := 0
	for _, pt := range raw.Parts {
		rows += pt.Rows
	}
	if rows != N {
		return nil
	}
	return w.fp8Parts(raw, K)
}

// fp8PartsOK reports whether raw is F8_E4M3 matrices of C columns, each
// with its block scales.
func fp8PartsOK(raw *plan.RawTensor, C int) bool {
	if raw == nil || raw.DType != safetensors.F8E4M3 || raw.Block[0] <= 0 || raw.Block[1] <= 0 {
		return false
	}
	sc := (C + raw.Block[1] - 1) / raw.Block[1]
	for _, pt := range raw.Parts {
		if pt.Cols != C || pt.Rows <= 0 || len(pt.Data) != pt.Rows*C || len(pt.Scales) != (pt.Rows+raw.Block[0]-1)/raw.Block[0]*sc {
			return false
		}
	}
	return true
}

// fp8Parts binds raw's parts (fp8PartsOK) as one gemm.FP8 each: the codes
// stay in the checkpoint's mapping, the scales are the plan's float32 copy.
func (w *weights) fp8Parts(raw *plan.RawTensor, C int) *boundWeight {
	sc := (C + raw.Block[1] - 1) / raw.Block[1]
	b := &boundWeight{}
	for _, pt := range raw.Parts {
		b.fp8 = append(b.fp8, &gemm.FP8{Codes: pt.Data, Scales: pt.Scales, BlockRows: raw.Block[0], BlockCols: raw.Block[1], ScaleCols: sc})
		w.bytes[MemFP8] += int64(len(pt.Data))
		w.bytes[MemFP8Scales] += 4 * int64(len(pt.Scales))
	}
	return b
}

// stacked returns stacked GEMM weight v ([E][rows][cols], MoE experts) as
// E bf16 matrices, each the checkpoint's mapped bytes in place when it is
// stored as one BF16 tensor (the experts of a stacked weight need not lie
// end to end: a kernel that takes one slice per expert reads each where it
// is), else as gemm binds it; nil parts when it is not bf16-exact (or
// fp32Only): f then holds the float32 values.
func (w *weights) stacked(p *plan.Plan, v *ir.Value, fp32Only bool) (*boundWeight, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !fp32Only && len(v.Shape) == 3 {
		k := w.key(p, v, "parts")
		if b, ok := w.m[k]; ok {
			return b, nil
		}
		raw, err := p.Raw(v)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", v.Name, err)
		}
		E, per := v.Shape[0], v.Shape[1]*v.Shape[2]
		if b := w.stackedFP8(raw, v); b != nil {
			w.m[k] = b
			return b, nil
		}
		whole := raw != nil && raw.DType == safetensors.BF16 && len(raw.Parts) == E
		for i := 0; whole && i < E; i++ {
			whole = len(raw.Parts[i].Data) == 2*per
		}
		if whole {
			b := &boundWeight{}
			for _, pt := range raw.Parts {
				one := &plan.RawTensor{DType: raw.DType, Parts: []plan.RawPart{pt}}
				bf, ok := aliasBF16(one)
				if ok {
					w.bytes[MemBF16Mapped] += int64(len(pt.Data))
				} else {
					if bf, err = w.copyBF16(per, func(b []uint16) bool { packBF16(b, one); return true }); err != nil {
						return nil, err
					}
					w.bytes[MemBF16] += int64(len(pt.Data))
				}
				b.parts = append(b.parts, bf)
			}
			w.m[k] = b
			return b, nil
		}
	}
	b, err := w.gemmLocked(p, v, fp32Only)
	if err != nil || b.bf == nil || len(v.Shape) != 3 {
		return b, err
	}
	per := v.Shape[1] * v.Shape[2]
	out := &boundWeight{bf: b.bf}
	for e := range v.Shape[0] {
		out.parts = append(out.parts, b.bf[e*per:(e+1)*per])
	}
	return out, nil
}

// stackedFP8 binds a stacked FP8 weight stored as one F8_E4M3 matrix per
// expert with its block scales: the codes stay where they are (the
// checkpoint's mapping), the scales are the plan's float32 copy. nil when
// raw is not that.
func (w *weights) stackedFP8(raw *plan.RawTensor, v *ir.Value) *boundWeight {
	R, C := v.Shape[1], v.Shape[2]
	if !fp8PartsOK(raw, C) || len(raw.Parts) != v.Shape[0] {
		return nil
	}
	for _, pt := range raw.Parts {
		if pt.Rows != R {
			return nil
		}
	}
	return w.fp8Parts(raw, C)
}

func (w *weights) bind(p *plan.Plan, v *ir.Value, fp32Only bool) (*boundWeight, error) {
	if !fp32Only {
		raw, err := p.Raw(v)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", v.Name, err)
		}
		if raw != nil {
			switch raw.DType {
			case safetensors.BF16:
				if bf, ok := aliasBF16(raw); ok {
					w.bytes[MemBF16Mapped] += 2 * int64(len(bf))
					return &boundWeight{bf: bf}, nil
				}
				bf, err := w.copyBF16(int(raw.Bytes()/2), func(b []uint16) bool { packBF16(b, raw); return true })
				if err != nil {
					return nil, err
				}
				w.bytes[MemBF16] += 2 * int64(len(bf))
				return &boundWeight{bf: bf}, nil
			case safetensors.F8E4M3:
				bf, err := w.copyBF16(int(raw.Bytes()), func(b []uint16) bool { return dequantFP8BF16(b, raw) })
				if err != nil {
					return nil, err
				}
				if bf != nil {
					w.bytes[MemBF16] += 2 * int64(len(bf))
					return &boundWeight{bf: bf}, nil
				}
			}
		}
		if n := v.Producer; n != nil && n.Op == ir.OpSliceCols && len(n.Inputs[0].Shape) == 2 {
			in, err := w.gemmLocked(p, n.Inputs[0], false)
			if err != nil {
				return nil, err
			}
			if in.bf != nil {
				K, lo, hi := n.Inputs[0].Shape[1], ir.AttrStart.Get(n), ir.AttrEnd.Get(n)
				bf, err := w.copyBF16(len(in.bf)/K*(hi-lo), func(b []uint16) bool { sliceColsBF16(b, in.bf, K, lo, hi); return true })
				if err != nil {
					return nil, err
				}
				w.bytes[MemBF16] += 2 * int64(len(bf))
				return &boundWeight{bf: bf}, nil
			}
		}
	}
	d, err := w.float32Locked(p, v) // the plan (or its WeightCache) keeps d either way
	if err != nil {
		return nil, err
	}
	if !fp32Only {
		if bf := plan.ToBF16Exact(d); bf != nil {
			w.bytes[MemBF16] += 2 * int64(len(bf))
			return &boundWeight{bf: bf}, nil
		}
	}
	return &boundWeight{f: d}, nil
}

// littleEndian: safetensors stores little-endian, so on such a host a BF16
// tensor's bytes are its []uint16 as is.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// aliasBF16 returns a BF16 tensor's parts as one []uint16 over the mapping
// when they lie end to end from a 2-byte aligned start (one leaf, or
// stacked/concatenated tensors stored consecutively). The slice is
// read-only: the mapping is.
func aliasBF16(raw *plan.RawTensor) ([]uint16, bool) {
	n := raw.Bytes()
	if !littleEndian || n == 0 || n%2 != 0 {
		return nil, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(raw.Parts[0].Data)))
	if base%2 != 0 {
		return nil, false
	}
	off := uintptr(0)
	for _, pt := range raw.Parts {
		if len(pt.Data) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(pt.Data))) != base+off {
			return nil, false
		}
		off += uintptr(len(pt.Data))
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(raw.Parts[0].Data))), n/2), true
}

// packBF16 copies a BF16 tensor's parts end to end into out.
func packBF16(out []uint16, raw *plan.RawTensor) {
	o := 0
	for _, pt := range raw.Parts {
		for i := 0; i+1 < len(pt.Data); i += 2 {
			out[o] = binary.LittleEndian.Uint16(pt.Data[i:])
			o++
		}
	}
}

// dequantFP8BF16 dequantizes an FP8 tensor into out as bf16 bits: each
// value is code·scale computed in float32 as the checkpoint's Float32
// computes it, so the result equals Const's values. It reports false as
// soon as one value is not exactly bf16 (the caller then keeps float32).
func dequantFP8BF16(out []uint16, raw *plan.RawTensor) bool {
	bs := raw.Block
	if bs[0] <= 0 || bs[1] <= 0 {
		return false
	}
	o := 0
	for _, pt := range raw.Parts {
		R, C := pt.Rows, pt.Cols
		sk := (C + bs[1] - 1) / bs[1]
		if len(pt.Data) != R*C || len(pt.Scales) != (R+bs[0]-1)/bs[0]*sk {
			return false
		}
		dst := out[o : o+R*C]
		var mu sync.Mutex
		inexact := false
		parallel.For(R, max(1, (1<<16)/max(C, 1)), func(lo, hi int) {
			for r := lo; r < hi; r++ {
				srow := pt.Scales[(r/bs[0])*sk : (r/bs[0]+1)*sk]
				src, d := pt.Data[r*C:(r+1)*C], dst[r*C:(r+1)*C]
				for c, b := range src {
					f := math.Float32bits(safetensors.F8E4M3ToFloat32(b) * srow[c/bs[1]])
					if f&0xFFFF != 0 {
						mu.Lock()
						inexact = true
						mu.Unlock()
						return
					}
					d[c] = uint16(f >> 16)
				}
			}
		})
		if inexact {
			return false
		}
		o += R * C
	}
	return true
}

// sliceColsBF16 copies columns [lo, hi) of a row-major bf16 matrix w with
// K columns into out (slice_cols' fold, on bf16 bits).
func sliceColsBF16(out, w []uint16, K, lo, hi int) {
	for r := range len(w) / K {
		copy(out[r*(hi-lo):(r+1)*(hi-lo)], w[r*K+lo:r*K+hi])
	}
}
