// Package engine ties a checkpoint to compiled programs and cache stores
// on one backend: it builds (and memoizes) one program per batch mode and
// logits selection, all sharing one copy of the weights; the trunk's
// programs run on the trunk store, the MTP layer's on a store of its own.
package engine

import (
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"sync"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"

	// The backends register themselves.
	_ "github.com/glmflash/glmflash/core/backend/cpu"
	_ "github.com/glmflash/glmflash/core/backend/cuda"
)

// GraphHook may rewrite a freshly built graph before it is compiled (the
// pass pipeline plugs in here). It must leave a graph that verifies.
type GraphHook func(g *ir.Graph, key Key) error

// Options configure an engine.
type Options struct {
	Slots int // sequence slots in the cache store (default 8)
	// Device names the backend ("cpu", the default, or "cuda"); Backend
	// configures it. An already open backend can be given instead
	// (BackendInstance), which the engine then does not close.
	Device          string
	Backend         backend.Options
	BackendInstance backend.Backend
	// Passes, when set, rewrites every program's graph before compilation;
	// PassEnv is the eligibility environment (its Program field is set per
	// program).
	Passes  *pass.Pipeline
	PassEnv *pass.Env
	// Hook runs after the passes (tests and tools use it).
	Hook GraphHook
	// MaxPositions bounds sequence length (default: the model's
	// max_position_embeddings); device stores size their caches by it.
	MaxPositions int
	// Parity, when set, checks the programs in which its passes fired
	// against the programs without passes on a built-in probe, and refuses
	// a program that differs (parity.go).
	Parity *Parity
	// Rollback lets the stores' slots be checkpointed and cut back over up
	// to this many positions (speculative decoding: the longest verify span,
	// num_steps + 1); device stores keep per-position KDA states and indexer
	// rows for it in every slot. 0: no checkpoints.
	Rollback int
	// DFlash, when set, is a DFlash block drafter run beside the trunk
	// (speculative.method dflash): checked against the model at New, its
	// draft programs (Key.DFlash) run on its own store (DraftStore), and
	// trunk programs with Key.TargetHidden capture its target layers.
	DFlash DraftModel
	// PageTokens and Pages size the stores' page pools
	// (backend.StoreOptions; 0: the defaults, every slot can hold
	// MaxPositions tokens).
	PageTokens, Pages int
	// KVDType is the stores' latent dtype ("": auto).
	KVDType backend.KVDType
	// Planned makes no store at New: PlanMemory sizes the slots and the
	// page pool from the memory free once the programs are compiled, and
	// makes the stores (Store is nil until then; Slots and Pages are the
	// plan's).
	Planned bool
	// TP is the number of tensor-parallel ranks (parallel.tp_size; 0 or
	// 1: one device). Above 1 the engine runs one rank engine per rank,
	// each on its own backend with its rank of an in-process
	// collective.Group (ranks are goroutines: the cpu backend), each
	// program the rank's shard of the graph (graph.Options.TP); its
	// programs and stores fan out to the ranks (tp.go).
	TP int
}

// Key identifies one program.
type Key struct {
	Mode          graph.Mode
	Logits        graph.Logits
	CaptureHidden bool
	// FinalHidden: the trunk graph also outputs ir.OutputFinalHidden (the
	// MTP layer's h for every token).
	FinalHidden bool
	// MTP selects the MTP layer's graph (graph.BuildMTP): its batches carry
	// hidden rows and run on the MTP store (MTPStore).
	MTP bool
	// IndexShare (MTP graphs): graph.Options.IndexShare, the draft steps
	// that reuse step 0's indexer selection (0: none).
	IndexShare int
	// DFlash selects the DFlash drafter's draft graph (graph.BuildDFlash):
	// its batches carry context rows and run on the draft store.
	DFlash bool
	// TargetHidden: the trunk graph also outputs ir.OutputTargetHidden,
	// the drafter's target layers' hidden rows for every token
	// (graph.Options.TargetLayers from the drafter's target_layer_ids).
	TargetHidden bool
}

// Engine runs a model.
type Engine struct {
	cfg      *model.Config
	weights  *plan.WeightCache
	be       backend.Backend
	ownsBE   bool
	store    backend.Store
	mtpStore backend.Store // made on first use
	// draftStore is the DFlash drafter's (made on first use); trunkSrc the
	// trunk's own weight source (weights wraps it with the drafter's).
	draftStore backend.Store
	trunkSrc   plan.Weights
	opts       Options
	mu         sync.Mutex
	progs      map[Key]backend.Program
	reports    map[Key]*pass.Report
	closeErr   error
	plan       *MemoryPlan // PlanMemory's (nil: none)
	// shard is the rank a rank engine of a tensor-parallel group runs
	// (Size 0: one device); tp holds a group leader's rank engines.
	shard graph.Shard
	tp    *tpRanks
}

