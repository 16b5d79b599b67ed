//go:build amd64

package cpulimits

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/cpu"
)

// The kernels' stored results are what the work gives, so a kernel that
// skipped iterations would be caught.
func TestKernelsStoreTheirWork(t *testing.T) {
	type readFn = func(p *uint64, n int, out *[8]uint64)
	var fmas []func(int, *[accumulators * 16]float32)
	var lanes []int
	var reads []readFn
	// every kernel this CPU can run, not only the one Measure picks: the
	// AVX2 kernels run on AVX-512 CPUs too
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		fmas, lanes, reads = append(fmas, fmaKernelAVX2), append(lanes, 96), append(reads, readKernelAVX2)
	}
	if cpu.X86.HasAVX512F {
		fmas, lanes, reads = append(fmas, fmaKernel), append(lanes, accumulators*16), append(reads, readKernel)
	}
	if len(fmas) == 0 {
		t.Skip("the CPU has neither AVX2 + FMA nor AVX-512F")
	}
	for i, k := range fmas {
		var out [accumulators * 16]float32
		k(1000, &out)
		for j, v := range out {
			if j < lanes[i] {
				require.Equal(t, float32(1000.0/(1<<20)), v, "kernel %d lane %d", i, j)
			} else {
				require.Zero(t, v, "kernel %d wrote past its %d lanes", i, lanes[i])
			}
		}
	}
	if ok, _ := haveBF16(); ok {
		var out [accumulators * 16]float32
		bf16Kernel(1000, &out)
		for _, v := range out {
			require.Equal(t, float32(2000.0/(1<<20)), v)
		}
	}
	buf := make([]uint64, 1024)
	for i := range buf {
		buf[i] = uint64(i) * 3
	}
	for _, rk := range reads {
		var sums [8]uint64
		rk(&buf[0], 8*len(buf), &sums)
		var got uint64
		for _, v := range sums {
			got += v
		}
		require.Equal(t, uint64(3*1023*1024/2), got)
	}
}
