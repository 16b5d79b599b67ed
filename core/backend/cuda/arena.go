package cuda

import (
	"sort"

	"github.com/glmflash/glmflash/core/ir"
	kc "github.com/glmflash/glmflash/kernels/cuda"
)

const align = 256

func roundUp(n int64) int64 { return (n + align - 1) / align * align }

// arenaPlan assigns arena offsets to every value and temporary of one
// execution (first fit, coalescing), freeing at last use.
type arenaPlan struct {
	free []span // sorted by offset
	top  int64  // end of the highest block in use
	peak int64  // the high-water mark of top
	// hold defers releases (held) until flush: while a side branch runs
	hold bool
	held []span
}

// flush ends a hold, releasing what it deferred.
func (a *arenaPlan) flush() {
	a.hold = false
	for _, h := range a.held {
		a.release(h.off, h.n)
	}
	a.held = a.held[:0]
}

type span struct{ off, n int64 }

func (a *arenaPlan) alloc(n int64) int64 {
	n = roundUp(max(n, 1))
	for i, f := range a.free {
		if f.n >= n {
			off := f.off
			a.free[i].off += n
			a.free[i].n -= n
			if a.free[i].n == 0 {
				a.free = append(a.free[:i], a.free[i+1:]...)
			}
			return off
		}
	}
	off := a.top
	a.top += n
	a.peak = max(a.peak, a.top)
	return off
}

func (a *arenaPlan) release(off, n int64) {
	if a.hold {
		a.held = append(a.held, span{off, n})
		return
	}
	n = roundUp(max(n, 1))
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off > off })
	a.free = append(a.free, span{})
	copy(a.free[i+1:], a.free[i:])
	a.free[i] = span{off, n}
	// coalesce with neighbours
	if i+1 < len(a.free) && a.free[i].off+a.free[i].n == a.free[i+1].off {
		a.free[i].n += a.free[i+1].n
		a.free = append(a.free[:i+1], a.free[i+2:]...)
	}
	if i > 0 && a.free[i-1].off+a.free[i-1].n == a.free[i].off {
		a.free[i-1].n += a.free[i].n
		a.free = append(a.free[:i], a.free[i+1:]...)
	}
	// trailing free space lowers the top
	if last := len(a.free) - 1; last >= 0 && a.free[last].off+a.free[last].n == a.top {
		a.top = a.free[last].off
		a.free = a.free[:last]
	}
}

// ensure grows a device buffer to at least n bytes; captured graphs hold
// the old address, so they are dropped when it moves.
func (p *Program) ensure(buf *kc.DevicePtr, size *int64, n int64) error {
	if n <= *size {
		return nil
	}
	n = n + n/4 + align
	if *buf != 0 {
		if err := p.b.dev.Sync(); err != nil { // work in flight may still read it
			return err
		}
		p.b.dev.Free(*buf, *size)
		p.b.sh.work.Add(-*size)
		*buf, *size = 0, 0
	}
	p.dropGraphs()
	ptr, err := p.b.dev.Alloc(n)
	if err != nil {
		return err
	}
	p.b.sh.work.Add(n)
	*buf, *size = ptr, n
	return nil
}

// layout is where one batch shape's values and scratch live in the arena:
// the arena plan walked once over the plan's liveness events (plan.Liveness)
// with the shape's sizes, kept per shape (layoutKey) so that a batch of a
// shape seen before plans nothing.
type layout struct {
	// off[v.ID] is the arena offset of a value the steps produce (−1: no
	// buffer in this shape)
	off []int64
	// tempSize[si] and tempOff[si] are step si's scratch buffers
	tempSize, tempOff [][]int64
	// peak is the arena bytes the shape needs
	peak int64
}

// layoutKey is what a layout depends on: the batch's token, sequence and
// logits-row and context-row counts (every value's size) and the pools the DSA scratch is
// sized for (runCtx.maxVisible, in the order of the program's kpools).
type layoutKey struct {
	T, S, R, TC int
	visible     [maxLayoutPools]int
}

