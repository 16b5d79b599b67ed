//go:build amd64

package cpulimits

import "golang.org/x/sys/cpu"

// accumulators is the number of independent vector accumulators (512-bit
// registers) the compute kernels keep: enough to cover the latency of two
// FMA or VDPBF16PS pipes.
const accumulators = 24

// fmaKernel runs iters iterations of accumulators VFMADD231PS (each lane
// += 1.0·2⁻²⁰) and stores every accumulator to out.
//
//go:noescape
func fmaKernel(iters int, out *[accumulators * 16]float32)

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

// haveFMA reports whether the FP32 FMA kernel can run, or why not.
func haveFMA() (bool, string) {
	if !cpu.X86.HasAVX512F {
		return false, "the CPU (or the OS) has no AVX-512F"
	}
	return true, ""
}

// haveBF16 reports whether the VDPBF16PS kernel can run, or why not.
func haveBF16() (bool, string) {
	if !cpu.X86.HasAVX512F || !cpu.X86.HasAVX512BF16 {
		return false, "the CPU (or the OS) has no AVX512_BF16: VDPBF16PS cannot run"
	}
	return true, ""
}

// haveRead reports whether the read kernel can run, or why not.
func haveRead() (bool, string) { return haveFMA() }
