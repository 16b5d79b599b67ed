package parallel

import (
	"sync/atomic"
	"testing"

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
