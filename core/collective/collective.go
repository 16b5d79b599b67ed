// Package collective holds the communicator of tensor-parallel ranks: the
// Communicator interface a backend's collective ops (ir.OpAllReduce,
// ir.OpAllGatherCols) run through, its counters, and an in-process
// implementation whose ranks are goroutines of one process (NewGroup), the
// CPU backend's. A device communicator (NCCL through purego, collectives
// enqueued on the compute stream and captured in CUDA graphs) implements the
// same interface in its backend; docs/tensor-parallel.md says how.
package collective

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Communicator is one rank's handle on a group of Size ranks. Every rank
// must issue the same collectives in the same order with buffers of the same
// length; a collective returns when this rank's part of it is done (for the
// in-process group: when every rank has joined it). A Communicator is used
// by one goroutine at a time (its rank's executor).
type Communicator interface {
	// Rank is this rank's index in [0, Size).
	Rank() int
	// Size is the number of ranks.
	Size() int
	// AllReduceSum replaces buf on every rank with the element-wise sum of
	// every rank's buf, summed in rank order (so every rank holds the
	// same bits).
	AllReduceSum(buf []float32) error
	// AllGather writes every rank's src, in rank order, into dst
	// (len(dst) = Size·len(src)).
	AllGather(dst, src []float32) error
	// Stats returns this rank's counters since it was made.
	Stats() Stats
}

// Stats counts one rank's collectives.
type Stats struct {
	AllReduces int64 // all-reduce calls
	AllGathers int64 // all-gather calls
	// Bytes is the payload this rank contributed: 4 bytes per float32 of
	// each all-reduce buffer and each all-gather source.
	Bytes int64
	// Time is the wall time spent inside collectives (waiting for the
	// other ranks included).
	Time time.Duration
}

// Sub returns s − o (the counters of the interval between two reads).
func (s Stats) Sub(o Stats) Stats {
	return Stats{AllReduces: s.AllReduces - o.AllReduces, AllGathers: s.AllGathers - o.AllGathers, Bytes: s.Bytes - o.Bytes, Time: s.Time - o.Time}
}

// ErrAborted is returned by a collective of a group that was aborted
// (Group.Abort): a rank failed, so the others must not wait for it.
var ErrAborted = errors.New("collective: group aborted")

// MaxRanks bounds an in-process group.
const MaxRanks = 1024

// Group is an in-process group: its ranks are goroutines of this process
// sharing memory. A collective meets at a barrier: every rank posts its
// buffer, then each rank reads every posted buffer in rank order into its
// own scratch, meets the others a second time (nobody reads a buffer after
// that) and copies its result out.
type Group struct {
	ranks []*Local

	mu      sync.Mutex
	cond    *sync.Cond
	arrived int
	gen     uint64
	err     error
	// posted holds each rank's buffer of the collective in progress.
	posted [][]float32
}

// NewGroup returns an in-process group of n ranks.
func NewGroup(n int) (*Group, error) {
	if n < 1 || n > MaxRanks {
		return nil, fmt.Errorf("collective: a group needs 1 to %d ranks, got %d", MaxRanks, n)
	}
	g := &Group{posted: make([][]float32, n)}
	g.cond = sync.NewCond(&g.mu)
	for r := range n {
		g.ranks = append(g.ranks, &Local{g: g, rank: r})
	}
	return g, nil
}

// Rank returns rank r's communicator.
func (g *Group) Rank(r int) *Local { return g.ranks[r] }

// Size is the number of ranks.
func (g *Group) Size() int { return len(g.ranks) }

// Abort fails every collective in progress and every later one with an
// error wrapping ErrAborted and err: a rank that cannot reach its next
// collective (its step failed) calls it so that the others do not wait
// forever. The group is unusable afterwards.
func (g *Group) Abort(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err == nil {
		if err == nil {
			err = errors.New("no reason given")
		}
		g.err = fmt.Errorf("%w: %w", ErrAborted, err)
	}
	g.cond.Broadcast()
}

// Err is the error the group was aborted with (nil while it is usable).
func (g *Group) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// barrier waits until every rank has arrived (g.mu held).
func (g *Group) barrierLocked() error {
	if g.err != nil {
		return g.err
	}
	gen := g.gen
	g.arrived++
	if g.arrived == len(g.ranks) {
		g.arrived = 0
		g.gen++
		g.cond.Broadcast()
		return nil
	}
	for gen == g.gen && g.err == nil {
		g.cond.Wait()
	}
	if gen == g.gen {
		return g.err
	}
	return nil
}

