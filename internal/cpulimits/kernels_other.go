//go:build !amd64

package cpulimits

const accumulators = 24

func bf16Kernel(iters int, out *[accumulators * 16]float32) { panic("cpulimits: amd64 only") }

// ISA is "" off amd64: the probe's kernels are amd64 assembly.
func ISA() string { return "" }

func fmaProbe() (probe, string) { return probe{}, "the probe's kernels are amd64 assembly" }
func haveBF16() (bool, string)  { return false, "the probe's kernels are amd64 assembly" }
func readProbe() (func(p *uint64, n int, out *[8]uint64), string, string) {
	return nil, "", "the probe's kernels are amd64 assembly"
}
