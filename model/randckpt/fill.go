package randckpt

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/glmflash/glmflash/model/safetensors"
)

// fillUnit generates the bytes of a unit into data (the weight's) and, for
// an FP8 weight, scale (its block scales'): buffers of exactly their sizes.
// Write's files and Dummy's memory get them alike.
func (g *generator) fillUnit(u unit, data, scale []byte) error {
	s := u.weight
	n := 1
	for _, d := range s.Shape {
		n *= d
	}
	if s.DType == safetensors.F8E4M3 {
		if u.scale == nil || len(s.Shape) != 2 {
			return fmt.Errorf("tensor %s: FP8 weight needs 2 dimensions and a scale", s.Name)
		}
		vals := make([]float32, n)
		g.fill(s.Name, s.Shape, vals)
		quantizeInto(vals, s.Shape[0], s.Shape[1], g.block, data, scale)
		return nil
	}
	if !s.DType.IsFloat() {
		return fmt.Errorf("tensor %s: cannot generate dtype %s", s.Name, s.DType)
	}
	size := s.DType.Size()
	if len(data) != n*size {
		return fmt.Errorf("tensor %s: %d bytes for %d elements of %s", s.Name, len(data), n, s.DType)
	}
	g.generate(s.Name, s.Shape, n, func(off int, part []float32) {
		dst := data[off*size : (off+len(part))*size]
		if s.DType == safetensors.BF16 {
			for i, v := range part {
				binary.LittleEndian.PutUint16(dst[2*i:], safetensors.Float32ToBF16(v))
			}
			return
		}
		for i, v := range part { // bf16-representable values, like the fixture
			part[i] = safetensors.BF16ToFloat32(safetensors.Float32ToBF16(v))
		}
		// Cannot fail: the dtype is a float type and the lengths match.
		_ = safetensors.FromFloat32(s.DType, part, dst)
	})
	return nil
}

// quantize block-quantizes vals [n, k] to e4m3 codes and F32 power-of-two
// block scales of shape [ceil(n/bs0), ceil(k/bs1)].
func quantize(vals []float32, n, k int, bs [2]int) (codes, scaleBytes []byte) {
	sn, sk := (n+bs[0]-1)/bs[0], (k+bs[1]-1)/bs[1]
	codes, scaleBytes = make([]byte, n*k), make([]byte, 4*sn*sk)
	quantizeInto(vals, n, k, bs, codes, scaleBytes)
	return codes, scaleBytes
}

// quantizeInto is quantize into codes [n*k] and scaleBytes [4*sn*sk]. Each
// block's scale is 2^ceil(log2(amax/448)) (pow2Scale) and its codes
// e4m3(w/scale); the rows of a block row are read in order, the amax of
// every block of a row taken on the values' bits (|v| orders as its bits
// for the finite values drawn).
func quantizeInto(vals []float32, n, k int, bs [2]int, codes, scaleBytes []byte) {
	sn, sk := (n+bs[0]-1)/bs[0], (k+bs[1]-1)/bs[1]
	parallelFor(sn, func(br int) {
		r0, r1 := br*bs[0], min((br+1)*bs[0], n)
		amax := make([]uint32, sk)
		for r := r0; r < r1; r++ {
			row := vals[r*k : (r+1)*k]
			for bc := range sk {
				m := amax[bc]
				for _, v := range row[bc*bs[1] : min((bc+1)*bs[1], k)] {
					m = max(m, math.Float32bits(v)&0x7fffffff)
				}
				amax[bc] = m
			}
		}
		inv := make([]float32, sk)
		for bc, m := range amax {
			p := pow2Scale(math.Float32frombits(m))
			binary.LittleEndian.PutUint32(scaleBytes[4*(br*sk+bc):], math.Float32bits(p))
			inv[bc] = 1 / p // exact: p is a power of two
		}
		for r := r0; r < r1; r++ {
			row, out := vals[r*k:(r+1)*k], codes[r*k:(r+1)*k]
			for bc := range sk {
				c0, c1 := bc*bs[1], min((bc+1)*bs[1], k)
				f := inv[bc]
				for c := c0; c < c1; c++ {
					out[c] = e4m3(row[c] * f)
				}
			}
		}
	})
}

// e4m3 is safetensors.Float32ToF8E4M3 with its common case inlined: a
// normal e4m3 value below 448 (rebias the exponent, keep 3 mantissa bits,
// round the other 20 to nearest even); zeros, subnormals, 448 and beyond,
// and NaN take the function.
func e4m3(f float32) uint8 {
	u := math.Float32bits(f)
	a := u & 0x7fffffff
	if a < 0x3c800000 || a >= 0x43e00000 {
		return safetensors.Float32ToF8E4M3(f)
	}
	a -= (127 - 7) << 23
	a += 0x7ffff + (a>>20)&1
	return uint8(u>>24)&0x80 | uint8(min(a>>20, 0x7e))
}
