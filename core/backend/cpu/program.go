package cpu

import (
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/cache"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/kernels/mla"
	"github.com/glmflash/glmflash/kernels/moe"
	"github.com/glmflash/glmflash/model/safetensors"
)

// Program is a plan bound to CPU kernels. Run calls are serialized.
type Program struct {
	plan *plan.Plan
	opts backend.Options
	// poisonLengths: the backend's test hook (Backend.poisonLengths)
	poisonLengths bool
	w             *weights
	// consts are the float32 constants bound (read by runCtx.in);
	// gemmBound the GEMM weights bound through gemmWeight (no float32).
	// Both are written while compiling only.
	consts    map[*ir.Value][]float32
	gemmBound map[*ir.Value]bool
	steps     []step
	mu        sync.Mutex
	// Reused by every run (under mu): the activations' arena, a step's
	// temporary (scratch), the run context and the batch metadata, so that
	// a run allocates only when its batch is larger than any before.
	arena   *arena
	tmp     []float32
	rc      runCtx
	bi      batchInfo
	runMu   sync.Mutex       // held by Run while it uses prep
	prep    backend.Prepared // Run's batch, prepared into the same storage
	spanBuf []seqRun
	// resSlots and resTokens are a run's page reservation (reused).
	resSlots, resTokens []int
	// Kernel scratch shared by the program's nodes (steps run one at a
	// time): MoE routing and experts, KDA conv per sequence, KDA attention
	// per worker (kdaScratch), the indexer's head weights, sparse MLA (every
	// DSA layer's attention, by either path: the largest call's scratch).
	moeWS    moe.Workspace
	mlaWS    mla.Workspace
	convScr  [][]float32
	kdaTasks kdaScratch
	topkW    []float32

	runs, deviceReads, fusedMHC atomic.Int64
}

type step struct {
	node *ir.Node
	run  func(rc *runCtx) error
}

// Plan returns the plan the program was compiled from.
func (p *Program) Plan() *plan.Plan { return p.plan }

// Stats returns the program's counters.
func (p *Program) Stats() backend.Stats {
	return backend.Stats{Runs: p.runs.Load(), DeviceLengthReads: p.deviceReads.Load(), FusedMHCRuns: p.fusedMHC.Load()}
}

// gemmWeight binds a GEMM weight: bf16 bits (bf) when every value is
// exactly bf16 and FP32Weights is not set, else float32 (f). A BF16
// checkpoint's weight is read in place from its mapping (see weights.gemm).
func (p *Program) gemmWeight(v *ir.Value) (bf []uint16, f []float32, err error) {
	if !p.plan.IsConst(v) {
		return nil, nil, fmt.Errorf("weight %s is not a constant", v.Name)
	}
	b, err := p.w.gemm(p.plan, v, p.opts.FP32Weights)
	if err != nil {
		return nil, nil, err
	}
	p.gemmBound[v] = true
	return b.bf, b.f, nil
}

// linearWeight binds the weight of a linear or linear_split: FP8 matrices
// as stored (fp8) when the checkpoint holds it as FP8 and FP32Weights is
// not set, else as gemmWeight binds it (see weights.linear).
func (p *Program) linearWeight(v *ir.Value) (*boundWeight, error) {
	if !p.plan.IsConst(v) {
		return nil, fmt.Errorf("weight %s is not a constant", v.Name)
	}
	b, err := p.w.linear(p.plan, v, p.opts.FP32Weights)
	if err != nil {
		return nil, err
	}
	p.gemmBound[v] = true
	return b, nil
}

// fp8MatMul is the product of a dense FP8 weight (row-stacked parts) in
// this program's precision. fp32: gemm.MatMulTFP8Parts, equal bit for bit
// to the bf16 or float32 copy's product the weight used to be bound as.
// bf16: gemm.MatMulTFP8PartsAct when every value is exactly bf16 (checked
// on the first run, then cached), as the bf16 copy took
// gemm.MatMulTBF16ActWith; a weight that is not bf16-exact was bound as
// float32 and stays fp32 (gemm.MatMulTFP8Parts).
func (p *Program) fp8MatMul() func(dst, x []float32, T, K int, parts []*gemm.FP8, N int) {
	if !p.bf16Act() {
		return gemm.MatMulTFP8Parts
	}
	return func(dst, x []float32, T, K int, parts []*gemm.FP8, N int) {
		for _, w := range parts {
			if !w.BF16Exact(K) {
				gemm.MatMulTFP8Parts(dst, x, T, K, parts, N)
				return
			}
		}
		gemm.MatMulTFP8PartsAct(dst, x, T, K, parts, N)
	}
}

