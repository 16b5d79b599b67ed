//go:build amd64 && !purego

package gemm

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:generate go run gen_asm.go

// simdImpls returns the SIMD implementations this CPU supports, best last.
//
// Tile shapes (rows of activations × rows of weights per microkernel call):
// 4×6 for row blocks of 4+ (24 zmm accumulators: 10 loads per 24 FMAs), 2×8
// for 2-3 rows, 1×8 for a GEMV (8 weight streams in flight). AVX2 has half
// the registers: 4×2, 2×6, 1×8. Measured on Zen 4 (where a zmm FMA issues
// as two ymm halves) both reach ~108 GFLOP/s per core from cache; taller
// tiles (8×3) and K blocking did not pay.
func simdImpls() []*impl {
	var ims []*impl
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		ims = append(ims, &impl{name: "avx2", simd: &simdImpl{
			vw:    8,
			f32:   &f32_avx2,
			bf16:  &bf16_avx2,
			rows:  []int{4, 2, 1},
			cTile: [5]int{1: 8, 2: 6, 4: 2},
			axpy:  axpy_avx2,
			pack:  pack_avx2,
		}})
	}
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL &&
		cpu.X86.HasAVX512BW && cpu.X86.HasAVX512DQ {
		var bb *kernelSet
		if cpu.X86.HasAVX512BF16 {
			bb = &bb_avx512
		}
		ims = append(ims, &impl{name: "avx512", simd: &simdImpl{
			bb:       bb,
			f8:       &f8_avx512,
			vw:       16,
			maskTail: true,
			f32:      &f32_avx512,
			bf16:     &bf16_avx512,
			rows:     []int{4, 2, 1},
			cTile:    [5]int{1: 8, 2: 8, 4: 6},
			axpy:     axpy_avx512,
			pack:     pack_avx512,
		}})
	}
	return ims
}

// dot runs the 1×1 fp32 microkernel of s (a dot product of nvec vectors
// plus the tail) into *r. It calls the assembly directly rather than
// through the kernel table: a call through a function value makes the
// compiler assume the arguments escape, so Dot's result would be
// heap-allocated on every call; the assembly is go:noescape.
func (s *simdImpl) dot(a, b, r unsafe.Pointer, nvec, tail uintptr) {
	if s.maskTail { // AVX-512 (the only set with lane-mask tails)
		f32_avx512_r1c1(a, b, r, 0, 0, nvec, tail, 0)
		return
	}
	f32_avx2_r1c1(a, b, r, 0, 0, nvec, tail, 0)
}

// dequantFP8AVX512 is dequantFP8Go over n codes, n a multiple of 16.
//
//go:noescape
func dequantFP8AVX512(dst *float32, src *byte, n uintptr, s float32)

var fp8AVX512 = cpu.X86.HasAVX512F

// fp8FastAVX512: dequantFP8FastAVX512 needs AVX-512 BW and VL (VPMOVSXBW to
// a ymm with EVEX).
var fp8FastAVX512 = cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL

// dequantFP8 writes dst[i] = e4m3(src[i]) · s (exact value, one float32
// multiplication), 16 codes per AVX-512 step where available.
func dequantFP8(dst []float32, src []byte, s float32) {
	n := 0
	if fp8AVX512 {
		n = len(src) &^ 15
		if n > 0 {
			_ = dst[n-1]
			dequantFP8AVX512(&dst[0], &src[0], uintptr(n), s)
		}
	}
	dequantFP8Go(dst[n:], src[n:], s)
}

// dequantFP8FastAVX512 is dequantFP8Go over n codes, n a multiple of 16,
// for codes and a scale that FP8.fastOK admits.
//
//go:noescape
func dequantFP8FastAVX512(dst *float32, src *byte, n uintptr, s float32)

// dequantFP8Fast is dequantFP8 for codes and a scale that FP8.fastOK
// admits (no NaN code, s·2^8 finite where s is).
func dequantFP8Fast(dst []float32, src []byte, s float32) {
	n := 0
	if fp8FastAVX512 {
		n = len(src) &^ 15
		if n > 0 {
			_ = dst[n-1]
			dequantFP8FastAVX512(&dst[0], &src[0], uintptr(n), s)
		}
	}
	dequantFP8Go(dst[n:], src[n:], s)
}

// dequantFP8RowAVX512 dequantizes nvec vectors of 16 codes, vector v
// scaled by sc[v/vpb], for codes and scales that FP8.fastOK admits.
//
//go:noescape
func dequantFP8RowAVX512(dst *float32, src *byte, sc *float32, nvec, vpb uintptr)

// dequantFP8RowFast dequantizes the first len(src)&^15 codes of a row
// whose scale blocks are bc codes wide (sc[b] for block b) when bc is a
// multiple of 16 and AVX-512 is there, returning how many it did.
func dequantFP8RowFast(dst []float32, src []byte, sc []float32, bc int) int {
	n := len(src) &^ 15
	if !fp8FastAVX512 || bc%16 != 0 || n == 0 {
		return 0
	}
	_, _ = dst[n-1], sc[(n-1)/bc]
	dequantFP8RowAVX512(&dst[0], &src[0], &sc[0], uintptr(n/16), uintptr(bc/16))
	return n
}
