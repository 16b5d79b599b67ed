package cuda

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/plan"
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
	metaHost  []byte       // the last step's packed metadata, its storage reused (packMeta)
	out       kc.DevicePtr // sampling outputs and scratch
	outSize   int64
	// graphs are the captured launches of batches of up to
	// Options.GraphMaxTokens tokens, by shape.
	graphs map[graphKey]*capturedGraph
	// layouts are the arena layouts of the batch shapes run eagerly or
	// captured (layoutFor); maxID is the largest ID of a value the steps
	// produce (a layout's offsets are indexed by it).
	layouts map[layoutKey]*layout
	maxID   int
	// opTimes accumulates device time per op (Options.ProfileOps).
	opTimes map[string]*backend.OpTime

	runs, deviceReads, fusedMHC, launches, syncs, lengthSyncs, replays, captures, kernels, deviceNs, prepNs atomic.Int64
	// dropped counts the graphs destroyed by dropGraphs (stale addresses)
	dropped atomic.Int64

	// kernelRuns counts the program's kernel executions by the device's
	// kernel index (graph replays included); snap and now are scratch for
	// it (the device's counters before and after a run).
	kernelRuns, snap, now []int64
	// evStart, evEnd time every step on the device.
	evStart, evEnd kc.Event
	// usesLt: some GEMM runs a tuned cuBLASLt algorithm (its workspace is
	// allocated before any graph capture).
	usesLt bool
	// tick orders the graphs' replays (capturedGraph.used); evictions
	// counts the graphs destroyed to keep at most maxGraphs.
	tick      uint64
	evictions atomic.Int64
	// padPr, padCkpt and padShare are the storage of the last padded batch
	// (padBatch).
	padPr             backend.Prepared
	padCkpt, padShare []int
	// byKind counts the executed batches by step kind (backend.KindOf).
	byKind [backend.NumStepKinds]kindCounters
}

// kindCounters are one step kind's counters (backend.KindStats).
type kindCounters struct {
	steps, launches, replays, kernels, tokens, padTokens, deviceNs atomic.Int64
}

// Facts of the program's steps, fixed at Compile (see shareReuse,
// shareSave, kpools).
type stepFacts struct {
	shareExtra int
	shareSaves bool
	kpoolSizes []int
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
	prog := &Program{b: b, plan: p, consts: map[*ir.Value]devTensor{}, gateUps: map[*ir.Node]*gateUpDual{}, graphs: map[graphKey]*capturedGraph{}, layouts: map[layoutKey]*layout{}}
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
	for _, e := range p.Life.Events {
		prog.maxID = max(prog.maxID, e.Value.ID)
	}
	return prog, nil
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
	return backend.Stats{Runs: p.runs.Load(), DeviceLengthReads: p.deviceReads.Load(), FusedMHCRuns: p.fusedMHC.Load()}
}

