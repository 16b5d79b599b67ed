package parallel

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestForCoversRangeOnce(t *testing.T) {
	for _, n := range []int{0, 1, 7, 100, 1001} {
		for _, grain := range []int{0, 1, 3, 64} {
			hits := make([]int32, n)
			For(n, grain, func(lo, hi int) {
				for i := lo; i < hi; i++ {
					atomic.AddInt32(&hits[i], 1)
				}
			})
			for i, h := range hits {
				require.EqualValues(t, 1, h, "n=%d grain=%d i=%d", n, grain, i)
			}
		}
	}
}

func TestEachCoversRangeOnce(t *testing.T) {
	for _, n := range []int{0, 1, 5, 333} {
		hits := make([]int32, n)
		Each(n, func(i int) { atomic.AddInt32(&hits[i], 1) })
		for i, h := range hits {
			require.EqualValues(t, 1, h, "n=%d i=%d", n, i)
		}
	}
}

// Regions from several goroutines at once, regions nested inside regions,
// and regions after the helpers parked (Spin 0) each cover their range
// exactly once.
func TestConcurrentNestedAndParkedRegions(t *testing.T) {
	if Workers < 2 {
		t.Skip("one core: every region runs inline")
	}
	check := func(n int) {
		hits := make([]int32, n)
		For(n, 1, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				atomic.AddInt32(&hits[i], 1)
			}
		})
		for i, h := range hits {
			require.EqualValues(t, 1, h, "n=%d i=%d", n, i)
		}
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 200; k++ {
				check(1 + k%37)
			}
		}()
	}
	wg.Wait()

	var total atomic.Int64
	Each(9, func(i int) {
		For(100, 7, func(lo, hi int) { total.Add(int64(hi - lo)) })
	})
	require.EqualValues(t, 900, total.Load())

	defer SetSpin(SetSpin(0))
	for k := 0; k < 50; k++ {
		check(64)
		time.Sleep(50 * time.Microsecond) // let the helpers park
	}
}

// BenchmarkRegion is the cost of one small parallel region (what a decode
// step pays per GEMM on top of the arithmetic).
func BenchmarkRegion(b *testing.B) {
	var sink [64]int64
	for _, spin := range []time.Duration{0, DefaultSpin} {
		b.Run(fmt.Sprintf("spin=%v", spin), func(b *testing.B) {
			defer SetSpin(SetSpin(spin))
			for i := 0; i < b.N; i++ {
				For(64, 1, func(lo, hi int) {
					for j := lo; j < hi; j++ {
						sink[j]++
					}
				})
			}
		})
	}
}
