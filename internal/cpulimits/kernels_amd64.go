//go:build amd64

package cpulimits

import "golang.org/x/sys/cpu"

// accumulators is the number of independent vector accumulators (512-bit
// registers) the AVX-512 compute kernels keep: enough to cover the latency
// of two FMA or VDPBF16PS pipes. The AVX2 kernel keeps 12 (of 16 ymm).
const accumulators = 24

// fmaKernel runs iters iterations of accumulators VFMADD231PS (each lane
// += 1.0·2⁻²⁰) and stores every accumulator to out.
//
//go:noescape
func fmaKernel(iters int, out *[accumulators * 16]float32)

// fmaKernelAVX2 is fmaKernel on 12 ymm accumulators (out[0:96]).
//
//go:noescape
func fmaKernelAVX2(iters int, out *[accumulators * 16]float32)

// bf16Kernel runs iters iterations of accumulators VDPBF16PS (each fp32
// lane += two bf16 products 1.0·2⁻²⁰) and stores every accumulator to out.
//
//go:noescape
func bf16Kernel(iters int, out *[accumulators * 16]float32)

// readKernel sums n bytes (a positive multiple of 512) from p as uint64
// lanes and stores the 8 lane sums to out.
//
//go:noescape
func readKernel(p *uint64, n int, out *[8]uint64)

// readKernelAVX2 is readKernel with 256-bit loads.
//
//go:noescape
func readKernelAVX2(p *uint64, n int, out *[8]uint64)

// ISA names the vector instruction set the probe measures with on this
// CPU: "avx512" (AVX-512F), "avx2" (AVX2 and FMA), or "" (neither).
func ISA() string {
	switch {
	case cpu.X86.HasAVX512F:
		return "avx512"
	case cpu.X86.HasAVX2 && cpu.X86.HasFMA:
		return "avx2"
	}
	return ""
}

// fmaProbe is the FP32 FMA kernel of this CPU's ISA, or why there is none.
func fmaProbe() (probe, string) {
	switch ISA() {
	case "avx512":
		return probe{run: fmaKernel, lanes: accumulators * 16, vw: 16,
			what: "24 independent VFMADD231PS zmm chains (2 FLOPs a lane)"}, ""
	case "avx2":
		return probe{run: fmaKernelAVX2, lanes: 12 * 8, vw: 8,
			what: "12 independent VFMADD231PS ymm chains (2 FLOPs a lane)"}, ""
	}
	return probe{}, "the CPU (or the OS) has neither AVX-512F nor AVX2 with FMA"
}

// haveBF16 reports whether the VDPBF16PS kernel can run, or why not.
func haveBF16() (bool, string) {
	if !cpu.X86.HasAVX512F || !cpu.X86.HasAVX512BF16 {
		return false, "the CPU (or the OS) has no AVX512_BF16: VDPBF16PS cannot run"
	}
	return true, ""
}

// readProbe is the read kernel of this CPU's ISA and what it does, or why
// there is none.
func readProbe() (func(p *uint64, n int, out *[8]uint64), string, string) {
	switch ISA() {
	case "avx512":
		return readKernel, "VPADDQ of 64-byte loads", ""
	case "avx2":
		return readKernelAVX2, "VPADDQ of 32-byte loads", ""
	}
	return nil, "", "the CPU (or the OS) has neither AVX-512F nor AVX2"
}
