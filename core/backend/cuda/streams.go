package cuda

import (
	"github.com/glmflash/glmflash/core/ir"
	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// streamAct is what a step does to the side stream before it runs: join
// the open side branch (the main stream waits for it), then fork a new one
// (the side stream waits for the main one), and whether the step runs on
// the side stream.
type streamAct struct{ join, fork, side bool }

// streamPlan places the steps on the streams. A step whose node has
// ir.AttrStream 1 (a pass marked it: moe-shared-overlap) runs on the side
// stream, beside the main-stream steps issued after it; the first main
// step that reads a side step's output joins the branch, and a side step
// that reads a main step's output from after the fork joins and forks
// again, so every read sees a finished value. The last entry (one past the
// steps) joins what is still open.
func streamPlan(steps []*kstep) []streamAct {
	acts := make([]streamAct, len(steps)+1)
	forked := false
	sideVals, mainVals := map[*ir.Value]bool{}, map[*ir.Value]bool{}
	reads := func(n *ir.Node, m map[*ir.Value]bool) bool {
		for _, in := range n.Inputs {
			if m[in] {
				return true
			}
		}
		return false
	}
	for i, st := range steps {
		n := st.node
		side := ir.AttrStream.Get(n) == 1
		a := &acts[i]
		a.side = side
		switch {
		case side:
			if forked && reads(n, mainVals) {
				a.join, forked = true, false
			}
			if !forked {
				a.fork, forked = true, true
				clear(sideVals)
				clear(mainVals)
			}
			for _, o := range n.Outputs {
				sideVals[o] = true
			}
		case forked && reads(n, sideVals):
			a.join, forked = true, false
		case forked:
			for _, o := range n.Outputs {
				mainVals[o] = true
			}
		}
	}
	acts[len(steps)].join = forked
	return acts
}

// streamArena applies step si's stream action to the arena plan: while a
// side branch is open no memory is reused (a released block may still be
// read or written by the other stream); the join releases what it held.
func (p *Program) streamArena(ap *arenaPlan, si int) {
	if len(p.streams) == 0 {
		return
	}
	a := p.streams[si]
	if a.join {
		ap.flush()
	}
	if a.fork {
		ap.hold = true
	}
}

// streamDevice applies step si's stream action to the device's streams (a
// nil dev: none, every step on the main stream).
func (p *Program) streamDevice(dev *kc.Device, si int) error {
	if len(p.streams) == 0 || dev == nil {
		return nil
	}
	a := p.streams[si]
	if a.join {
		if err := dev.Join(); err != nil {
			return err
		}
	}
	if a.fork {
		if err := dev.Fork(); err != nil {
			return err
		}
	}
	if si < len(p.steps) {
		return dev.OnSide(a.side)
	}
	return nil
}
