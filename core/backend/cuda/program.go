package cuda

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/glmflash/glmflash/core/sample"
	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// kstep is one bound node.
type kstep struct {
	node *ir.Node
	// temps returns the byte sizes of the scratch buffers one execution
	// needs (nil: none); they live only during the step.
	temps func(rc *runCtx) []int64
	run   func(rc *runCtx) error
}

// Program is a plan bound to CUDA kernels. Run calls are serialized (the
// device lock serializes them with every other program on the GPU).
type Program struct {
	b     *Backend
	plan  *plan.Plan
	steps []*kstep
	// streams: per step, what it does to the side stream (streamPlan)
	streams []streamAct
	stepFacts
	consts map[*ir.Value]devTensor
	// gateUps: each gate-up linear's dual GEMV form (nil: none), found
	// once while binding (gateUpDualOf)
	gateUps map[*ir.Node]*gateUpDual
	mu      sync.Mutex

	arena     kc.DevicePtr
	arenaSize int64
	meta      kc.DevicePtr
	metaSize  int64
	out       kc.DevicePtr // sampling outputs and scratch
	outSize   int64
	// graphs are the captured launches of batches of up to
	// opts.GraphMaxTokens tokens, by shape.
	graphs map[graphKey]*capturedGraph
	// opTimes accumulates device time per op (Options.ProfileOps).
	opTimes map[string]*backend.OpTime

	runs, deviceReads, fusedMHC, launches, syncs, lengthSyncs, replays, captures, kernels, deviceNs, prepNs atomic.Int64

	// kernelRuns counts the program's kernel executions by the device's
	// kernel index (graph replays included); snap and now are scratch for
	// it (the device's counters before and after a run).
	kernelRuns, snap, now []int64
	// evStart, evEnd time every step on the device.
	evStart, evEnd kc.Event
	// usesLt: some GEMM runs a tuned cuBLASLt algorithm (its workspace is
	// allocated before any graph capture).
	usesLt bool
}

// Facts of the program's steps, fixed at Compile (see shareReuse,
// shareSave, kpools).
type stepFacts struct {
	shareExtra int
	shareSaves bool
	kpoolSizes []int
}

