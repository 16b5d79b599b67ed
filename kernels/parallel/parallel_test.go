package parallel

import (
	"fmt"
	"os"
	"os/exec"
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

// GLMFLASH_PARALLEL_POOL=off: no helpers are started, and regions still
// cover their range (run in a child process: the pool starts once).
func TestPoolOff(t *testing.T) {
	if os.Getenv("PARALLEL_POOL_CHILD") == "1" {
		hits := make([]int32, 100)
		For(100, 1, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				atomic.AddInt32(&hits[i], 1)
			}
		})
		for _, h := range hits {
			if h != 1 {
				t.Fatal("range not covered once")
			}
		}
		if thePool() != nil {
			t.Fatal("the pool started although " + PoolEnv + "=off")
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPoolOff$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PARALLEL_POOL_CHILD=1", PoolEnv+"=off")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "PASS")
	if Workers > 1 {
		require.NotNil(t, thePool(), "the pool is on by default")
	}
}

// A many-core machine (GOMAXPROCS=8: 8 workers, 7 helpers, up to 8 chunks a
// region), simulated in a child process: the concurrent, nested and parked
// cases above must hold there too.
func TestManyHelpers(t *testing.T) {
	if os.Getenv("PARALLEL_MANY_CHILD") == "1" {
		if Workers != 8 || len(thePool().helpers) != 7 {
			t.Fatalf("want 8 workers and 7 helpers, got %d and %d", Workers, len(thePool().helpers))
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^(TestManyHelpers|TestConcurrentNestedAndParkedRegions|TestForCoversRangeOnce|TestEachCoversRangeOnce)$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "PARALLEL_MANY_CHILD=1", "GOMAXPROCS=8")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "--- PASS: TestManyHelpers")
	require.Contains(t, string(out), "--- PASS: TestConcurrentNestedAndParkedRegions")
}

type sumArgs struct {
	out []int64
}

func (a *sumArgs) Run(lo, hi int) {
	for i := lo; i < hi; i++ {
		a.out[i] += int64(i)
	}
}

var sumPool Pool[sumArgs]

// Regions on the helper pool allocate nothing: For with a func value made
// once, Each, and ForArgs (whose box is pooled); every index is visited
// once per region.
func TestRegionsDoNotAllocate(t *testing.T) {
	out := make([]int64, 1000)
	a := &sumArgs{out: out}
	fn := a.Run
	each := func(i int) { out[i]++ }
	run := func() {
		For(len(out), 1, fn)
		Each(len(out), each)
		ForArgs(&sumPool, len(out), 1, sumArgs{out: out})
	}
	run()
	if n := testing.AllocsPerRun(50, run); n != 0 && !raceOn {
		t.Fatalf("%v allocations per round", n)
	}
	for i, v := range out {
		if want := int64(52 * (2*i + 1)); v != want {
			t.Fatalf("out[%d] = %d, want %d", i, v, want)
		}
	}
}
