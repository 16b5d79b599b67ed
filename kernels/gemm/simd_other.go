//go:build !amd64 || purego

package gemm

import "unsafe"

func simdImpls() []*impl { return nil }

// dot is never called: without SIMD implementations simdImpl is unused.
func (s *simdImpl) dot(a, b, r unsafe.Pointer, nvec, tail uintptr) {
	panic("gemm: no SIMD kernels in this build")
}

func dequantFP8(dst []float32, src []byte, s float32) { dequantFP8Go(dst, src, s) }

func dequantFP8Fast(dst []float32, src []byte, s float32) { dequantFP8Go(dst, src, s) }

func dequantFP8RowFast(dst []float32, src []byte, sc []float32, bc int) int { return 0 }
