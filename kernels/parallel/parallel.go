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
	"runtime/debug"
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
// every call has returned. A region run on the helper pool allocates
// nothing (pass a func value made once, such as a method value kept in a
// workspace, to keep the caller from allocating a closure per call).
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
	run(fn, nil, n, chunk, (n+chunk-1)/chunk)
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
	run(nil, fn, n, 1, n)
}

// genShift splits a job's state words: the region's generation above it,
// a chunk index (or count) below.
const (
	genShift  = 24
	chunkMask = 1<<genShift - 1
)

// A memory fault in a region's body (a goroutine running with
// debug.SetPanicOnFault(true) reading a memory-mapped file truncated under
// it: SIGBUS) is recovered where it happens, the region's other chunks
// still run to the end, and the owner of the region re-panics with the
// first fault once every chunk is done: the caller, which set
// SetPanicOnFault on its own goroutine, recovers it as if its own read had
// faulted. The helpers run with SetPanicOnFault on; any other panic is not
// recovered (it ends the process, as before).

// isFault reports whether r, recovered from a panic, is a memory fault.
func isFault(r any) bool {
	_, ok := r.(interface {
		runtime.Error
		Addr() uintptr
	})
	return ok
}

// job is one parallel region: chunks of [0, n), taken one at a time. The
// pool's job is reused by every region it runs: state and lim carry the
// region's generation beside the next chunk and the chunk count, so a
// helper still holding a finished region's generation takes nothing from
// the next one (it reads fn, n and chunk only after a successful
// compare-and-swap of its own generation, and the owner rewrites them only
// once every chunk of the previous region is done).
type job struct {
	fn     func(lo, hi int)
	each   func(i int)
	n      int
	chunk  int
	state  atomic.Uint64       // gen<<genShift | next chunk to take
	lim    atomic.Uint64       // gen<<genShift | chunks
	done   atomic.Int64        // chunks finished in this generation
	chunks int64               // owner's copy of the chunk count
	fault  atomic.Pointer[any] // the first memory fault of this generation
}

// set prepares j for generation gen (before it is published).
func (j *job) set(fn func(lo, hi int), each func(i int), n, chunk, chunks int, gen uint64) {
	j.fn, j.each, j.n, j.chunk, j.chunks = fn, each, n, chunk, int64(chunks)
	j.done.Store(0)
	j.fault.Store(nil)
	j.lim.Store(gen<<genShift | uint64(chunks))
	j.state.Store(gen << genShift)
}

// work takes and runs generation gen's chunks until none is left.
func (j *job) work(gen uint64) {
	for {
		v := j.state.Load()
		if v>>genShift != gen {
			return
		}
		l := j.lim.Load()
		if l>>genShift != gen || v&chunkMask >= l&chunkMask {
			return
		}
		if !j.state.CompareAndSwap(v, v+1) {
			continue
		}
		lo := int(v&chunkMask) * j.chunk
		hi := min(lo+j.chunk, j.n)
		j.chunk1(lo, hi)
		j.done.Add(1)
	}
}

// chunk1 runs one chunk, recording a memory fault instead of dying of it.
func (j *job) chunk1(lo, hi int) {
	defer func() {
		if r := recover(); r != nil {
			j.record(r)
		}
	}()
	if j.fn != nil {
		j.fn(lo, hi)
		return
	}
	for i := lo; i < hi; i++ {
		j.each(i)
	}
}

// record keeps the region's first fault, and re-panics with any other panic.
func (j *job) record(r any) {
	if !isFault(r) {
		panic(r)
	}
	j.fault.CompareAndSwap(nil, &r)
}

// rethrow re-panics, on the region's owner, with the region's first fault.
func (j *job) rethrow() {
	if r := j.fault.Load(); r != nil {
		panic(*r)
	}
}

// run executes a region on the calling goroutine and the pool's helpers, or
// on fresh goroutines when the pool is busy.
func run(fn func(lo, hi int), each func(i int), n, chunk, chunks int) {
	p := thePool()
	if p == nil || chunks > chunkMask || !p.mu.TryLock() {
		j := new(job)
		j.set(fn, each, n, chunk, chunks, 1)
		spawn(j, 1)
		j.rethrow()
		return
	}
	defer p.mu.Unlock()
	j := &p.job
	p.seq++
	gen := p.seq & (1<<(64-genShift) - 1)
	j.set(fn, each, n, chunk, chunks, gen)
	p.gen.Store(gen)
	// wake no more parked helpers than there are chunks for (on a many-core
	// machine a small region must not pay for waking every core)
	need := chunks - 1
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
	j.work(gen)
	for j.done.Load() < j.chunks {
		runtime.Gosched() // a helper is finishing its last chunk
	}
	j.fn, j.each = nil, nil
	if fault := j.fault.Swap(nil); fault != nil {
		panic(*fault) // the pool is released (deferred) as the panic unwinds
	}
}

// spawn runs j (generation gen) with one goroutine per chunk beyond the
// first, which the caller runs.
func spawn(j *job, gen uint64) {
	w := int(j.chunks)
	if w > Workers {
		w = Workers
	}
	var wg sync.WaitGroup
	for i := 1; i < w; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			debug.SetPanicOnFault(true)
			j.work(gen)
		}()
	}
	j.work(gen)
	wg.Wait()
}

// pool is the set of persistent helpers; mu is held by the region that
// owns them.
type pool struct {
	mu      sync.Mutex
	gen     atomic.Uint64 // the latest region's generation
	seq     uint64        // generations handed out (owned by mu's holder)
	job     job           // the region being run (reused)
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
	debug.SetPanicOnFault(true) // a fault in a chunk goes to the region's owner
	seen := p.gen.Load()
	for {
		if g := p.gen.Load(); g != seen {
			seen = g
			p.job.work(g)
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

// Body is a parallel region's arguments with the loop body over them.
type Body interface{ Run(lo, hi int) }

// Pool keeps the boxes ForArgs copies a region's arguments into: declare
// one per argument type (a package variable); its zero value is ready.
type Pool[A any] struct{ p sync.Pool }

type box[A any, PA interface {
	*A
	Body
}] struct {
	a  A
	fn func(lo, hi int)
}

// ForArgs is For over a body given by value: args is copied into a box
// from pool (made once, with its func value), so that the call allocates
// nothing in the steady state, unlike a closure handed to For, which
// escapes to the heap with every variable it captures.
func ForArgs[A any, PA interface {
	*A
	Body
}](pool *Pool[A], n, grain int, args A) {
	b, _ := pool.p.Get().(*box[A, PA])
	if b == nil {
		b = new(box[A, PA])
		b.fn = func(lo, hi int) { PA(&b.a).Run(lo, hi) }
	}
	b.a = args
	For(n, grain, b.fn)
	var zero A
	b.a = zero
	pool.p.Put(b)
}
