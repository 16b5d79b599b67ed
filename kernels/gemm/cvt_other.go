//go:build !amd64 || purego

package gemm

// roundRowBF16 is Float32sToBF16 (the VDPBF16PS kernels, its only SIMD
// caller, exist on amd64 only).
func roundRowBF16(dst []uint16, src []float32) { Float32sToBF16(dst, src) }
