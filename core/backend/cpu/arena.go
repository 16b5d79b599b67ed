package cpu

import (
	"fmt"
	"math"

	"github.com/glmflash/glmflash/core/ir"
)

// arena holds a program's activations: one float32 slab and one int32 slab,
// laid out per run by liveness. Before a run's first step, layout walks the
// plan's liveness events (plan.Liveness) once with the batch's sizes: each
// tensor output gets the best-fitting gap among the tensors live at its
// step (its inputs are still live there, so an output never aliases one of
// them) and its range is freed after its last use. The slabs grow to the
// largest extent a batch has needed and are reused by every later run, so
// a run whose batch is no larger than one already seen allocates nothing.
//
// The arena belongs to one program and is used under its mutex. Slices
// handed out are valid until the program's next run: results are copied
// out before Execute returns.
type arena struct {
	f   []float32
	i   []int32
	off []int // by value ID: offset in its slab, −1 when not laid out
	n   []int // by value ID: elements
	// live ranges of each slab, sorted by offset (scratch of layout)
	liveF, liveI []span
}

// span is a live range [off, end) of a slab.
type span struct {
	off, end int
	id       int
}

// align rounds tensor sizes to whole 64-byte lines.
const align = 16

// newArena makes an arena for the values of steps.
func newArena(steps []step) *arena {
	maxID := 0
	for _, st := range steps {
		for _, v := range st.node.Inputs {
			maxID = max(maxID, v.ID)
		}
		for _, v := range st.node.Outputs {
			maxID = max(maxID, v.ID)
		}
	}
	a := &arena{off: make([]int, maxID+1), n: make([]int, maxID+1)}
	for i := range a.off {
		a.off[i] = -1
	}
	return a
}

// layout places every tensor output of the program's steps for rc's batch
// and grows the slabs to fit.
func (a *arena) layout(p *Program, rc *runCtx) {
	for i := range a.off {
		a.off[i] = -1
	}
	a.liveF, a.liveI = a.liveF[:0], a.liveI[:0]
	var extF, extI int
	life := p.plan.Life
	for si := range p.steps {
		for _, e := range life.Born(si) {
			switch o := e.Value; o.DType {
			case ir.F32:
				n := rc.size(o)
				a.off[o.ID], a.n[o.ID] = place(&a.liveF, o.ID, n, &extF), n
			case ir.I32:
				n := rc.size(o)
				a.off[o.ID], a.n[o.ID] = place(&a.liveI, o.ID, n, &extI), n
			}
		}
		for _, e := range life.Dies(si) {
			if a.off[e.Value.ID] >= 0 {
				a.free(e.Value)
			}
		}
	}
	if len(a.f) < extF {
		a.f = make([]float32, extF)
	}
	if len(a.i) < extI {
		a.i = make([]int32, extI)
	}
}

// place puts n elements in the smallest gap of live that holds them (else
// after the last live range), records the range and returns its offset.
func place(live *[]span, id, n int, ext *int) int {
	size := (n + align - 1) / align * align
	l := *live
	best, bestGap, at := -1, math.MaxInt, len(l)
	prev := 0
	for k, s := range l {
		if gap := s.off - prev; gap >= size && gap < bestGap {
			best, bestGap, at = prev, gap, k
		}
		prev = s.end
	}
	if best < 0 {
		best, at = prev, len(l)
	}
	l = append(l, span{})
	copy(l[at+1:], l[at:])
	l[at] = span{off: best, end: best + size, id: id}
	*live = l
	*ext = max(*ext, best+size)
	return best
}

// free ends v's live range.
func (a *arena) free(v *ir.Value) {
	live := &a.liveF
	if v.DType == ir.I32 {
		live = &a.liveI
	}
	l := *live
	for k, s := range l {
		if s.id == v.ID {
			*live = append(l[:k], l[k+1:]...)
			return
		}
	}
}

// floats returns v's float32 range for this run.
func (a *arena) floats(v *ir.Value) []float32 {
	o := a.off[v.ID]
	if o < 0 || v.DType != ir.F32 {
		panic(fmt.Sprintf("cpu: %s (%s) has no float32 range in the arena", v.Name, v.DType))
	}
	return a.f[o : o+a.n[v.ID] : o+a.n[v.ID]]
}

// ints returns v's int32 range for this run.
func (a *arena) ints(v *ir.Value) []int32 {
	o := a.off[v.ID]
	if o < 0 || v.DType != ir.I32 {
		panic(fmt.Sprintf("cpu: %s (%s) has no int32 range in the arena", v.Name, v.DType))
	}
	return a.i[o : o+a.n[v.ID] : o+a.n[v.ID]]
}

// scratch returns a buffer of n floats owned by the program, valid until
// the next scratch call (one user at a time: a step's temporary).
func (p *Program) scratch(n int) []float32 {
	if cap(p.tmp) < n {
		p.tmp = make([]float32, n)
	}
	return p.tmp[:n]
}
