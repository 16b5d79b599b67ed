//go:build amd64 && !purego

package gemm

// roundBF16AVX512 is Float32sToBF16 over n values, n a multiple of 16
// (AVX-512F; called only where the avx512 kernels are in use).
//
//go:noescape
func roundBF16AVX512(dst *uint16, src *float32, n uintptr)

// roundRowBF16 is Float32sToBF16(dst, src) with AVX-512 for whole vectors.
func roundRowBF16(dst []uint16, src []float32) {
	n := len(src) &^ 15
	if n > 0 {
		roundBF16AVX512(&dst[0], &src[0], uintptr(n))
	}
	Float32sToBF16(dst[n:], src[n:])
}
