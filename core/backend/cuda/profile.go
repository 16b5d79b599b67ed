package cuda

import (
	"sort"

	"github.com/glmflash/glmflash/core/backend"
	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// opEvents are one step's device events (Options.ProfileOps).
type opEvents struct {
	op       string
	from, to kc.Event
}

// OpTimes returns the device time per op since profiling was switched on
// (Options.ProfileOps), the most expensive first.
func (p *Program) OpTimes() []backend.OpTime {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []backend.OpTime
	for _, t := range p.opTimes {
		out = append(out, *t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ms > out[j].Ms })
	return out
}

// collectProfile turns a run's step events into per-op device time.
func (p *Program) collectProfile(rc *runCtx) {
	if p.opTimes == nil {
		p.opTimes = map[string]*backend.OpTime{}
	}
	for _, e := range rc.profile {
		ms, err := rc.dev.Elapsed(e.from, e.to)
		if err != nil {
			continue
		}
		t := p.opTimes[e.op]
		if t == nil {
			t = &backend.OpTime{Op: e.op}
			p.opTimes[e.op] = t
		}
		t.Calls++
		t.Ms += ms
	}
}
