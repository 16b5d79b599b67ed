//go:build !amd64

package cpulimits

const accumulators = 24

func fmaKernel(iters int, out *[accumulators * 16]float32)  { panic("cpulimits: amd64 only") }
func bf16Kernel(iters int, out *[accumulators * 16]float32) { panic("cpulimits: amd64 only") }
func readKernel(p *uint64, n int, out *[8]uint64)           { panic("cpulimits: amd64 only") }

func haveFMA() (bool, string)  { return false, "the probe's kernels are amd64 assembly" }
func haveBF16() (bool, string) { return false, "the probe's kernels are amd64 assembly" }
func haveRead() (bool, string) { return false, "the probe's kernels are amd64 assembly" }