// DeviceStats implements backend.DeviceCounter: the program's counters
// with its device work.
func (p *Program) DeviceStats() backend.DeviceStats {
	d := backend.DeviceStats{Stats: p.Stats(),
		Launches: p.launches.Load(), HostSyncs: p.syncs.Load(), LengthSyncs: p.lengthSyncs.Load(),
		GraphReplays: p.replays.Load(), GraphCaptures: p.captures.Load(), GraphEvictions: p.evictions.Load(),
		Kernels: p.kernels.Load(), DeviceNs: p.deviceNs.Load(), PrepNs: p.prepNs.Load()}
	d.GraphsHeld = d.GraphCaptures - d.GraphEvictions - p.dropped.Load()
	for k := range d.ByKind {
		c := &p.byKind[k]
		d.ByKind[k] = backend.KindStats{Steps: c.steps.Load(), Launches: c.launches.Load(), GraphReplays: c.replays.Load(), Kernels: c.kernels.Load(),
			Tokens: c.tokens.Load(), PadTokens: c.padTokens.Load(), DeviceNs: c.deviceNs.Load()}
	}
	return d
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
	if p.plan.Graph.DFlash() {
		return p.executeDraft(pr)
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
	slots, ckpt, share, err := store.batchState(pr, p.shareExtra)
	if err != nil {
		return nil, err
	}
	var res *backend.Result
	reserved := false
	rc := &runCtx{store: store, storeID: store.id, maxPos: store.maxPos}
	l0, r0, k0, d0 := p.launches.Load(), p.replays.Load(), p.kernels.Load(), p.deviceNs.Load()
	err = p.b.dev.Do(func() error {
		// the pages the run writes, all or none (backend.ErrNoPages), their
		// table entries uploaded before the step's kernels
		if err := store.reserve(pr); err != nil {
			return err
		}
		reserved = true
		return p.counted(func() error {
			var err error
			res, err = p.execute(rc, pr, ckpt, share)
			return err
		})
	})
	if err != nil {
		if reserved {
			store.trim(slots) // the pages past the unchanged lengths
		}
		return nil, err
	}
	store.commit(pr, slots, p.shareSaves)
	p.runs.Add(1)
	c := &p.byKind[backend.KindOf(pr)]
	c.steps.Add(1)
	c.launches.Add(p.launches.Load() - l0)
	c.replays.Add(p.replays.Load() - r0)
	c.kernels.Add(p.kernels.Load() - k0)
	c.deviceNs.Add(p.deviceNs.Load() - d0)
	c.tokens.Add(int64(pr.T))
	if rc.real != nil {
		c.padTokens.Add(int64(rc.pr.T - pr.T))
	}
	return res, nil
}

// executeDraft runs a DFlash draft batch on a draft store: each sequence's
// tokens are its block (never cached), its context rows are appended to
// every draft layer's K/V cache, and its slot advances by them once the
// batch has run (a failed batch leaves the lengths as they were; the rows
// it wrote past them are overwritten by the next).
func (p *Program) executeDraft(pr *backend.Prepared) (*backend.Result, error) {
	store, ok := pr.Store.(*DraftStore)
	if !ok || store.b != p.b {
		return nil, fmt.Errorf("cuda: a DFlash draft program runs on a draft store of this GPU backend (NewDraftStore), not %T", pr.Store)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := pr.CheckPositions(); err != nil {
		return nil, err
	}
	if _, err := store.draftState(pr); err != nil {
		return nil, err
	}
	none := make([]int, len(pr.Spans))
	for i := range none {
		none[i] = -1
	}
	var res *backend.Result
	err := p.b.dev.Do(func() error {
		return p.counted(func() error {
			var err error
			res, err = p.execute(&runCtx{draft: store, storeID: store.id, maxPos: store.maxPos}, pr, none, none)
			return err
		})
	})
	if err != nil {
		return nil, err
	}
	store.commitDraft(pr)
	p.runs.Add(1)
	return res, nil
}

// counted runs f (the device lock held) and adds the launches, host syncs
// and kernels it caused to the program's counters, by kernel too.
func (p *Program) counted(f func() error) error {
	dev := p.b.dev
	l0, s0 := dev.Launches(), dev.Syncs()
	p.snap = dev.KernelRuns(p.snap)
	err := f()
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
}

// runCtx is one execution's view: where every value lives.
type runCtx struct {
	p     *Program
	dev   *kc.Device
	pr    *backend.Prepared
	store *Store
	// draft is a DFlash draft batch's store (store is then nil); storeID
	// and maxPos are the batch's store's id and positions a slot
	draft   *DraftStore
	storeID uint64
	maxPos  int
	T, S    int
	R       int // rows a span-logits selection keeps
	// TC is the batch's context rows (ir.DimC: a DFlash draft batch's)
	TC int
	// context is the batch's context rows on the device (0: none); dmeta
	// the DFlash per-sequence metadata (draft batches)
	context kc.DevicePtr
	dmeta   kc.DFlashMeta
	meta    kc.BatchMeta
	// per sequence: the open checkpoint's position and the saved
	// selection's (−1: none); the rows a span-logits selection keeps
	ckpt, sharePos, spanRows kc.DevicePtr
	toks                     kc.DevicePtr
	// hidden is the batch's hidden rows (MTP graphs), 0 without them.
	hidden kc.DevicePtr
	// real is the caller's batch where pr is it padded to a bucket graph
	// (padBatch; nil: pr is the caller's): only its rows are read back.
	real  *backend.Prepared
	addr  map[*ir.Value]kc.DevicePtr
	temps []kc.DevicePtr
	host  map[*ir.Value]any
	// visible[kpool] = the largest number of pools any row sees.
	maxVisible map[int]int
	// profile collects each step's device events when op timing is on.
	profile []opEvents
}

func (rc *runCtx) rows(v *ir.Value) int {
	switch v.Shape[0] {
	case ir.DimT:
		return rc.T
	case ir.DimS:
		return rc.S
	case ir.DimR:
		return rc.R
	case ir.DimC:
		return rc.TC
	}
	return v.Shape[0]
}

// realRows is rows for the caller's batch: where the batch was padded to a
// bucket (rc.real), the rows of its real tokens, sequences, logits rows and
// context rows, which come first.
func (rc *runCtx) realRows(v *ir.Value) int {
	if rc.real == nil {
		return rc.rows(v)
	}
	switch v.Shape[0] {
	case ir.DimT:
		return rc.real.T
	case ir.DimS:
		return len(rc.real.Spans)
	case ir.DimR:
		return rc.real.SpanRows()
	case ir.DimC:
		return rc.real.TC
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

// stepPlan is what one batch runs: its packed metadata, the sampler's
// launch (nil: the batch does not sample) and either the captured graph it
// replays or the arena layout its eager launches use.
type stepPlan struct {
	meta   *metaBuilder
	sample *sampleLaunch
	graph  *capturedGraph
	lay    *layout
}

// execute runs one batch (the device lock held): plan (metadata, sampling,
// the arena layout or the captured graph that holds one), upload, launch
// or replay, results.
// rc holds the batch's store (store or draft, storeID, maxPos) and is
// completed here.
func (p *Program) execute(rc *runCtx, pr *backend.Prepared, ckpt, share []int) (*backend.Result, error) {
	t0 := time.Now()
	if q, ck, sh, ok := p.padBatch(rc, pr, ckpt, share); ok {
		rc.real, pr, ckpt, share = pr, q, ck, sh
	}
	rc.p, rc.dev, rc.pr, rc.T, rc.S, rc.R, rc.TC = p, p.b.dev, pr, pr.T, len(pr.Spans), pr.SpanRows(), pr.TC
	rc.host, rc.maxVisible = map[*ir.Value]any{}, map[int]int{}
	if p.b.cuda.ProfileOps {
		rc.profile = []opEvents{}
		defer p.collectProfile(rc)
	}
	sp, err := p.planStep(rc, ckpt, share)
	if err != nil {
		return nil, err
	}
	// the step's device time: from before its upload to after its last
	// kernel (the host's planning above is not in it: PrepNs counts it),
	// read once the results have come back
	p.prepNs.Add(int64(time.Since(t0)))
	if err := p.launch(rc, sp); err != nil {
		return nil, err
	}
	return p.results(rc, sp)
}

// planStep plans the batch of rc on the host: its metadata (packMeta), the
// sampler's launch and, unless a graph captured for its shape holds them
// (a replay plans nothing), the arena layout of its values, captured into
// a new graph where the batch runs as one.
func (p *Program) planStep(rc *runCtx, ckpt, share []int) (*stepPlan, error) {
	if err := p.ensureEvents(); err != nil {
		return nil, err
	}
	mb, specs, err := p.packMeta(rc, ckpt, share)
	if err != nil {
		return nil, err
	}
	sp := &stepPlan{meta: mb}
	key, graphed := p.graphKey(rc)
	if rc.pr.Sample != nil { // (before the graph lookup: growing p.out drops the graphs)
		if sp.sample, err = p.sampleArgs(rc, specs, rc.pr.Rows(), graphed); err != nil {
			return nil, err
		}
	}
	if graphed {
		sp.graph = p.lookup(key)
	}
	if sp.graph != nil {
		rc.addr = sp.graph.addr
		return sp, nil
	}
	rc.addr = map[*ir.Value]kc.DevicePtr{}
	p.setVisible(rc, graphed)
	if sp.lay, err = p.layoutFor(rc); err != nil {
		return nil, err
	}
	if graphed {
		if sp.graph, err = p.capture(rc, key, sp.lay, sp.sample); err != nil {
			return nil, err
		}
	}
	return sp, nil
}

// ensureEvents creates the events that time every step on the device.
func (p *Program) ensureEvents() error {
	if p.evStart != 0 {
		return nil
	}
	var err error
	if p.evStart, err = p.b.dev.NewEvent(); err != nil {
		return err
	}
	p.evEnd, err = p.b.dev.NewEvent()
	return err
}

// launch uploads the batch's metadata and replays its graph or launches
// its steps, between the events that time it on the device.
func (p *Program) launch(rc *runCtx, sp *stepPlan) error {
	dev := rc.dev
	if err := dev.RecordEvent(p.evStart); err != nil {
		return err
	}
	if err := dev.Upload(p.meta, unsafe.Pointer(unsafe.SliceData(sp.meta.buf)), int64(len(sp.meta.buf))); err != nil {
		return err
	}
	if sp.graph != nil {
		if err := dev.Replay(sp.graph.g); err != nil {
			return err
		}
		p.replays.Add(1)
	} else if err := p.launchAll(rc, sp.lay, sp.sample); err != nil {
		return err
	}
	return dev.RecordEvent(p.evEnd)
}

// results reads back what the caller asked for: the samples (picked on
// the device), the logits, the captured hidden streams; then the batch's
// device time.
func (p *Program) results(rc *runCtx, sp *stepPlan) (*backend.Result, error) {
	dev, pr, lv := rc.dev, rc.pr, p.plan.Logits
	if rc.real != nil { // a padded batch: its real rows come first
		pr = rc.real
	}
	res := &backend.Result{Vocab: p.plan.Vocab, Rows: rc.realRows(lv)}
	logits := rc.addr[lv]
	if sp.sample != nil {
		outs, err := p.readSamples(rc, pr.Rows())
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
		h := make([]float32, rc.bytesOf(v)/4/int64(max(rc.rows(v), 1))*int64(rc.realRows(v)))
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