// String names a program ("prefill/all", "mtp:decode/last").
func (k Key) String() string {
	s := k.Mode.String() + "/" + string(k.Logits)
	if k.MTP {
		s = "mtp:" + s
	}
	if k.DFlash {
		s = "dflash:" + s
	}
	if k.TargetHidden {
		s += "+target"
	}
	if k.CaptureHidden {
		s += "+hidden"
	}
	if k.FinalHidden {
		s += "+final"
	}
	if k.IndexShare > 0 {
		s += fmt.Sprintf("+share%d", k.IndexShare)
	}
	return s
}

// New creates an engine over cfg and a weight source on the backend
// opts.Device. Engines given the same *plan.WeightCache share every loaded
// host tensor.
func New(cfg *model.Config, w plan.Weights, opts Options) (*Engine, error) {
	if opts.TP > 1 {
		return newTP(cfg, w, opts)
	}
	if opts.TP < 0 {
		return nil, fmt.Errorf("engine: parallel.tp_size must be ≥ 1, got %d", opts.TP)
	}
	return newEngine(cfg, w, opts, graph.Shard{})
}

// newEngine is New for one device, or for one rank of a tensor-parallel
// group (shard): its store is sized for the rank's heads.
func newEngine(cfg *model.Config, w plan.Weights, opts Options, shard graph.Shard) (*Engine, error) {
	if opts.Slots == 0 {
		opts.Slots = 8
	}
	if opts.MaxPositions == 0 {
		opts.MaxPositions = cfg.MaxPositionEmbeddings
	}
	trunkSrc := w
	if opts.DFlash != nil {
		if err := opts.DFlash.DFlashConfig().CheckTarget(cfg); err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		w = withDraft(w, opts.DFlash)
	}
	be, owns := opts.BackendInstance, false
	if be == nil {
		var err error
		if be, err = backend.Open(opts.Device, opts.Backend); err != nil {
			return nil, fmt.Errorf("engine: device %s: %w", deviceName(opts.Device), err)
		}
		owns = true
	}
	var st backend.Store
	if !opts.Planned {
		var err error
		if st, err = be.NewStore(graph.ShardConfig(cfg, shard.Size), cfg.TrunkLayers(), opts.storeOptions()); err != nil {
			if owns {
				be.Close()
			}
			return nil, err
		}
	}
	return &Engine{cfg: cfg, weights: plan.NewWeightCache(w), trunkSrc: trunkSrc, be: be, ownsBE: owns, store: st, opts: opts, progs: map[Key]backend.Program{}, reports: map[Key]*pass.Report{}, shard: shard}, nil
}

func (o Options) storeOptions() backend.StoreOptions {
	return backend.StoreOptions{Slots: o.Slots, MaxPositions: o.MaxPositions, Rollback: o.Rollback, PageTokens: o.PageTokens, Pages: o.Pages, KVDType: o.KVDType}
}

// Rollback is the stores' rollback depth (Options.Rollback).
func (e *Engine) Rollback() int { return e.opts.Rollback }

func deviceName(d string) string {
	if d == "" {
		return "cpu"
	}
	return d
}

// Close releases the programs' and the store's device memory, and the
// backend when the engine opened it. The engine is unusable afterwards.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.be == nil {
		return e.closeErr
	}
	var errs []error
	if e.tp != nil {
		for _, r := range e.tp.ranks {
			errs = append(errs, r.Close())
		}
		e.progs, e.be = map[Key]backend.Program{}, nil
		e.closeErr = errors.Join(errs...)
		return e.closeErr
	}
	for _, p := range e.progs {
		if c, ok := p.(io.Closer); ok {
			errs = append(errs, c.Close())
		}
	}
	e.progs = map[Key]backend.Program{}
	for _, st := range []backend.Store{e.store, e.mtpStore, e.draftStore} {
		if c, ok := st.(io.Closer); ok {
			errs = append(errs, c.Close())
		}
	}
	if e.ownsBE {
		errs = append(errs, e.be.Close())
	}
	e.be = nil
	e.closeErr = errors.Join(errs...)
	return e.closeErr
}

// Config returns the model configuration.
func (e *Engine) Config() *model.Config { return e.cfg }

// Store returns the sequence cache of the trunk (nil before PlanMemory
// with Options.Planned: plan before the engine is shared).
func (e *Engine) Store() backend.Store { return e.store }

