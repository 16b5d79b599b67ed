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
// value (the logits and hidden rows are read from there after a replay);
// used is the program's tick at its last replay (the LRU order).
type capturedGraph struct {
	g    *kc.Graph
	addr map[*ir.Value]kc.DevicePtr
	used uint64
}

// DefaultGraphMaxTokens bounds the batches captured into CUDA graphs when
// the options do not say.
const DefaultGraphMaxTokens = 64

// DefaultMaxGraphs bounds the graphs a program keeps when the options do
// not say (Options.MaxGraphs).
const DefaultMaxGraphs = 256

// DefaultGraphBuckets are the bucket graphs' token counts when the options
// do not say (Options.GraphBuckets).
var DefaultGraphBuckets = []int{64, 128, 256, 512, 1024, 2048, 4096}

// graphMax is the most tokens of an exact-shape graph (negative: no graphs).
func (b *Backend) graphMax() int {
	if b.cuda.GraphMaxTokens == 0 {
		return DefaultGraphMaxTokens
	}
	return b.cuda.GraphMaxTokens
}

// maxGraphs is the most graphs a program keeps.
func (b *Backend) maxGraphs() int {
	if b.cuda.MaxGraphs > 0 {
		return b.cuda.MaxGraphs
	}
	return DefaultMaxGraphs
}

// buckets are the bucket graphs' token counts past graphMax (nil: none).
func (b *Backend) buckets() []int {
	if b.cuda.NoGraphBuckets || b.cuda.ProfileOps || b.graphMax() < 0 {
		return nil
	}
	bs := b.cuda.GraphBuckets
	if bs == nil {
		bs = DefaultGraphBuckets
	}
	var out []int
	for _, n := range bs {
		if n > b.graphMax() {
			out = append(out, n)
		}
	}
	return out
}

// bucketsOn reports whether batches may be padded to bucket graphs (the
// backend's stores then keep a padding slot).
func (b *Backend) bucketsOn() bool { return len(b.buckets()) > 0 }

// graphable reports whether the program's batches may run as graphs at
// all: graphs are on, the program reads only host lengths (a length
// read-back is a sync, which a graph cannot hold) and captures no residual
// streams (debugging; its final hidden rows, which the MTP draft steps
// read back, and the target-layer rows a DFlash drafter reads are fine).
func (p *Program) graphable() bool {
	captures := false
	for _, name := range p.plan.Hidden {
		captures = captures || (name != ir.OutputFinalHidden && name != ir.OutputTargetHidden)
	}
	return p.b.graphMax() >= 0 && !p.b.cuda.ProfileOps && p.plan.HostLengths && !captures
}

// graphKey says whether a batch runs as a CUDA graph, and under which key:
// the program is graphable and the batch is small (decode, small
// verify/extend, a DFlash draft of few context rows: at most graphMax
// tokens and context rows) or padded to a bucket (padded: padBatch).
// cuBLAS calls are captured like kernels.
func (p *Program) graphKey(rc *runCtx) (graphKey, bool) {
	pr := rc.pr
	max := p.b.graphMax()
	if !p.graphable() || (rc.real == nil && pr.T > max) || pr.TC > max {
		return graphKey{}, false
	}
	return graphKey{T: pr.T, S: len(pr.Spans), R: pr.Rows(), TC: pr.TC, sample: pr.Sample != nil, store: rc.storeID}, true
}

// lookup returns the graph kept under key (nil: none) and marks it used.
func (p *Program) lookup(key graphKey) *capturedGraph {
	g := p.graphs[key]
	if g != nil {
		p.tick++
		g.used = p.tick
	}
	return g
}

// dropGraphs destroys every captured graph (their addresses are stale).
func (p *Program) dropGraphs() {
	for k, g := range p.graphs {
		p.b.dev.Destroy(g.g)
		delete(p.graphs, k)
		p.dropped.Add(1)
	}
}

// evict destroys the least recently replayed graph, after the work in
// flight (which may be its replay) is done.
func (p *Program) evict() error {
	var old graphKey
	var oldest *capturedGraph
	for k, g := range p.graphs {
		if oldest == nil || g.used < oldest.used {
			old, oldest = k, g
		}
	}
	if oldest == nil {
		return nil
	}
	if err := p.b.dev.Sync(); err != nil {
		return err
	}
	p.b.dev.Destroy(oldest.g)
	delete(p.graphs, old)
	p.evictions.Add(1)
	return nil
}

// capture records the batch's launches (steps and sampling, laid out by
// lay) into a new graph kept under key, the least recently replayed graph
// destroyed first where the program keeps maxGraphs; the batch then
// replays it.
func (p *Program) capture(rc *runCtx, key graphKey, lay *layout, sl *sampleLaunch) (*capturedGraph, error) {
	dev := rc.dev
	if p.usesLt {
		if err := dev.EnsureLtWorkspace(); err != nil {
			return nil, err
		}
	}
	for len(p.graphs) >= p.b.maxGraphs() {
		if err := p.evict(); err != nil {
			return nil, err
		}
	}
	g, err := dev.Capture(func() error { return p.launchAll(rc, lay, sl) })
	if err != nil {
		return nil, fmt.Errorf("cuda: capturing a graph for %d tokens in %d sequences: %w", rc.pr.T, len(rc.pr.Spans), err)
	}
	p.tick++
	ent := &capturedGraph{g: g, addr: rc.addr, used: p.tick}
	p.graphs[key] = ent
	p.captures.Add(1)
	return ent, nil
}
