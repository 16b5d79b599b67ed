//go:build linux

package parallel

import (
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// truncatedMapping maps a file of pages pages and truncates it: reading
// any of them then faults (SIGBUS).
func truncatedMapping(t *testing.T, pages int) []byte {
	t.Helper()
	ps := os.Getpagesize()
	p := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(p, make([]byte, pages*ps), 0o644))
	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	m, err := syscall.Mmap(int(f.Fd()), 0, pages*ps, syscall.PROT_READ, syscall.MAP_SHARED)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Munmap(m) })
	require.NoError(t, os.Truncate(p, 0))
	return m
}

var sink atomic.Int64

// regionFault runs a region whose chunk bad reads a truncated mapping and
// returns what the owner recovered and how many chunks ran.
func regionFault(t *testing.T, n, bad int, m []byte, each bool) (r any, ran int64) {
	t.Helper()
	var count atomic.Int64
	body := func(i int) {
		if i == bad {
			sink.Add(int64(m[0])) // faults
		}
		count.Add(1)
	}
	func() {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() { r = recover() }()
		if each {
			Each(n, body)
		} else {
			For(n, 1, func(lo, hi int) {
				for i := lo; i < hi; i++ {
					body(i)
				}
			})
		}
	}()
	return r, count.Load()
}

// A fault on a helper or on the owner reaches the region's caller as a
// recoverable runtime error after every chunk ran; the pool keeps working.
func TestFaultInRegionReachesOwner(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("needs 2 CPUs for a helper to run a chunk")
	}
	m := truncatedMapping(t, 1)
	n := 4 * Workers
	for _, each := range []bool{false, true} {
		for _, bad := range []int{0, n - 1} {
			r, ran := regionFault(t, n, bad, m, each)
			require.NotNil(t, r, "each=%v bad=%d", each, bad)
			f, ok := r.(interface {
				runtime.Error
				Addr() uintptr
			})
			require.True(t, ok, "%T %v", r, r)
			assert.Equal(t, uintptr(unsafe.Pointer(&m[0])), f.Addr())
			if each { // one index a chunk: all but the faulting one ran
				assert.EqualValues(t, n-1, ran)
			} else { // the faulting chunk stops at its fault; the others run
				assert.GreaterOrEqual(t, ran, int64(n-(n+Workers-1)/Workers))
			}
		}
	}
	// the pool is released and serves the next region
	var sum atomic.Int64
	For(n, 1, func(lo, hi int) { sum.Add(int64(hi - lo)) })
	assert.EqualValues(t, n, sum.Load())
	// a busy pool's fresh goroutines too
	p := thePool()
	require.NotNil(t, p)
	p.mu.Lock()
	r, ran := regionFault(t, n, n-1, m, false)
	p.mu.Unlock()
	require.NotNil(t, r)
	assert.GreaterOrEqual(t, ran, int64(n-(n+Workers-1)/Workers))
}