// MTPStore returns the MTP layer's sequence cache (its MLA latents and
// indexer pools, with its own positions), making it on first use with the
// trunk store's slot count and context limit. A drafter allocates an MTP
// slot beside each trunk slot it drafts for.
func (e *Engine) MTPStore() (backend.Store, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.mtpStoreLocked()
}

func (e *Engine) mtpStoreLocked() (backend.Store, error) {
	if e.mtpStore != nil {
		return e.mtpStore, nil
	}
	if e.be == nil {
		return nil, fmt.Errorf("engine: closed")
	}
	if !e.cfg.HasMTP() {
		return nil, fmt.Errorf("engine: the model has no MTP layer (num_nextn_predict_layers is %d)", e.cfg.NumNextNPredictLayers)
	}
	if e.opts.Planned && e.store == nil {
		return nil, fmt.Errorf("engine: the MTP store is sized by the memory plan: PlanMemory first")
	}
	if e.tp != nil {
		st, err := e.tp.stores(func(r *Engine) (backend.Store, error) { return r.MTPStore() })
		if err != nil {
			return nil, err
		}
		e.mtpStore = st
		return st, nil
	}
	st, err := e.be.NewStore(graph.ShardConfig(e.cfg, e.shard.Size), e.cfg.MTPLayers(), e.opts.storeOptions())
	if err != nil {
		return nil, fmt.Errorf("engine: MTP store: %w", err)
	}
	e.mtpStore = st
	return st, nil
}

// storeFor returns the store a program's batches run on.
func (e *Engine) storeFor(key Key) (backend.Store, error) {
	if key.MTP {
		return e.MTPStore()
	}
	if key.DFlash {
		return e.DraftStore()
	}
	if e.store == nil {
		return nil, fmt.Errorf("engine: no store yet: the memory plan makes it (PlanMemory)")
	}
	return e.store, nil
}

// Backend returns the engine's backend.
func (e *Engine) Backend() backend.Backend { return e.be }

// WeightBytes is the host memory held by loaded weights.
func (e *Engine) WeightBytes() int64 {
	if e.tp != nil {
		var n int64
		for _, r := range e.tp.ranks {
			n += r.WeightBytes()
		}
		return n
	}
	return e.weights.Bytes()
}

// Program returns the compiled program for key, building it on first use.
//
// A program compiled from a memory-mapped checkpoint (model.weights:
// guarded) reads the files here: the weights are checked first
// (plan.CheckedWeights), and a fault while reading them (a file truncated
// under the mapping: SIGBUS) is this call's error instead of the process's
// end.
func (e *Engine) Program(key Key) (prog backend.Program, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if p, ok := e.progs[key]; ok {
		return p, nil
	}
	if e.be == nil {
		return nil, fmt.Errorf("engine: closed")
	}
	if cw, ok := e.weights.Source().(plan.CheckedWeights); ok {
		if err := cw.CheckWeights(); err != nil {
			return nil, fmt.Errorf("engine: program %s: %w", key, err)
		}
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			ferr := safetensors.FaultOf(r)
			if ferr == nil {
				panic(r)
			}
			prog, err = nil, fmt.Errorf("engine: program %s: %w", key, ferr)
		}
	}()
	return e.program(key)
}

func (e *Engine) program(key Key) (backend.Program, error) {
	if e.tp != nil {
		return e.tpProgram(key)
	}
	g, err := e.build(key)
	if err != nil {
		return nil, err
	}
	if e.opts.Passes != nil {
		env := &pass.Env{HostLengths: true, TP: pass.Topology{Size: 1, Known: true}}
		if e.opts.PassEnv != nil {
			cp := *e.opts.PassEnv
			env = &cp
		}
		if env.Model == nil {
			env.Model = e.cfg
		}
		env.Program = key.String()
		env.Device = e.be.Name()
		if e.shard.Size > 1 { // the passes see the rank they run for
			env.TP = pass.Topology{Size: e.shard.Size, Rank: e.shard.Rank, Known: true}
		}
		if t, ok := e.be.(ir.GEMMTuner); ok {
			env.Tuner = t
		}
		rep, err := e.opts.Passes.Run(g, env)
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		e.reports[key] = rep
	}
	if e.opts.Hook != nil {
		if err := e.opts.Hook(g, key); err != nil {
			return nil, fmt.Errorf("engine: graph hook: %w", err)
		}
	}
	lazy := false
	if lw, ok := e.be.(backend.LazyWeights); ok {
		lazy = lw.LazyWeights()
	}
	maxPos := e.opts.MaxPositions
	if key.DFlash && maxPos > 0 { // a block past the last context position is never cached
		maxPos += e.DFlash().BlockSize
	}
	pl, err := plan.Compile(g, e.weights, plan.Options{MaxPositions: maxPos, Lazy: lazy})
	if err != nil {
		return nil, err
	}
	p, err := e.be.Compile(pl)
	if err != nil {
		return nil, err
	}
	if err := e.checkParity(key, p, e.reports[key]); err != nil {
		if c, ok := p.(io.Closer); ok {
			_ = c.Close()
		}
		return nil, err
	}
	e.progs[key] = p
	return p, nil
}