// maxLayoutPools bounds the DSA pool sizes a layout key holds (a program
// with more plans every batch); maxLayouts the layouts a program keeps
// (past it the cache starts again).
const (
	maxLayoutPools = 4
	maxLayouts     = 64
)

// setVisible sizes the DSA pools for the batch of rc: by the positions its
// sequences reach, or, for a captured launch (graphed: it may not depend on
// positions), by the store.
func (p *Program) setVisible(rc *runCtx, graphed bool) {
	for _, kp := range p.kpoolSizes {
		if graphed { // a captured launch may not depend on positions: size by the store
			rc.maxVisible[kp] = rc.maxPos/kp + 1
			continue
		}
		for _, s := range rc.pr.Spans {
			rc.maxVisible[kp] = max(rc.maxVisible[kp], (s.Pos0+s.N)/kp)
		}
	}
}

// layoutFor returns the layout of rc's batch shape and grows the arena to
// it.
func (p *Program) layoutFor(rc *runCtx) (*layout, error) {
	lay := p.layoutOf(rc)
	if err := p.ensure(&p.arena, &p.arenaSize, lay.peak); err != nil {
		return nil, err
	}
	return lay, nil
}

// layoutOf returns the layout of rc's batch shape, planned on the shape's
// first batch (every batch where the program has more DSA pool sizes than
// a key holds).
func (p *Program) layoutOf(rc *runCtx) *layout {
	if len(p.kpoolSizes) > maxLayoutPools {
		return p.planLayout(rc)
	}
	key := layoutKey{T: rc.T, S: rc.S, R: rc.R, TC: rc.TC}
	for i, kp := range p.kpoolSizes {
		key.visible[i] = rc.maxVisible[kp]
	}
	if lay := p.layouts[key]; lay != nil {
		return lay
	}
	lay := p.planLayout(rc)
	if len(p.layouts) >= maxLayouts {
		clear(p.layouts)
	}
	p.layouts[key] = lay
	return lay
}

// planLayout walks the arena plan over the steps for the batch of rc: the
// values' bytes and every step's scratch, released after their last reader
// (no reuse while a side branch is open: streamArena).
func (p *Program) planLayout(rc *runCtx) *layout {
	lay := &layout{off: make([]int64, p.maxID+1), tempSize: make([][]int64, len(p.steps)), tempOff: make([][]int64, len(p.steps))}
	for i := range lay.off {
		lay.off[i] = -1
	}
	ap := &arenaPlan{}
	life := p.plan.Life
	for si, st := range p.steps {
		p.streamArena(ap, si)
		for _, e := range life.Born(si) {
			if n := rc.bytesOf(e.Value); n > 0 {
				lay.off[e.Value.ID] = ap.alloc(n)
			}
		}
		if st.temps != nil {
			lay.tempSize[si] = st.temps(rc)
			for _, n := range lay.tempSize[si] {
				lay.tempOff[si] = append(lay.tempOff[si], ap.alloc(n))
			}
			for i, n := range lay.tempSize[si] {
				ap.release(lay.tempOff[si][i], n)
			}
		}
		for _, e := range life.Dies(si) {
			if off := lay.off[e.Value.ID]; off >= 0 {
				ap.release(off, rc.bytesOf(e.Value))
			}
		}
	}
	lay.peak = ap.peak
	return lay
}

// kpools lists the DSA pool sizes of the program's dsa_meta nodes.
func (p *Program) kpools() []int {
	var out []int
	for _, st := range p.steps {
		if st.node.Op == ir.OpDSAMeta {
			kp := ir.AttrKPool.Get(st.node)
			found := false
			for _, k := range out {
				found = found || k == kp
			}
			if !found && kp > 0 {
				out = append(out, kp)
			}
		}
	}
	return out
}