// graphKey is what a captured graph depends on: the batch's token,
// sequence and logits-row counts (R differs from T and S under span
// logits: a verify span keeps all its rows, a prompt chunk beside it one)
// and whether it samples. Positions, tokens, slots and sampling parameters
// are read from device buffers at fixed addresses.
type graphKey struct {
	T, S, R int
	sample  bool
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
// are fine) and the batch is small (decode and small verify/extend).
// cuBLAS calls are captured like kernels.
func (p *Program) graphKey(pr *backend.Prepared, store *Store) (graphKey, bool) {
	max := p.b.opts.GraphMaxTokens
	if max == 0 {
		max = DefaultGraphMaxTokens
	}
	captures := false
	for _, name := range p.plan.Hidden {
		captures = captures || name != ir.OutputFinalHidden
	}
	if max < 0 || p.b.opts.ProfileOps || !p.plan.HostLengths || captures || pr.T > max {
		return graphKey{}, false
	}
	k := graphKey{T: pr.T, S: len(pr.Spans), R: pr.Rows(), sample: pr.Sample != nil, store: store.id}
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

// fp8Weight lists, per op, the inputs that may be an fp8 weight: the GEMM
// weights the kernels read with their block scales (gemm.cu's w_type).
var fp8Weight = map[string][]int{
	ir.OpLinear:        {1},
	ir.OpLinearSplit:   {1},
	ir.OpLinearBatched: {1},
	ir.OpMoEExperts:    {3, 4, 5},
}

// fp8Readers says, per constant, whether every step reading it takes it as
// fp8 (so FP8 checkpoint weights can stay FP8 on the device).
func fp8Readers(p *plan.Plan) map[*ir.Value]bool {
	ok := map[*ir.Value]bool{}
	for _, n := range p.Steps {
		for i, in := range n.Inputs {
			if !p.IsConst(in) {
				continue
			}
			takes := slices.Contains(fp8Weight[n.Op], i)
			if prev, seen := ok[in]; seen {
				ok[in] = prev && takes
			} else {
				ok[in] = takes
			}
		}
	}
	return ok
}

// Compile binds every step of p and uploads the constants it reads.
func (b *Backend) Compile(p *plan.Plan) (backend.Program, error) {
	prog := &Program{b: b, plan: p, consts: map[*ir.Value]devTensor{}, gateUps: map[*ir.Node]*gateUpDual{}, graphs: map[graphKey]*capturedGraph{}}
	fp8OK := fp8Readers(p)
	err := b.dev.Do(func() error {
		for _, n := range p.Steps {
			for _, in := range n.Inputs {
				if p.IsConst(in) {
					if _, done := prog.consts[in]; !done {
						t, err := b.upload(p, in, fp8OK[in])
						if err != nil {
							return err
						}
						prog.consts[in] = t
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	for _, n := range p.Steps {
		f, ok := bindings[n.Op]
		if !ok {
			return nil, fmt.Errorf("cuda: %s (layer %d): no kernel bound to op %q", n.Op, n.Layer, n.Op)
		}
		st, err := f(prog, n)
		if err != nil {
			return nil, fmt.Errorf("cuda: %s (layer %d): %w", n.Op, n.Layer, err)
		}
		st.node = n
		prog.steps = append(prog.steps, st)
	}
	prog.shareExtra, prog.shareSaves, prog.kpoolSizes = prog.shareReuse(), prog.shareSave(), prog.kpools()
	prog.streams = streamPlan(prog.steps)
	return prog, nil
}

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

// streamStep applies step si's stream action to the arena plan (while a
// side branch is open no memory is reused: a released block may still be
// read or written by the other stream) and, when dev is not nil, to the
// device's streams.
func (p *Program) streamStep(ap *arenaPlan, dev *kc.Device, si int) error {
	if len(p.streams) == 0 {
		return nil
	}
	a := p.streams[si]
	if a.join {
		ap.flush()
		if dev != nil {
			if err := dev.Join(); err != nil {
				return err
			}
		}
	}
	if a.fork {
		ap.hold = true
		if dev != nil {
			if err := dev.Fork(); err != nil {
				return err
			}
		}
	}
	if dev != nil && si < len(p.steps) {
		return dev.OnSide(a.side)
	}
	return nil
}

// Close frees the program's device buffers (arena, metadata, sampling).
func (p *Program) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.b.dev.Do(func() error {
		p.dropGraphs()
		p.b.dev.DestroyEvent(p.evStart)
		p.b.dev.DestroyEvent(p.evEnd)
		p.evStart, p.evEnd = 0, 0
		for _, b := range []struct {
			p *kc.DevicePtr
			n *int64
		}{{&p.arena, &p.arenaSize}, {&p.meta, &p.metaSize}, {&p.out, &p.outSize}} {
			if *b.p != 0 {
				p.b.dev.Free(*b.p, *b.n)
				p.b.sh.work.Add(-*b.n)
				*b.p, *b.n = 0, 0
			}
		}
		return nil
	})
}

// Plan returns the plan the program was compiled from.
func (p *Program) Plan() *plan.Plan { return p.plan }

// Stats returns the program's counters.
func (p *Program) Stats() backend.Stats {
	return backend.Stats{Runs: p.runs.Load(), DeviceLengthReads: p.deviceReads.Load(), FusedMHCRuns: p.fusedMHC.Load(),
		Launches: p.launches.Load(), HostSyncs: p.syncs.Load(), LengthSyncs: p.lengthSyncs.Load(),
		GraphReplays: p.replays.Load(), GraphCaptures: p.captures.Load(), Kernels: p.kernels.Load(), DeviceNs: p.deviceNs.Load(), PrepNs: p.prepNs.Load()}
}

// KernelRuns implements backend.KernelCounter: how many times each kernel
// (or cuBLAS routine) ran for this program, graph replays included.
func (p *Program) KernelRuns() map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int64{}
	_ = p.b.dev.Do(func() error { // names live with the device
		for i, n := range p.kernelRuns {
			if n > 0 {
				out[p.b.dev.KernelName(i)] = n
			}
		}
		return nil
	})
	return out
}

// w returns the device copy of a constant input.
func (p *Program) w(v *ir.Value) (devTensor, error) {
	t, ok := p.consts[v]
	if !ok {
		return devTensor{}, fmt.Errorf("%s must be a constant (weight)", v.Name)
	}
	return t, nil
}

// Run validates and executes a batch.
func (p *Program) Run(b *backend.Batch, st backend.Store) (*backend.Result, error) {
	pr, err := backend.Prepare(p, b, st, nil)
	if err != nil {
		return nil, err
	}
	return p.Execute(pr)
}

// Execute runs a prepared batch.
func (p *Program) Execute(pr *backend.Prepared) (*backend.Result, error) {
	if pr == nil || pr.Prog != p {
		return nil, fmt.Errorf("cuda: batch was prepared for another program")
	}
	store, ok := pr.Store.(*Store)
	if !ok || store.b != p.b {
		return nil, fmt.Errorf("cuda: the batch's store is not a store of this GPU backend")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := pr.CheckPositions(); err != nil {
		return nil, err
	}
	slots := make([]int, len(pr.Spans))
	for i, s := range pr.Spans {
		if s.Pos0+s.N > store.maxPos {
			return nil, fmt.Errorf("cuda: batch sequence %d: %d cached + %d new tokens exceed the store's %d positions", i, s.Pos0, s.N, store.maxPos)
		}
		slots[i] = s.Slot
	}
	ckpt, share := store.spanState(slots)
	for i, s := range pr.Spans {
		if ckpt[i] >= 0 && s.Pos0+s.N-ckpt[i] > store.depth {
			return nil, fmt.Errorf("cuda: batch sequence %d (slot %d): the rollback record from position %d holds %d positions; %d more from position %d would pass it", i, s.Slot, ckpt[i], store.depth, s.N, s.Pos0)
		}
	}
	if k := p.shareExtra; k > 0 {
		for i, s := range pr.Spans {
			if share[i] < 0 || s.Pos0 <= share[i] || s.Pos0+s.N-1-share[i] > k {
				return nil, fmt.Errorf("cuda: batch sequence %d (slot %d): no saved indexer selection to share for positions %d…%d (saved at %d, at most %d steps after it)", i, s.Slot, s.Pos0, s.Pos0+s.N-1, share[i], k)
			}
		}
	}
	var res *backend.Result
	dev := p.b.dev
	err := dev.Do(func() error {
		l0, s0 := dev.Launches(), dev.Syncs()
		p.snap = dev.KernelRuns(p.snap)
		var err error
		res, err = p.execute(pr, store, ckpt, share)
		p.launches.Add(dev.Launches() - l0)
		p.syncs.Add(dev.Syncs() - s0)
		p.now = dev.KernelRuns(p.now)
		now := p.now
		for len(p.kernelRuns) < len(now) {
			p.kernelRuns = append(p.kernelRuns, 0)
		}
		var k int64
		for i, n := range now {
			d := n
			if i < len(p.snap) {
				d -= p.snap[i]
			}
			p.kernelRuns[i] += d
			k += d
		}
		p.kernels.Add(k)
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, s := range pr.Spans {
		store.advance(s.Slot, s.N)
	}
	if p.shareSaves {
		pos := make([]int, len(pr.Spans))
		for i, s := range pr.Spans {
			pos[i] = s.Pos0 + s.N - 1
		}
		store.setShare(slots, pos)
	}
	p.runs.Add(1)
	return res, nil
}

// shareReuse is the extra width of the program's reusing indexer (0: it
// does not reuse a shared selection).
func (p *Program) shareReuse() int {
	for _, st := range p.steps {
		if st.node.Op == ir.OpDSATopK && ir.AttrShare.Get(st.node) == ir.IndexShareReuse {
			return ir.AttrShareExtra.Get(st.node)
		}
	}
	return 0
}

// shareSave reports whether the program saves its sequences' last
// selections for sharing.
func (p *Program) shareSave() bool {
	for _, st := range p.steps {
		if st.node.Op == ir.OpDSATopK && ir.AttrShare.Get(st.node) == ir.IndexShareSave {
			return true
		}
	}
	return false
}

// runCtx is one execution's view: where every value lives.
type runCtx struct {
	p     *Program
	dev   *kc.Device
	pr    *backend.Prepared
	store *Store
	T, S  int
	R     int // rows a span-logits selection keeps
	meta  kc.BatchMeta
	// per sequence: the open checkpoint's position and the saved
	// selection's (−1: none); the rows a span-logits selection keeps
	ckpt, sharePos, spanRows kc.DevicePtr
	toks                     kc.DevicePtr
	// hidden is the batch's hidden rows (MTP graphs), 0 without them.
	hidden kc.DevicePtr
	addr   map[*ir.Value]kc.DevicePtr
	temps  []kc.DevicePtr
	host   map[*ir.Value]any
	// visible[kpool] = the largest number of pools any row sees.
	maxVisible map[int]int
	// profile collects each step's device events when op timing is on.
	profile []opEvents
}

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

func (rc *runCtx) rows(v *ir.Value) int {
	switch v.Shape[0] {
	case ir.DimT:
		return rc.T
	case ir.DimS:
		return rc.S
	case ir.DimR:
		return rc.R
	}
	return v.Shape[0]
}

// bytesOf is the device size of a value for this batch (0: no buffer).
func (rc *runCtx) bytesOf(v *ir.Value) int64 {
	if v.DType == ir.Host {
		if v.Producer != nil && v.Producer.Op == ir.OpDSAMeta {
			return 4 * int64(rc.T) // the visible-pools array
		}
		return 0
	}
	n := int64(rc.rows(v))
	for _, d := range v.Shape[1:] {
		n *= int64(d)
	}
	return 4 * n
}

// ptr returns a value's device address (activation, constant or input).
func (rc *runCtx) ptr(v *ir.Value) kc.DevicePtr {
	if t, ok := rc.p.consts[v]; ok {
		return t.ptr
	}
	return rc.addr[v]
}

// lens returns the device lengths a node must read when its lengths source
// is the executor's seq_lengths tensor (0 for host metadata). The host
// reads them back (a sync) and checks them against the batch, as a real
// engine must to size its launches: the cost host-length-reuse removes.
func (rc *runCtx) lens(v *ir.Value) (kc.DevicePtr, error) {
	if v.DType == ir.Host {
		return 0, nil
	}
	p := rc.addr[v]
	got := make([]int32, rc.S)
	if err := rc.dev.Download(unsafe.Pointer(unsafe.SliceData(got)), p, 4*int64(rc.S)); err != nil {
		return 0, err
	}
	rc.p.deviceReads.Add(1)
	rc.p.lengthSyncs.Add(1)
	for i, n := range got {
		if int(n) != rc.pr.Spans[i].N {
			return 0, fmt.Errorf("device length of sequence %d is %d, host says %d", i, n, rc.pr.Spans[i].N)
		}
	}
	return p, nil
}

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

func (p *Program) execute(pr *backend.Prepared, store *Store, ckpt, share []int) (*backend.Result, error) {
	t0 := time.Now()
	dev := p.b.dev
	rc := &runCtx{p: p, dev: dev, pr: pr, store: store, T: pr.T, S: len(pr.Spans), R: pr.SpanRows(), host: map[*ir.Value]any{}, maxVisible: map[int]int{}}
	if p.b.opts.ProfileOps {
		rc.profile = []opEvents{}
		defer p.collectProfile(rc)
	}
	if p.evStart == 0 {
		var err error
		if p.evStart, err = dev.NewEvent(); err != nil {
			return nil, err
		}
		if p.evEnd, err = dev.NewEvent(); err != nil {
			return nil, err
		}
	}
	// 1. the step's metadata, uploaded in one copy once the host has
	// planned the step
	mb := newMetaBuilder()
	rowSeq, rowPos := make([]int32, rc.T), make([]int32, rc.T)
	slot, pos0, nn, row0, last := make([]int32, rc.S), make([]int32, rc.S), make([]int32, rc.S), make([]int32, rc.S), make([]int32, rc.S)
	for i, s := range pr.Spans {
		slot[i], pos0[i], nn[i], row0[i], last[i] = int32(s.Slot), int32(s.Pos0), int32(s.N), int32(s.Row0), int32(s.Row0+s.N-1)
		for j := 0; j < s.N; j++ {
			rowSeq[s.Row0+j], rowPos[s.Row0+j] = int32(i), int32(s.Pos0+j)
		}
	}
	oTok := mb.i32(pr.Tokens)
	var oHidden int64 = -1
	if pr.Hidden != nil {
		oHidden = mb.f32(pr.Hidden)
	}
	oSlot, oPos0, oN, oRow0 := mb.i32(slot), mb.i32(pos0), mb.i32(nn), mb.i32(row0)
	oRowSeq, oRowPos, oLast := mb.i32(rowSeq), mb.i32(rowPos), mb.i32(last)
	ck, sp := make([]int32, rc.S), make([]int32, rc.S)
	for i := range ck {
		ck[i], sp[i] = int32(ckpt[i]), int32(share[i])
	}
	oCkpt, oShare, oSpanRows := mb.i32(ck), mb.i32(sp), mb.i32(pr.SpanRowIndex())
	nrows := pr.Rows()
	var oSpec int64 = -1
	if pr.Sample != nil {
		specs := make([]kc.SampleSpec, len(pr.Sample))
		for i, s := range pr.Sample {
			specs[i] = kc.SampleSpec{Temperature: s.Params.Temperature, TopP: s.Params.TopP, MinP: s.Params.MinP, U: s.U, TopK: int64(s.Params.TopK), NTop: int64(s.TopLogprobs)}
		}
		oSpec = mb.raw(unsafe.Pointer(unsafe.SliceData(specs)), int64(len(specs))*int64(unsafe.Sizeof(specs[0])))
	}
	if err := p.ensure(&p.meta, &p.metaSize, int64(len(mb.buf))); err != nil {
		return nil, err
	}
	at := func(off int64) kc.DevicePtr { return p.meta + kc.DevicePtr(off) }
	rc.toks = at(oTok)
	if oHidden >= 0 {
		rc.hidden = at(oHidden)
	}
	rc.ckpt, rc.sharePos, rc.spanRows = at(oCkpt), at(oShare), at(oSpanRows)
	rc.meta = kc.BatchMeta{SeqSlot: at(oSlot), SeqPos0: at(oPos0), SeqN: at(oN), SeqRow0: at(oRow0), RowSeq: at(oRowSeq), RowPos: at(oRowPos), LastRow: at(oLast), S: int64(rc.S), T: int64(rc.T)}
	gkey, graphed := p.graphKey(pr, store)
	lv := p.plan.Logits
	var sampleArgs *sampleLaunch
	if pr.Sample != nil { // (before the graph lookup: growing p.out drops the graphs)
		var err error
		if sampleArgs, err = p.sampleArgs(rc, at(oSpec), nrows, graphed); err != nil {
			return nil, err
		}
	}
	// 2. the arena plan: a captured graph's is kept with it (its launches
	// hold the addresses), so a replay plans nothing
	var ent *capturedGraph
	if graphed {
		ent = p.graphs[gkey]
	}
	var tempSize [][]int64
	if ent != nil {
		rc.addr = ent.addr
	} else {
		rc.addr = map[*ir.Value]kc.DevicePtr{}
		var err error
		if tempSize, err = p.planArena(rc, graphed); err != nil {
			return nil, err
		}
	}
	// replay the plan with real addresses while launching (or capturing)
	launchAll := func() error {
		if err := p.launchSteps(rc, tempSize); err != nil {
			return err
		}
		if sampleArgs != nil {
			return sampleArgs.launch(dev, rc.addr[lv], nrows)
		}
		return nil
	}
	if graphed && ent == nil {
		if p.usesLt {
			if err := dev.EnsureLtWorkspace(); err != nil {
				return nil, err
			}
		}
		g, err := dev.Capture(launchAll)
		if err != nil {
			return nil, fmt.Errorf("cuda: capturing a graph for %d tokens in %d sequences: %w", pr.T, len(pr.Spans), err)
		}
		ent = &capturedGraph{g: g, addr: rc.addr}
		p.graphs[gkey] = ent
		p.captures.Add(1)
	}
	// the step's device time: from before its upload to after its last
	// kernel (the host's planning above is not in it: PrepNs counts it),
	// read once the results have come back
	p.prepNs.Add(int64(time.Since(t0)))
	if err := dev.RecordEvent(p.evStart); err != nil {
		return nil, err
	}
	if err := dev.Upload(p.meta, unsafe.Pointer(unsafe.SliceData(mb.buf)), int64(len(mb.buf))); err != nil {
		return nil, err
	}
	if ent != nil {
		if err := dev.Replay(ent.g); err != nil {
			return nil, err
		}
		p.replays.Add(1)
	} else if err := launchAll(); err != nil {
		return nil, err
	}
	if err := dev.RecordEvent(p.evEnd); err != nil {
		return nil, err
	}
	// 3. results: the samples (picked on the device), then what the caller reads
	res := &backend.Result{Vocab: p.plan.Vocab, Rows: rc.rows(lv)}
	logits := rc.addr[lv]
	if sampleArgs != nil {
		outs, err := p.readSamples(rc, nrows)
		if err != nil {
			return nil, err
		}
		res.Samples = outs
	}
	if !pr.SamplesOnly {
		res.Logits = make([]float32, res.Rows*res.Vocab)
		if err := dev.Download(unsafe.Pointer(unsafe.SliceData(res.Logits)), logits, 4*int64(len(res.Logits))); err != nil {
			return nil, err
		}
	}
	for v, name := range p.plan.Hidden {
		if res.Hidden == nil {
			res.Hidden = map[string][]float32{}
		}
		h := make([]float32, rc.bytesOf(v)/4)
		if err := dev.Download(unsafe.Pointer(unsafe.SliceData(h)), rc.addr[v], 4*int64(len(h))); err != nil {
			return nil, err
		}
		res.Hidden[name] = h
	}
	if pr.SamplesOnly && pr.Sample == nil {
		if err := dev.Sync(); err != nil {
			return nil, err
		}
	}
	ms, err := dev.ElapsedKeep(p.evStart, p.evEnd) // the stream is done: no wait
	if err != nil {
		return nil, err
	}
	p.deviceNs.Add(int64(ms * 1e6))
	return res, nil
}

// planArena sizes the arena for the batch of rc (the values' bytes and
// every step's scratch, released after their last reader) and grows it; it
// returns every step's scratch sizes. A captured launch (graphed) sizes the
// DSA pools by the store, not by the batch's positions.
func (p *Program) planArena(rc *runCtx, graphed bool) ([][]int64, error) {
	for _, kp := range p.kpoolSizes {
		if graphed { // a captured launch may not depend on positions: size by the store
			rc.maxVisible[kp] = rc.store.maxPos/kp + 1
			continue
		}
		for _, s := range rc.pr.Spans {
			rc.maxVisible[kp] = max(rc.maxVisible[kp], (s.Pos0+s.N)/kp)
		}
	}
	ap := &arenaPlan{}
	off := map[*ir.Value]int64{}
	tempOff := make([][]int64, len(p.steps))
	tempSize := make([][]int64, len(p.steps))
	lastUse := p.plan.LastUse
	for si, st := range p.steps {
		if err := p.streamStep(ap, nil, si); err != nil {
			return nil, err
		}
		for _, o := range st.node.Outputs {
			if n := rc.bytesOf(o); n > 0 {
				off[o] = ap.alloc(n)
			}
		}
		if st.temps != nil {
			tempSize[si] = st.temps(rc)
			for _, n := range tempSize[si] {
				tempOff[si] = append(tempOff[si], ap.alloc(n))
			}
			for i, n := range tempSize[si] {
				ap.release(tempOff[si][i], n)
			}
		}
		for _, in := range st.node.Inputs {
			if o, ok := off[in]; ok && lastUse[in] == si {
				ap.release(o, rc.bytesOf(in))
				delete(off, in)
			}
		}
		for _, o := range st.node.Outputs {
			if _, used := lastUse[o]; !used {
				if oo, ok := off[o]; ok {
					ap.release(oo, rc.bytesOf(o))
					delete(off, o)
				}
			}
		}
	}
	if err := p.ensure(&p.arena, &p.arenaSize, ap.peak); err != nil {
		return nil, err
	}
	return tempSize, nil
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

// launchSteps runs the arena plan a second time with real addresses,
// launching every step (or recording it, inside a capture).
func (p *Program) launchSteps(rc *runCtx, tempSize [][]int64) error {
	ap2 := &arenaPlan{}
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
		default:
			return fmt.Errorf("cuda: graph input %q is not provided by the executor", in.Name)
		}
	}
	lastUse := p.plan.LastUse
	// the side stream is used where not profiling (per-op events time the
	// main stream)
	var sdev *kc.Device
	if rc.profile == nil {
		sdev = rc.dev
	}
	for si, st := range p.steps {
		if err := p.streamStep(ap2, sdev, si); err != nil {
			return err
		}
		for _, o := range st.node.Outputs {
			if n := rc.bytesOf(o); n > 0 {
				rc.addr[o] = p.arena + kc.DevicePtr(ap2.alloc(n))
			}
		}
		rc.temps = rc.temps[:0]
		for _, n := range tempSize[si] {
			rc.temps = append(rc.temps, p.arena+kc.DevicePtr(ap2.alloc(n)))
		}
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
		for i, n := range tempSize[si] {
			ap2.release(int64(rc.temps[i]-p.arena), n)
		}
		for _, in := range st.node.Inputs {
			if a, ok := rc.addr[in]; ok && lastUse[in] == si && in.Kind != ir.Input {
				ap2.release(int64(a-p.arena), rc.bytesOf(in))
				delete(rc.addr, in)
			}
		}
		for _, o := range st.node.Outputs {
			if _, used := lastUse[o]; !used {
				if a, ok := rc.addr[o]; ok {
					ap2.release(int64(a-p.arena), rc.bytesOf(o))
					delete(rc.addr, o)
				}
			}
		}
	}
	return p.streamStep(ap2, sdev, len(p.steps))
}

// sampleArgs prepares the device sampler's launch: outputs and, when some
// row samples (or the launch is captured, when any later step may), the
// per-row mass scratch.
func (p *Program) sampleArgs(rc *runCtx, specs kc.DevicePtr, rows int, graphed bool) (*sampleLaunch, error) {
	V := int64(p.plan.Vocab)
	outBytes := int64(rows) * int64(unsafe.Sizeof(kc.SampleOut{}))
	chunk, nchunks := sampleChunks(V)
	partBytes := int64(rows) * nchunks * int64(unsafe.Sizeof(kc.SamplePart{}))
	need := roundUp(outBytes) + roundUp(partBytes)
	anyTemp := graphed
	for _, s := range rc.pr.Sample {
		anyTemp = anyTemp || s.Params.Temperature > 0
	}
	if anyTemp {
		need += 8 * int64(rows) * V
	}
	if err := p.ensure(&p.out, &p.outSize, need); err != nil {
		return nil, err
	}
	parts := p.out + kc.DevicePtr(roundUp(outBytes))
	a := &kc.SampleArgs{Vocab: V, Rows: int64(rows), Specs: specs, Out: p.out, Parts: parts, Nchunks: nchunks}
	if anyTemp {
		a.Mass = parts + kc.DevicePtr(roundUp(partBytes))
	}
	part := &kc.SamplePartArgs{Vocab: V, Rows: int64(rows), Chunk: chunk, Nchunks: nchunks, Specs: specs, Parts: parts}
	return &sampleLaunch{final: a, part: part}, nil
}

// sampleThreads is the block size of glmf_sample and glmf_sample_part;
// samplePartPer is SAMPLE_PART_PER of sample.cu.
const (
	sampleThreads = 256
	samplePartPer = 8
)

// sampleChunks splits a vocabulary of V logits into the chunks of
// glmf_sample_part (a block each, its logits in registers).
func sampleChunks(V int64) (chunk, n int64) {
	chunk = sampleThreads * samplePartPer
	return chunk, (V + chunk - 1) / chunk
}

// sampleLaunch is the sampler's two launches: the chunks of every row
// (glmf_sample_part), then a block per row that combines them and picks.
type sampleLaunch struct {
	final *kc.SampleArgs
	part  *kc.SamplePartArgs
}

func (l *sampleLaunch) launch(dev *kc.Device, logits kc.DevicePtr, rows int) error {
	l.part.Logits, l.final.Logits = logits, logits
	if err := kc.LaunchSamplePart(dev, kc.Dim3{X: uint32(l.part.Nchunks), Y: uint32(rows)}, kc.Dim3{X: sampleThreads}, 0, l.part); err != nil {
		return err
	}
	return kc.LaunchSample(dev, kc.Dim3{X: uint32(rows)}, kc.Dim3{X: sampleThreads}, 0, l.final)
}

// readSamples copies the sampler's outputs back and turns them into picks.
func (p *Program) readSamples(rc *runCtx, rows int) ([]backend.Sample, error) {
	V := int64(p.plan.Vocab)
	outs := make([]kc.SampleOut, rows)
	if err := rc.dev.Download(unsafe.Pointer(unsafe.SliceData(outs)), p.out, int64(rows)*int64(unsafe.Sizeof(kc.SampleOut{}))); err != nil {
		return nil, err
	}
	res := make([]backend.Sample, rows)
	for i, o := range outs {
		if o.Nonfinite > 0 {
			res[i] = backend.Sample{Err: sample.NonFinite(int(o.Nonfinite), int(V), int(o.FirstBad), float32(o.BadValue))}
			continue
		}
		if o.Token < 0 || o.Token >= V {
			return nil, fmt.Errorf("cuda: the sampler picked token %d for row %d (vocabulary %d)", o.Token, i, V)
		}
		s := backend.Sample{Token: int32(o.Token), Logprob: float32(o.TokLogit - o.Lse)}
		for j := int64(0); j < o.NTop; j++ {
			s.Top = append(s.Top, sampleTop(o.TopId[j], o.TopLogit[j]-o.Lse))
		}
		res[i] = s
	}
	return res, nil
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

// metaBuilder packs the step's host metadata into one buffer (8-byte
// aligned sections).
type metaBuilder struct{ buf []byte }

func newMetaBuilder() *metaBuilder { return &metaBuilder{} }

func (m *metaBuilder) raw(p unsafe.Pointer, n int64) int64 {
	for len(m.buf)%16 != 0 {
		m.buf = append(m.buf, 0)
	}
	off := int64(len(m.buf))
	if n > 0 {
		m.buf = append(m.buf, unsafe.Slice((*byte)(p), n)...)
	}
	return off
}

func (m *metaBuilder) f32(v []float32) int64 {
	if len(v) == 0 {
		return m.raw(nil, 0)
	}
	return m.raw(unsafe.Pointer(unsafe.SliceData(v)), 4*int64(len(v)))
}

func (m *metaBuilder) i32(v []int32) int64 {
	if len(v) == 0 {
		return m.raw(nil, 0)
	}
	return m.raw(unsafe.Pointer(unsafe.SliceData(v)), 4*int64(len(v)))
}