// bf16Act reports precision bf16: GEMMs with bf16 weights take their
// activations rounded to bfloat16 (gemm.MatMulTBF16Act, VDPBF16PS where
// the CPU has AVX-512 BF16) and accumulate in fp32. GEMMs whose weights are
// bound as float32 (not bf16-exact, or FP32Weights) and every other op stay
// fp32.
func (p *Program) bf16Act() bool { return p.opts.Precision == backend.BF16 }

// bf16MatMul is the product of bf16 weights in this program's precision.
func (p *Program) bf16MatMul() func(gemm.Params, []float32, []float32, int, int, []uint16, int) {
	if p.bf16Act() {
		return gemm.MatMulTBF16ActWith
	}
	return gemm.MatMulTBF16With
}

// stackedWeight binds a stacked GEMM weight [E][rows][cols] (MoE experts)
// as one bf16 slice per matrix (parts) when exact and FP32Weights is not
// set, else float32 (f); see weights.stacked.
func (p *Program) stackedWeight(v *ir.Value) (*boundWeight, error) {
	if !p.plan.IsConst(v) {
		return nil, fmt.Errorf("weight %s is not a constant", v.Name)
	}
	b, err := p.w.stacked(p.plan, v, p.opts.FP32Weights)
	if err != nil {
		return nil, err
	}
	p.gemmBound[v] = true
	return b, nil
}

// constant returns a constant's float32 values (nil when v is not
// constant or cannot be loaded: constErr says why).
func (p *Program) constant(v *ir.Value) []float32 {
	d, _ := p.constErr(v)
	return d
}

// constErr binds a float32 constant (shared by the backend's programs).
func (p *Program) constErr(v *ir.Value) ([]float32, error) {
	if d, ok := p.consts[v]; ok {
		return d, nil
	}
	if !p.plan.IsConst(v) {
		return nil, nil
	}
	d, err := p.w.float32(p.plan, v)
	if err != nil {
		return nil, err
	}
	p.consts[v] = d
	return d, nil
}

// seqRun is one sequence's place in a running batch.
type seqRun struct {
	slot int
	seq  *cache.Seq
	pos0 int // tokens already cached (position of the first new token)
	n    int // new tokens
	row0 int // first row in the batch's token dimension
	rows int // rows a span-logits selection keeps (its last ones)
	// A DFlash draft batch's sequence: its draft state, new context rows
	// and their first row in the context dimension (ir.DimC).
	draft    *cache.DraftSeq
	c, crow0 int
}

// batchInfo is the host-side metadata value of a run (graph input "batch").
type batchInfo struct {
	seqs []seqRun
	T    int
	R    int // rows a span-logits selection keeps
	TC   int // context rows (ir.DimC) of a DFlash draft batch
}

// dsaMeta is what a dsa_meta node computes for one DSA geometry: the
// sequences' spans and, per token, the pools it can see.
type dsaMeta struct {
	seqs  []seqRun
	kpool int
	topk  int
	// visible[row] = complete pools visible to that token.
	visible []int
	// keyLen[i] = keys of sequence i after this batch; closed[i] = pools
	// this batch completes for sequence i (the write plan).
	keyLen, closed []int
}

// spans returns the batch's sequence spans from a lengths source: the host
// metadata directly, or the executor's lengths tensor (a "device read").
// Either way the lengths are checked against the token count, so a wrong
// hint fails loudly instead of corrupting state.
func (rc *runCtx) spans(v *ir.Value) ([]seqRun, error) {
	if v.DType == ir.Host {
		bi, ok := rc.host[v].(*batchInfo)
		if !ok {
			return nil, fmt.Errorf("lengths source %s is not batch metadata", v.Name)
		}
		total := 0
		for _, s := range bi.seqs {
			total += s.n
		}
		if total != rc.batch.T {
			return nil, fmt.Errorf("host lengths sum to %d but the batch has %d tokens", total, rc.batch.T)
		}
		return bi.seqs, nil
	}
	lens, ok := rc.i[v]
	if !ok {
		return nil, fmt.Errorf("lengths tensor %s was not computed", v.Name)
	}
	rc.p.deviceReads.Add(1)
	if len(lens) != len(rc.batch.seqs) {
		return nil, fmt.Errorf("device lengths have %d entries for %d sequences", len(lens), len(rc.batch.seqs))
	}
	if cap(rc.p.spanBuf) < len(lens) {
		rc.p.spanBuf = make([]seqRun, len(lens))
	}
	out := rc.p.spanBuf[:len(lens)] // every call of a run computes the same spans
	row := 0
	for i, n := range lens {
		s := rc.batch.seqs[i]
		if int(n) != s.n {
			return nil, fmt.Errorf("device length of sequence %d is %d, host says %d", i, n, s.n)
		}
		s.row0 = row
		out[i] = s
		row += int(n)
	}
	return out, nil
}

