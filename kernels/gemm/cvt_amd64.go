//go:build amd64 && !purego

package gemm

import "golang.org/x/sys/cpu"

// roundBF16AVX512 is Float32sToBF16 over n values, n a multiple of 16
// (AVX-512F: call it only where roundAVX512 holds).
//
//go:noescape
func roundBF16AVX512(dst *uint16, src *float32, n uintptr)

// roundAVX512 says whether roundBF16AVX512 may run on this CPU.
var roundAVX512 = cpu.X86.HasAVX512F

// roundRowBF16 is Float32sToBF16(dst, src), with AVX-512 for whole vectors
// where the CPU has it.
func roundRowBF16(dst []uint16, src []float32) {
	n := len(src) &^ 15
	if !roundAVX512 {
		n = 0
	}
	if n > 0 {
		roundBF16AVX512(&dst[0], &src[0], uintptr(n))
	}
	Float32sToBF16(dst[n:], src[n:])
}
