package safetensors

import (
	"encoding/binary"
	"fmt"
	"math"
)

// BF16ToFloat32 widens a bfloat16 bit pattern to float32 (exact).
func BF16ToFloat32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// Float32ToBF16 rounds f to bfloat16 with round-to-nearest-even. NaNs stay
// NaN (quieted, sign kept); values past the bfloat16 range become ±Inf.
func Float32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN
		return uint16(u>>16) | 0x0040
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// F16ToFloat32 widens an IEEE binary16 bit pattern to float32 (exact,
// subnormals, infinities and NaN payloads included).
func F16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f: // Inf / NaN
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	default: // subnormal: mant × 2^-24
		v := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			v = -v
		}
		return v
	}
}

// Float32ToF16 rounds f to IEEE binary16 with round-to-nearest-even.
// Overflow gives ±Inf, tiny values become subnormals or ±0, NaN stays NaN.
func Float32ToF16(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	a := u & 0x7fffffff
	switch {
	case a > 0x7f800000: // NaN: keep top payload bits, force quiet
		return sign | 0x7e00 | uint16(a>>13)&0x3ff
	case a >= 0x477ff000: // ≥ 65520 rounds to Inf
		return sign | 0x7c00
	case a >= 0x38800000: // normal half (≥ 2^-14)
		// Rebias exponent from 127 to 15 and round the 13 dropped bits.
		a -= (127 - 15) << 23
		a += 0xfff + (a>>13)&1
		return sign | uint16(a>>13)
	case a < 0x33000000: // < 2^-25: rounds to zero (2^-25 itself ties to even = 0)
		return sign
	default: // subnormal half: value / 2^-24, rounded to even
		v := float64(math.Float32frombits(a)) * (1 << 24)
		return sign | uint16(math.RoundToEven(v))
	}
}

// F8E4M3ToFloat32 widens a float8 e4m3fn byte to float32 (exact).
// 0x7F and 0xFF are NaN; there are no infinities.
func F8E4M3ToFloat32(b uint8) float32 { return f8Table[b] }

var f8Table = func() (t [256]float32) {
	for i := range t {
		t[i] = f8Decode(uint8(i))
	}
	return
}()

func f8Decode(b uint8) float32 {
	exp := int(b>>3) & 0xf
	mant := int(b & 7)
	var v float64
	switch {
	case exp == 0xf && mant == 7:
		v = math.NaN()
	case exp == 0:
		v = math.Ldexp(float64(mant), -9) // mant/8 × 2^(1-7)
	default:
		v = math.Ldexp(float64(8+mant), exp-7-3)
	}
	if b&0x80 != 0 {
		v = -v
	}
	return float32(v)
}

// F8E4M3Max is the largest finite float8 e4m3fn magnitude.
const F8E4M3Max = 448

// Float32ToF8E4M3 rounds f to float8 e4m3fn with round-to-nearest-even,
// saturating magnitudes above 448 (and ±Inf) to ±448. NaN becomes 0x7F
// (0xFF when the sign bit is set).
func Float32ToF8E4M3(f float32) uint8 {
	u := math.Float32bits(f)
	sign := uint8(u>>24) & 0x80
	a := u & 0x7fffffff
	if a > 0x7f800000 {
		return sign | 0x7f
	}
	if a >= 0x43e00000 { // ≥ 448 (incl. Inf)
		return sign | 0x7e
	}
	if a < 0x3c800000 { // < 2^-6: subnormal range, step 2^-9
		v := float64(math.Float32frombits(a)) * 512
		return sign | uint8(math.RoundToEven(v)) // 8 encodes 2^-6 correctly
	}
	// Normal: rebias exponent 127→7, keep 3 mantissa bits, round the other 20.
	a -= (127 - 7) << 23
	a += 0x7ffff + (a>>20)&1
	code := a >> 20
	if code > 0x7e {
		code = 0x7e
	}
	return sign | uint8(code)
}

// ToFloat32 converts raw little-endian tensor bytes of type dt into dst,
// which must have exactly len(raw)/dt.Size() elements. Supported types are
// F32, F16, BF16, F8E4M3 and F64.
func ToFloat32(dt DType, raw []byte, dst []float32) error {
	size := dt.Size()
	if !dt.IsFloat() {
		return fmt.Errorf("cannot convert dtype %s to float32", dt)
	}
	if len(raw) != len(dst)*size {
		return fmt.Errorf("%d bytes of %s do not hold %d elements", len(raw), dt, len(dst))
	}
	switch dt {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(raw[2*i:])) << 16)
		}
	case F16:
		for i := range dst {
			dst[i] = F16ToFloat32(binary.LittleEndian.Uint16(raw[2*i:]))
		}
	case F8E4M3:
		for i, b := range raw {
			dst[i] = f8Table[b]
		}
	case F64:
		for i := range dst {
			dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(raw[8*i:])))
		}
	}
	return nil
}

// FromFloat32 encodes src as dt into dst, which must have exactly
// len(src)*dt.Size() bytes. Supported types are F32, F16, BF16 (round to
// nearest even), F8E4M3 (round to nearest even, saturating) and F64.
func FromFloat32(dt DType, src []float32, dst []byte) error {
	if !dt.IsFloat() {
		return fmt.Errorf("cannot convert float32 to dtype %s", dt)
	}
	if len(dst) != len(src)*dt.Size() {
		return fmt.Errorf("%d bytes of %s do not hold %d elements", len(dst), dt, len(src))
	}
	switch dt {
	case F32:
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	case BF16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], Float32ToBF16(v))
		}
	case F16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], Float32ToF16(v))
		}
	case F8E4M3:
		for i, v := range src {
			dst[i] = Float32ToF8E4M3(v)
		}
	case F64:
		for i, v := range src {
			binary.LittleEndian.PutUint64(dst[8*i:], math.Float64bits(float64(v)))
		}
	}
	return nil
}
