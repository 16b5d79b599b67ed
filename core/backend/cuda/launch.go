package cuda

import (
	"fmt"

	"github.com/glmflash/glmflash/core/ir"
	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// launchAll launches (or, inside a capture, records) every step at the
// addresses of lay, then the sampler (sl nil: none).
func (p *Program) launchAll(rc *runCtx, lay *layout, sl *sampleLaunch) error {
	if err := p.launchSteps(rc, lay); err != nil {
		return err
	}
	if sl != nil {
		return sl.launch(rc.dev, rc.addr[p.plan.Logits], rc.pr.Rows())
	}
	return nil
}

// launchSteps launches every step, each value at its address in lay from
// the step that makes it to its last reader.
func (p *Program) launchSteps(rc *runCtx, lay *layout) error {
	if err := p.bindInputs(rc); err != nil {
		return err
	}
	// the side stream is used where not profiling (per-op events time the
	// main stream)
	var sdev *kc.Device
	if rc.profile == nil {
		sdev = rc.dev
	}
	life := p.plan.Life
	for si, st := range p.steps {
		if err := p.streamDevice(sdev, si); err != nil {
			return err
		}
		for _, e := range life.Born(si) {
			if off := lay.off[e.Value.ID]; off >= 0 {
				rc.addr[e.Value] = p.arena + kc.DevicePtr(off)
			}
		}
		rc.temps = rc.temps[:0]
		for _, off := range lay.tempOff[si] {
			rc.temps = append(rc.temps, p.arena+kc.DevicePtr(off))
		}
		if err := p.runStep(rc, st); err != nil {
			return err
		}
		for _, e := range life.Dies(si) {
			delete(rc.addr, e.Value)
		}
	}
	return p.streamDevice(sdev, len(p.steps))
}

// bindInputs points the graph's inputs at the batch's metadata.
func (p *Program) bindInputs(rc *runCtx) error {
	for _, in := range p.plan.Graph.Inputs {
		switch in.Name {
		case ir.InputTokens:
			rc.addr[in] = rc.toks
		case ir.InputBatch:
		case ir.InputHidden:
			if rc.hidden == 0 {
				return fmt.Errorf("cuda: the batch has no hidden rows for input %q", in.Name)
			}
			rc.addr[in] = rc.hidden
		case ir.InputContext:
			if rc.TC > 0 && rc.context == 0 {
				return fmt.Errorf("cuda: the batch has no context rows for input %q", in.Name)
			}
			rc.addr[in] = rc.context
		default:
			return fmt.Errorf("cuda: graph input %q is not provided by the executor", in.Name)
		}
	}
	return nil
}

// runStep launches one step, between events of its own when profiling.
func (p *Program) runStep(rc *runCtx, st *kstep) error {
	var ev0 kc.Event
	if rc.profile != nil {
		var err error
		if ev0, err = rc.dev.Record(); err != nil {
			return err
		}
	}
	if err := st.run(rc); err != nil {
		return fmt.Errorf("cuda: %s (layer %d): %w", st.node.Op, st.node.Layer, err)
	}
	if rc.profile != nil {
		ev1, err := rc.dev.Record()
		if err != nil {
			return err
		}
		rc.profile = append(rc.profile, opEvents{st.node.Op, ev0, ev1})
	}
	return nil
}