// build builds the graph of a program: the trunk's, or the MTP layer's
// after checking that the weights hold it (when the source can say).
func (e *Engine) build(key Key) (*ir.Graph, error) {
	opts := graph.Options{Mode: key.Mode, Logits: key.Logits, CaptureHidden: key.CaptureHidden, FinalHidden: key.FinalHidden, IndexShare: key.IndexShare, TP: e.shard}
	if key.DFlash || key.TargetHidden {
		d := e.DFlash()
		switch {
		case d == nil:
			return nil, fmt.Errorf("engine: program %s needs a DFlash drafter (speculative.draft_model); the engine has none", key)
		case key.MTP:
			return nil, fmt.Errorf("engine: program %s: an MTP graph is not a DFlash one", key)
		case key.DFlash && key.TargetHidden:
			return nil, fmt.Errorf("engine: program %s: the draft graph captures no target layers", key)
		case key.DFlash:
			return graph.BuildDFlash(e.cfg, d, opts)
		}
		opts.TargetLayers = d.TargetLayerIDs
	}
	if !key.MTP {
		return graph.Build(e.cfg, opts)
	}
	if err := e.MTPReady(); err != nil {
		return nil, err
	}
	return graph.BuildMTP(e.cfg, opts)
}

// MTPReady reports why the MTP layer cannot run (nil when it can): the
// model declares no MTP layer, or the weight source (when it can tell, as a
// model.Checkpoint can) lacks its tensors.
func (e *Engine) MTPReady() error {
	if !e.cfg.HasMTP() {
		return fmt.Errorf("engine: the model has no MTP layer (num_nextn_predict_layers is %d)", e.cfg.NumNextNPredictLayers)
	}
	if v, ok := e.trunkSrc.(interface{ ValidateMTP() error }); ok {
		if err := v.ValidateMTP(); err != nil {
			return fmt.Errorf("engine: %w", err)
		}
	}
	return nil
}

// Report returns the pass report of the program for key (nil when no
// passes are configured or the program was not built yet).
func (e *Engine) Report(key Key) *pass.Report {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reports[key]
}

// Reports returns every built program's pass report.
func (e *Engine) Reports() map[Key]*pass.Report {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[Key]*pass.Report{}
	for k, v := range e.reports {
		out[k] = v
	}
	return out
}

// Programs returns every built program by key.
func (e *Engine) Programs() map[Key]backend.Program {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[Key]backend.Program{}
	for k, v := range e.progs {
		out[k] = v
	}
	return out
}

// Run executes one batch with the program for key on its store.
func (e *Engine) Run(key Key, b *backend.Batch) (*backend.Result, error) {
	p, err := e.Program(key)
	if err != nil {
		return nil, err
	}
	st, err := e.storeFor(key)
	if err != nil {
		return nil, err
	}
	return p.Run(b, st)
}

// Prepare does the host-side work of a batch for the program of key with
// the scheduler's positions; it may run while another batch executes. It is
// refused for programs that read executor-produced lengths.
func (e *Engine) Prepare(key Key, b *backend.Batch, pos []int) (*backend.Prepared, error) {
	p, err := e.Program(key)
	if err != nil {
		return nil, err
	}
	if !p.Plan().HostLengths {
		return nil, fmt.Errorf("engine: Prepare needs host lengths (enable host-length-reuse); this program reads executor lengths")
	}
	if b == nil || len(pos) != len(b.Seqs) {
		return nil, fmt.Errorf("engine: Prepare needs one position per sequence")
	}
	st, err := e.storeFor(key)
	if err != nil {
		return nil, err
	}
	return backend.Prepare(p, b, st, pos)
}

// Execute runs a prepared batch.
func (e *Engine) Execute(key Key, pr *backend.Prepared) (*backend.Result, error) {
	p, err := e.Program(key)
	if err != nil {
		return nil, err
	}
	return p.Execute(pr)
}

// HostLengths reports whether the program of key can prepare batches ahead
// (the host-length-reuse pass removed every executor length read).
func (e *Engine) HostLengths(key Key) bool {
	p, err := e.Program(key)
	return err == nil && p.Plan().HostLengths
}