// Local is one rank of an in-process Group.
type Local struct {
	g       *Group
	rank    int
	scratch []float32

	reduces, gathers, bytes, nanos atomic.Int64
}

// Rank is this rank's index.
func (l *Local) Rank() int { return l.rank }

// Size is the group's size.
func (l *Local) Size() int { return len(l.g.ranks) }

// Group returns the group the rank belongs to.
func (l *Local) Group() *Group { return l.g }

// Stats returns this rank's counters.
func (l *Local) Stats() Stats {
	return Stats{AllReduces: l.reduces.Load(), AllGathers: l.gathers.Load(), Bytes: l.bytes.Load(), Time: time.Duration(l.nanos.Load())}
}

// post publishes buf and waits for every rank's; it checks that they all
// have the same length.
func (l *Local) post(buf []float32) error {
	g := l.g
	g.mu.Lock()
	defer g.mu.Unlock()
	g.posted[l.rank] = buf
	if err := g.barrierLocked(); err != nil {
		return err
	}
	for r, p := range g.posted {
		if len(p) != len(buf) {
			g.err = fmt.Errorf("%w: rank %d joined with %d values, rank %d with %d (the ranks' programs differ)", ErrAborted, l.rank, len(buf), r, len(p))
			g.cond.Broadcast()
			return fmt.Errorf("collective: rank %d joined with %d values, rank %d with %d (the ranks' programs differ)", l.rank, len(buf), r, len(p))
		}
	}
	return nil
}

// done waits until every rank has read the posted buffers.
func (l *Local) done() error {
	g := l.g
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.barrierLocked()
}

// AllReduceSum sums buf over the ranks in rank order.
func (l *Local) AllReduceSum(buf []float32) error {
	t0 := time.Now()
	defer l.count(&l.reduces, len(buf), t0)
	if len(l.g.ranks) == 1 {
		return l.g.Err()
	}
	if err := l.post(buf); err != nil {
		return err
	}
	if cap(l.scratch) < len(buf) {
		l.scratch = make([]float32, len(buf))
	}
	s := l.scratch[:len(buf)]
	posted := l.g.posted // stable until the second barrier
	copy(s, posted[0])
	for _, p := range posted[1:] {
		for i, v := range p {
			s[i] += v
		}
	}
	if err := l.done(); err != nil {
		return err
	}
	copy(buf, s)
	return nil
}

// AllGather concatenates every rank's src in rank order into dst.
func (l *Local) AllGather(dst, src []float32) error {
	t0 := time.Now()
	defer l.count(&l.gathers, len(src), t0)
	if len(dst) != len(l.g.ranks)*len(src) {
		err := fmt.Errorf("collective: all-gather into %d values from %d per rank over %d ranks", len(dst), len(src), len(l.g.ranks))
		l.g.Abort(err)
		return err
	}
	if err := l.post(src); err != nil {
		return err
	}
	for r, p := range l.g.posted {
		copy(dst[r*len(src):], p)
	}
	return l.done()
}

func (l *Local) count(c *atomic.Int64, n int, t0 time.Time) {
	c.Add(1)
	l.bytes.Add(4 * int64(n))
	l.nanos.Add(int64(time.Since(t0)))
}

// Run runs fn(rank) on one goroutine per rank of g and waits for them all.
// When a rank's fn fails the group is aborted (so no rank waits in a
// collective for it); once every goroutine has ended the group is reset
// (usable again) and the first rank's own error (not an abort it caused) is
// returned. Run calls must not overlap, nor mix with collectives issued
// outside Run.
func (g *Group) Run(fn func(rank int) error) error {
	errs := make([]error, len(g.ranks))
	var wg sync.WaitGroup
	for r := range g.ranks {
		wg.Go(func() {
			if err := fn(r); err != nil {
				errs[r] = err
				g.Abort(fmt.Errorf("rank %d: %w", r, err))
			}
		})
	}
	wg.Wait()
	// No rank is inside a collective any more: the group is usable again
	// (the failed step's error is returned; what the ranks' steps changed
	// before it is theirs to undo).
	g.mu.Lock()
	g.err, g.arrived = nil, 0
	clear(g.posted)
	g.mu.Unlock()
	for r, err := range errs {
		if err != nil && !errors.Is(err, ErrAborted) {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	for r, err := range errs {
		if err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return nil
}
