package paged

import "math"

// FP8 rows (runtime.kv_dtype fp8) hold each row as float8 e4m3fn codes
// with one fp32 scale per block of FP8Block consecutive values (the last
// block of a row may be shorter): value = e4m3(code) · scale. This is the
// layout of FlashMLA's and vLLM's fp8 "ds_mla" cache row (512 e4m3 codes +
// 4 fp32 scales, one per 128) without its 64 bf16 rope values (this model
// has no rope part: qk_rope_head_dim 0), and of DeepSeek V3.2's indexer
// key cache (128 e4m3 codes + one fp32 scale). The scale of a block is the
// smallest power of two p with amax/p ≤ 448 (UE8M0-style, as DeepSeek's
// quantizers round it), so dividing by it and multiplying back are exact
// and the only error is the rounding of each value to 3 mantissa bits.
// Quantization is lossy: a value x is read back as x' with
// |x − x'| ≤ max(|x|·2⁻⁴, scale·2⁻¹⁰) (half an e4m3 step in the normal
// range, half the subnormal step below it).
const FP8Block = 128

// fp8Max is the largest finite e4m3fn magnitude.
const fp8Max = 448

// FP8Blocks is the number of scale blocks of a row of width values.
func FP8Blocks(width int) int { return (width + FP8Block - 1) / FP8Block }

// FP8RowBytes is the bytes one fp8 row of width values takes: its codes
// (padded to 4 bytes, so that the scales that follow them in a device row
// are aligned) and its fp32 scales. 528 for the latent row of kv_lora_rank
// 512, 132 for an indexer key of 128.
func FP8RowBytes(width int) int { return (width+3)/4*4 + 4*FP8Blocks(width) }

// fp8Table maps an e4m3fn code to its value (exact; 0x7f and 0xff are NaN).
var fp8Table = func() (t [256]float32) {
	for i := range t {
		b := uint8(i)
		exp, mant := int(b>>3)&0xf, int(b&7)
		var v float64
		switch {
		case exp == 0xf && mant == 7:
			v = math.NaN()
		case exp == 0:
			v = math.Ldexp(float64(mant), -9)
		default:
			v = math.Ldexp(float64(8+mant), exp-10)
		}
		if b&0x80 != 0 {
			v = -v
		}
		t[i] = float32(v)
	}
	return
}()

// FP8Decode is an e4m3fn code's value.
func FP8Decode(b uint8) float32 { return fp8Table[b] }

// FP8Encode rounds f to e4m3fn, to nearest even, saturating magnitudes
// beyond 448 (and ±Inf) to ±448; NaN is 0x7f (0xff with the sign bit).
func FP8Encode(f float32) uint8 {
	u := math.Float32bits(f)
	sign := uint8(u>>24) & 0x80
	a := u & 0x7fffffff
	switch {
	case a > 0x7f800000:
		return sign | 0x7f
	case a >= 0x43e00000: // ≥ 448
		return sign | 0x7e
	case a < 0x3c800000: // < 2⁻⁶: the subnormal step 2⁻⁹
		return sign | uint8(math.RoundToEven(float64(math.Float32frombits(a))*512))
	}
	a -= (127 - 7) << 23
	a += 0x7ffff + (a>>20)&1
	return sign | uint8(min(a>>20, 0x7e))
}

// FP8Scale is the scale of a block whose largest magnitude is amax: the
// smallest power of two p with amax/p ≤ 448, at least 2⁻¹²⁶ (1 for a
// zero, NaN or infinite amax, whose codes then saturate or stay NaN).
func FP8Scale(amax float32) float32 {
	if !(amax > 0) || amax > math.MaxFloat32 {
		return 1
	}
	_, e := math.Frexp(float64(amax) / fp8Max) // amax/448 = m·2^e, m ∈ [½, 1)
	p := math.Ldexp(1, e)
	if float64(amax)/(p/2) <= fp8Max {
		p /= 2
	}
	return float32(max(p, 0x1p-126)) // a normal float: its inverse is finite
}

// FP8Quantize writes row (width values) as codes (width bytes) and scales
// (FP8Blocks(width) floats).
func FP8Quantize(codes []byte, scales []float32, row []float32) {
	for b := range FP8Blocks(len(row)) {
		blk := row[b*FP8Block : min((b+1)*FP8Block, len(row))]
		var amax float32
		for _, v := range blk {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		s := FP8Scale(amax)
		scales[b] = s
		inv := 1 / s // a power of two: exact
		c := codes[b*FP8Block:]
		for i, v := range blk {
			c[i] = FP8Encode(v * inv)
		}
	}
}

// FP8Dequantize reads a row of len(dst) values from its codes and scales.
func FP8Dequantize(dst []float32, codes []byte, scales []float32) {
	for b := range FP8Blocks(len(dst)) {
		lo, hi := b*FP8Block, min((b+1)*FP8Block, len(dst))
		s := scales[b]
		for i, c := range codes[lo:hi] {
			dst[lo+i] = fp8Table[c] * s
		}
	}
}