type runCtx struct {
	p     *Program
	batch *batchInfo
	f     map[*ir.Value][]float32 // activations (ranges of the program's arena)
	ext   map[*ir.Value][]float32 // float graph inputs (the caller's memory, never pooled)
	i     map[*ir.Value][]int32
	host  map[*ir.Value]any
}

func (rc *runCtx) rows(v *ir.Value) int {
	switch v.Shape[0] {
	case ir.DimT:
		return rc.batch.T
	case ir.DimS:
		return len(rc.batch.seqs)
	case ir.DimR:
		return rc.batch.R
	case ir.DimC:
		return rc.batch.TC
	}
	return v.Shape[0]
}

func (rc *runCtx) size(v *ir.Value) int {
	n := rc.rows(v)
	for _, d := range v.Shape[1:] {
		n *= d
	}
	return n
}

// in returns a float input (activation or constant).
func (rc *runCtx) in(v *ir.Value) []float32 {
	if c, ok := rc.p.consts[v]; ok {
		return c
	}
	if x, ok := rc.ext[v]; ok {
		return x
	}
	return rc.f[v]
}

// out returns a float output's range of the arena (not cleared: every
// kernel writes all of its output).
func (rc *runCtx) out(v *ir.Value) []float32 {
	b := rc.p.arena.floats(v)
	rc.f[v] = b
	return b
}

// outI returns an int output's range of the arena, zeroed.
func (rc *runCtx) outI(v *ir.Value) []int32 {
	b := rc.p.arena.ints(v)
	clear(b)
	rc.i[v] = b
	return b
}

// Run validates and executes a batch.
func (p *Program) Run(b *backend.Batch, st backend.Store) (*backend.Result, error) {
	p.runMu.Lock() // the prepared batch is reused by every Run
	defer p.runMu.Unlock()
	if err := backend.PrepareInto(&p.prep, p, b, st, nil); err != nil {
		return nil, err
	}
	return p.execute1(&p.prep, b.Into)
}

// Execute runs a prepared batch after checking that every sequence's cache
// length equals the position it was prepared with.
func (p *Program) Execute(pr *backend.Prepared) (*backend.Result, error) {
	return p.execute1(pr, nil)
}

// execute1 is Execute writing the result into into when it is not nil.
//
// GEMM weights are read in place from the checkpoint's bytes: when those
// are a mapping of the file (model.weights: guarded), the weights are
// checked before the batch (plan.CheckWeights: the file is still the one
// loaded) and a fault while reading them (the file truncated under the
// mapping: SIGBUS) is recovered, on this goroutine and on the parallel
// helpers (kernels/parallel hands theirs over), into this batch's error;
// the file is refused from then on, so every later batch fails with the
// same reason instead of the process dying.
func (p *Program) execute1(pr *backend.Prepared, into *backend.Result) (res *backend.Result, err error) {
	if err := p.plan.CheckWeights(); err != nil {
		return nil, fmt.Errorf("cpu: %w", err)
	}
	if afterWeightsCheck != nil {
		afterWeightsCheck()
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			ferr := safetensors.FaultOf(r)
			if ferr == nil {
				panic(r)
			}
			res, err = nil, fmt.Errorf("cpu: %w", ferr)
		}
	}()
	return p.execute2(pr, into)
}

// afterWeightsCheck, when set (tests), runs between the weights' check and
// the batch: where a file truncated under a running batch would be.
var afterWeightsCheck func()

