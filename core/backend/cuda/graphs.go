package cuda

import (
	"fmt"

	"github.com/glmflash/glmflash/core/ir"
	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// graphKey is what a captured graph depends on: the batch's token,
// sequence, logits-row and context-row counts (R differs from T and S
// under span logits: a verify span keeps all its rows, a prompt chunk
// beside it one; TC is a DFlash draft batch's context rows) and whether it
// samples. Positions, tokens, slots, context lengths and sampling
// parameters are read from device buffers at fixed addresses.
type graphKey struct {
	T, S, R, TC int
	sample      bool
	// store is the store's id: the launches hold its cache addresses
	store uint64
}

// capturedGraph is a captured batch and where its launches left every
// value (the logits and hidden rows are read from there after a replay).
type capturedGraph struct {
	g    *kc.Graph
	addr map[*ir.Value]kc.DevicePtr
}

// DefaultGraphMaxTokens bounds the batches captured into CUDA graphs when
// the options do not say.
const DefaultGraphMaxTokens = 64

// maxGraphs bounds the graphs a program keeps (a new shape past it runs
// eagerly).
const maxGraphs = 256

// graphKey says whether a batch runs as a CUDA graph, and under which key:
// graphs are on, the program reads only host lengths (a length read-back
// is a sync, which a graph cannot hold), captures no residual streams
// (debugging; its final hidden rows, which the MTP draft steps read back,
// and the target-layer rows a DFlash drafter reads are fine) and the batch
// is small (decode, small verify/extend, a DFlash draft of few context
// rows: at most that many tokens and context rows). cuBLAS calls are
// captured like kernels.
func (p *Program) graphKey(rc *runCtx) (graphKey, bool) {
	pr := rc.pr
	max := p.b.cuda.GraphMaxTokens
	if max == 0 {
		max = DefaultGraphMaxTokens
	}
	captures := false
	for _, name := range p.plan.Hidden {
		captures = captures || (name != ir.OutputFinalHidden && name != ir.OutputTargetHidden)
	}
	if max < 0 || p.b.cuda.ProfileOps || !p.plan.HostLengths || captures || pr.T > max || pr.TC > max {
		return graphKey{}, false
	}
	k := graphKey{T: pr.T, S: len(pr.Spans), R: pr.Rows(), TC: pr.TC, sample: pr.Sample != nil, store: rc.storeID}
	if _, ok := p.graphs[k]; !ok && len(p.graphs) >= maxGraphs {
		return k, false
	}
	return k, true
}

// dropGraphs destroys every captured graph (their addresses are stale).
func (p *Program) dropGraphs() {
	for k, g := range p.graphs {
		p.b.dev.Destroy(g.g)
		delete(p.graphs, k)
	}
}

// capture records the batch's launches (steps and sampling, laid out by
// lay) into a new graph kept under key; the batch then replays it.
func (p *Program) capture(rc *runCtx, key graphKey, lay *layout, sl *sampleLaunch) (*capturedGraph, error) {
	dev := rc.dev
	if p.usesLt {
		if err := dev.EnsureLtWorkspace(); err != nil {
			return nil, err
		}
	}
	g, err := dev.Capture(func() error { return p.launchAll(rc, lay, sl) })
	if err != nil {
		return nil, fmt.Errorf("cuda: capturing a graph for %d tokens in %d sequences: %w", rc.pr.T, len(rc.pr.Spans), err)
	}
	ent := &capturedGraph{g: g, addr: rc.addr}
	p.graphs[key] = ent
	p.captures.Add(1)
	return ent, nil
}
