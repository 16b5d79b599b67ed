// Package parallel splits loops across the machine's cores.
//
// A parallel region runs on the calling goroutine plus a pool of persistent
// helper goroutines (GOMAXPROCS−1 of them, started on first use). After a
// region a helper spins briefly (SetSpin) before it parks, so the back-to-back
// regions of a forward pass (one per GEMM, attention or expert batch) do not
// each pay an OS thread wake-up, which costs tens of microseconds in a VM.
// A region started while the pool is busy (a nested region, or a second
// engine running at the same time) runs on fresh goroutines instead, so
// regions never wait for one another.
package parallel

import (
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Workers is the number of goroutines a region is split over; it defaults
// to GOMAXPROCS. Setting it to 1 makes every kernel run sequentially
// (useful for profiling).
var Workers = runtime.GOMAXPROCS(0)

// DefaultSpin is how long an idle helper keeps polling for the next region
// before it parks.
const DefaultSpin = 50 * time.Microsecond

var spinNS atomic.Int64

func init() { spinNS.Store(int64(DefaultSpin)) }

// SetSpin sets how long idle helpers poll before parking and returns the
// previous value. Zero parks at once (every region then wakes its helpers).
func SetSpin(d time.Duration) time.Duration { return time.Duration(spinNS.Swap(int64(d))) }

// For calls fn(lo, hi) over disjoint sub-ranges covering [0, n). Ranges have
// at least grain elements so that tiny loops are not split. It returns when
// every call has returned.
func For(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	w := Workers
	if max := (n + grain - 1) / grain; w > max {
		w = max
	}
	if w <= 1 {
		fn(0, n)
		return
	}
	chunk := (n + w - 1) / w
	run(&job{fn: fn, n: n, chunk: chunk, chunks: int64((n + chunk - 1) / chunk)})
}

// Each calls fn(i) for every i in [0, n), spreading the calls over the
// workers one index at a time (for uneven work such as MoE experts).
func Each(n int, fn func(i int)) {
	if n <= 0 {
		return
	}
	if Workers <= 1 || n == 1 {
		for i := 0; i < n; i++ {
			fn(i)
		}
		return
	}
	run(&job{fn: func(lo, hi int) {
		for i := lo; i < hi; i++ {
			fn(i)
		}
	}, n: n, chunk: 1, chunks: int64(n)})
}

// job is one parallel region: chunks of [0, n), taken one at a time.
type job struct {
	fn     func(lo, hi int)
	n      int
	chunk  int
	chunks int64
	next   atomic.Int64 // next chunk to take
	done   atomic.Int64 // chunks finished
}

// work takes and runs chunks until none is left.
func (j *job) work() {
	for {
		c := j.next.Add(1) - 1
		if c >= j.chunks {
			return
		}
		lo := int(c) * j.chunk
		j.fn(lo, min(lo+j.chunk, j.n))
		j.done.Add(1)
	}
}

// run executes j on the calling goroutine and the pool's helpers, or on
// fresh goroutines when the pool is busy.
func run(j *job) {
	p := thePool()
	if p == nil || !p.mu.TryLock() {
		spawn(j)
		return
	}
	defer p.mu.Unlock()
	p.cur.Store(j)
	p.gen.Add(1)
	// wake no more parked helpers than there are chunks for (on a many-core
	// machine a small region must not pay for waking every core)
	need := int(j.chunks) - 1
	for _, h := range p.helpers {
		if need == 0 {
			break
		}
		if h.parked.Load() {
			select {
			case h.wake <- struct{}{}:
			default: // a wake-up is already pending
			}
		}
		need--
	}
	j.work()
	for j.done.Load() < j.chunks {
		runtime.Gosched() // a helper is finishing its last chunk
	}
}

// spawn runs j with one goroutine per chunk beyond the first, which the
// caller runs.
func spawn(j *job) {
	w := int(j.chunks)
	if w > Workers {
		w = Workers
	}
	var wg sync.WaitGroup
	for i := 1; i < w; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j.work()
		}()
	}
	j.work()
	wg.Wait()
}

// pool is the set of persistent helpers; mu is held by the region that
// owns them.
type pool struct {
	mu      sync.Mutex
	gen     atomic.Uint64       // bumped when a region is published
	cur     atomic.Pointer[job] // the latest region
	helpers []*helper
}

type helper struct {
	parked atomic.Bool
	wake   chan struct{}
}

var (
	poolOnce sync.Once
	global   *pool
)

// PoolEnv is the environment variable that, set to "off", turns the helper
// pool off: every region then starts its own goroutines (to measure what
// the pool buys).
const PoolEnv = "GLMFLASH_PARALLEL_POOL"

// thePool starts the helpers on first use (nil on a single-core machine, or
// when PoolEnv is "off").
func thePool() *pool {
	poolOnce.Do(func() {
		n := runtime.GOMAXPROCS(0) - 1
		if n < 1 || os.Getenv(PoolEnv) == "off" {
			return
		}
		global = &pool{}
		for i := 0; i < n; i++ {
			h := &helper{wake: make(chan struct{}, 1)}
			global.helpers = append(global.helpers, h)
			go global.serve(h)
		}
	})
	return global
}

// serve is a helper's loop: run each published region's chunks; between
// regions poll for Spin, then park until woken.
func (p *pool) serve(h *helper) {
	seen := p.gen.Load()
	for {
		if g := p.gen.Load(); g != seen {
			seen = g
			if j := p.cur.Load(); j != nil {
				j.work()
			}
			continue
		}
		if spin := time.Duration(spinNS.Load()); spin > 0 {
			deadline := time.Now().Add(spin)
			for p.gen.Load() == seen && time.Now().Before(deadline) {
				runtime.Gosched()
			}
			if p.gen.Load() != seen {
				continue
			}
		}
		// Park. The publisher bumps gen before it reads parked, and we set
		// parked before we re-read gen, so one of us sees the other.
		h.parked.Store(true)
		if p.gen.Load() == seen {
			<-h.wake
		}
		h.parked.Store(false)
	}
}

// HelperFunc names the helpers' loop function, for goroutine leak checkers
// (goleak.IgnoreAnyFunction): the helpers live as long as the process.
const HelperFunc = "github.com/glmflash/glmflash/kernels/parallel.(*pool).serve"
