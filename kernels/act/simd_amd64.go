//go:build amd64 && !purego

package act

import "golang.org/x/sys/cpu"

//go:generate go run gen_asm.go

// simdImpls returns the SIMD implementations this CPU supports, best last.
func simdImpls() []*vecImpl {
	var ims []*vecImpl
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		ims = append(ims, &vecImpl{name: "avx2", vw: 8,
			exp: exp_avx2, sigmoid: sigmoid_avx2, silu: silu_avx2, softplus: softplus_avx2,
			swiglu: swiglu_avx2, gatesig: gatesig_avx2, gatesp: gatesp_avx2})
	}
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasAVX512F && cpu.X86.HasAVX512DQ {
		ims = append(ims, &vecImpl{name: "avx512", vw: 16,
			exp: exp_avx512, sigmoid: sigmoid_avx512, silu: silu_avx512, softplus: softplus_avx512,
			swiglu: swiglu_avx512, gatesig: gatesig_avx512, gatesp: gatesp_avx512})
	}
	return ims
}