func (p *Program) execute2(pr *backend.Prepared, into *backend.Result) (*backend.Result, error) {
	if pr == nil || pr.Prog != p {
		return nil, fmt.Errorf("cpu: batch was prepared for another program")
	}
	if p.plan.Graph.DFlash() {
		return p.executeDraft(pr, into)
	}
	store, ok := pr.Store.(*cache.Store)
	if !ok {
		return nil, fmt.Errorf("cpu: the batch's store is not a CPU cache store")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := pr.CheckPositions(); err != nil {
		return nil, err
	}
	bi := &p.bi
	*bi = batchInfo{seqs: bi.seqs[:0], T: pr.T, R: pr.SpanRows()}
	for i, s := range pr.Spans {
		seq, err := store.Seq(s.Slot)
		if err != nil {
			return nil, err
		}
		if rb := seq.Rollback; rb != nil {
			if err := rb.Check(s.Pos0, s.N); err != nil {
				return nil, fmt.Errorf("cpu: batch sequence %d (slot %d): %w", i, s.Slot, err)
			}
		}
		bi.seqs = append(bi.seqs, seqRun{slot: s.Slot, seq: seq, pos0: s.Pos0, n: s.N, row0: s.Row0, rows: s.Rows})
	}
	// the pages the run writes, all or none (backend.ErrNoPages)
	p.resSlots, p.resTokens = p.resSlots[:0], p.resTokens[:0]
	for _, s := range bi.seqs {
		p.resSlots, p.resTokens = append(p.resSlots, s.slot), append(p.resTokens, s.pos0+s.n)
	}
	if err := store.Reserve(p.resSlots, p.resTokens); err != nil {
		return nil, fmt.Errorf("cpu: %w", err)
	}
	res, err := p.execute(bi, pr, func() error {
		for _, s := range bi.seqs {
			if err := store.Advance(s.slot, s.n); err != nil {
				return err
			}
		}
		return nil
	}, into)
	if err != nil {
		for _, s := range bi.seqs {
			_ = store.Trim(s.slot) // the pages past the unchanged lengths
		}
	}
	return res, err
}

// executeDraft runs a DFlash draft batch on a draft store: each sequence's
// tokens are its block (never cached), its context rows are appended to
// every draft layer's K/V state, and the store advances by them. A failed
// run leaves every slot's committed state as it was.
func (p *Program) executeDraft(pr *backend.Prepared, into *backend.Result) (*backend.Result, error) {
	store, ok := pr.Store.(*cache.DraftStore)
	if !ok {
		return nil, fmt.Errorf("cpu: a DFlash draft program runs on a draft store (cache.DraftStore), not %T", pr.Store)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := pr.CheckPositions(); err != nil {
		return nil, err
	}
	bi := &p.bi
	*bi = batchInfo{seqs: bi.seqs[:0], T: pr.T, R: pr.SpanRows(), TC: pr.TC}
	for _, s := range pr.Spans {
		seq, err := store.Seq(s.Slot)
		if err != nil {
			return nil, err
		}
		bi.seqs = append(bi.seqs, seqRun{slot: s.Slot, draft: seq, pos0: s.Pos0, n: s.N, row0: s.Row0, rows: s.Rows, c: s.C, crow0: s.CRow0})
	}
	res, err := p.execute(bi, pr, func() error {
		for _, s := range bi.seqs {
			if err := store.Advance(s.slot, s.c); err != nil {
				return err
			}
		}
		return nil
	}, into)
	if err != nil {
		for _, s := range bi.seqs {
			store.Rewind(s.slot)
		}
	}
	return res, err
}

// execute runs the bound steps on a batch, then commit (the store's
// advance) and the results.
func (p *Program) execute(bi *batchInfo, pr *backend.Prepared, commit func() error, into *backend.Result) (*backend.Result, error) {
	rc := &p.rc
	if rc.p == nil {
		*rc = runCtx{p: p, f: map[*ir.Value][]float32{}, ext: map[*ir.Value][]float32{}, i: map[*ir.Value][]int32{}, host: map[*ir.Value]any{}}
	}
	rc.batch = bi
	// clear keeps the maps' memory: a run writes the same keys again
	defer func() { clear(rc.f); clear(rc.ext); clear(rc.i); clear(rc.host) }()
	for _, in := range p.plan.Graph.Inputs {
		switch in.Name {
		case ir.InputTokens:
			rc.i[in] = pr.Tokens
		case ir.InputBatch:
			rc.host[in] = bi
		case ir.InputHidden:
			rc.ext[in] = pr.Hidden
		case ir.InputContext:
			rc.ext[in] = pr.Context
		default:
			return nil, fmt.Errorf("cpu: graph input %q is not provided by the executor", in.Name)
		}
	}
	if p.arena == nil {
		p.arena = newArena(p.steps)
	}
	p.arena.layout(p, rc)
	for _, st := range p.steps {
		if err := st.run(rc); err != nil {
			return nil, fmt.Errorf("cpu: %s (layer %d): %w", st.node.Op, st.node.Layer, err)
		}
	}
	if err := commit(); err != nil {
		return nil, err
	}
	p.runs.Add(1)
	// the arena is overwritten by the next run: results are copies
	lv := p.plan.Logits
	res := into
	if res == nil {
		res = &backend.Result{}
	}
	// a reused result keeps its storage (the caller asked for that)
	res.Vocab, res.Rows = p.plan.Vocab, rc.rows(lv)
	logits := rc.f[lv]
	if pr.SamplesOnly {
		res.Logits = nil // the caller reads only the samples: no copy
	} else {
		res.Logits = append(res.Logits[:0], logits...)
	}
	if len(p.plan.Hidden) == 0 {
		res.Hidden = nil
	}
	for v, name := range p.plan.Hidden {
		if res.Hidden == nil {
			res.Hidden = map[string][]float32{}
		}
		res.Hidden[name] = append(res.Hidden[name][:0], rc.f[v]...)
	}
	if pr.Sample != nil {
		res.Samples = backend.SampleHostInto(res.Samples[:0], logits, res.Vocab, pr.Sample)
	} else {
		res.Samples = nil
	}
	return res, nil
}
