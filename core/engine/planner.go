package engine

import (
	"errors"
	"fmt"
	"math"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/cache"
	"github.com/glmflash/glmflash/model"
)

// The memory planner. At start, once the weights are loaded (the
// scheduler's programs compiled), it asks the backend what memory is free
// (backend.MemoryReporter), keeps memory_fraction of it, sets aside a
// workspace estimate for a step of the token budget, and sizes the state
// slots and the page pool together from what a slot and a page cost
// (backend.StoreSizer, over every store the slots count in: the trunk's,
// and with MTP drafting the MTP layer's). The slots take at most half of
// what is left, and never so much that the pages of one sequence at the
// context limit would not fit beside them; the pages take the rest, up to
// what every slot at the context limit could use. Configured caps
// (runtime.slots, runtime.max_running) bound the slots; the report names
// what binds.

// Binding limits a MemoryPlan reports.
const (
	// BindPages: the page pool holds fewer sequences at the context limit
	// than the state slots allow (shorter ones run side by side up to the
	// slots; beyond the pages, the newest running request is preempted).
	BindPages = "pages"
	// BindStateSlots: the memory holds no more state slots.
	BindStateSlots = "state_slots"
	// BindDefault: the device's default bound on sequences
	// (Defaults.Slots), no key configured.
	BindDefault = "default_slots"
)

// Defaults are a device's runtime defaults where the configuration sets
// none: the most sequences the planner gives slots to, the prompt tokens
// of one request per step, the tokens of one step, and the fraction of
// free memory the caches and workspace may take.
type Defaults struct {
	Slots, PrefillChunk, MaxBatchTokens int
	MemoryFraction                      float64
}

// DefaultsFor is the runtime defaults of a device: on the CPU those the
// tests and the CPU benchmarks were made with (8 sequences, 64-token
// prompt chunks, 256-token steps) and half the host's available memory;
// on CUDA up to 256 sequences (vLLM's max_num_seqs), 2048-token prompt
// chunks in 8192-token steps, and 0.9 of the free device memory.
func DefaultsFor(device string) Defaults {
	if device == "cuda" {
		return Defaults{Slots: 256, PrefillChunk: 2048, MaxBatchTokens: 8192, MemoryFraction: 0.9}
	}
	return Defaults{Slots: 8, PrefillChunk: 64, MaxBatchTokens: 256, MemoryFraction: 0.5}
}

// MemoryRequest is what the planner sizes for.
type MemoryRequest struct {
	// Fraction of the free memory the caches and the workspace may take,
	// in (0, 1] (runtime.memory_fraction).
	Fraction float64
	// Slots and MaxRunning are configured caps on the state slots
	// (runtime.slots, runtime.max_running; 0: none); DefaultSlots bounds
	// them when neither is set.
	Slots, MaxRunning, DefaultSlots int
	// ContextLimit is the tokens one sequence may reach.
	ContextLimit int
	// MaxBatchTokens is the step's token budget the workspace is set aside
	// for (configured or the default).
	MaxBatchTokens int
}

// MemoryPlan is what the planner decided, and why.
type MemoryPlan struct {
	// Free and Total are the memory measured (bytes); Budget is Fraction ×
	// Free, of which Workspace is set aside for a step's activations.
	Free, Total, Budget, Workspace int64
	Fraction                       float64
	// What a page, a state slot and the stores once cost, over the stores
	// planned; PageTokens tokens per page.
	PageBytes, SlotBytes, FixedBytes int64
	PageTokens                       int
	// Pages and Slots are the pools; Planned = FixedBytes + Slots ×
	// SlotBytes + Pages × PageBytes + Workspace ≤ Budget.
	Pages, Slots int
	Planned      int64
	// MaxRunning is the sequences that run at once (≤ Slots);
	// MaxBatchTokens the tokens one step may hold; ContextSeqs the
	// sequences the pages hold at the context limit.
	MaxRunning, MaxBatchTokens, ContextSeqs int
	// Binding names what limits the running sequences: BindPages,
	// BindStateSlots, BindDefault or the configured key that binds
	// ("runtime.slots", "runtime.max_running", "runtime.max_batch_tokens":
	// fewer tokens per step than sequences).
	Binding string
}

// ErrMemory is the error (errors.Is) of a plan that cannot fit one
// sequence at the context limit.
var ErrMemory = errors.New("memory planner: not enough memory")

// Plan sizes the pools for free bytes of memory (total: in all) from the
// per-page, per-slot and fixed costs of the stores, and a workspace of
// workPerToken bytes per token of the step's budget plus workPerSeq per
// running sequence (its logits and sampling rows). The plan never takes
// more than req.Fraction × free.
func Plan(free, total int64, req MemoryRequest, cost backend.StoreCost, pageTokens int, workPerToken, workPerSeq int64) (*MemoryPlan, error) {
	switch {
	case !(req.Fraction > 0 && req.Fraction <= 1):
		return nil, fmt.Errorf("memory planner: runtime.memory_fraction must be in (0, 1], got %v", req.Fraction)
	case free < 0 || pageTokens < 1 || req.ContextLimit < 1 || req.MaxBatchTokens < 1:
		return nil, fmt.Errorf("memory planner: free %d bytes, %d-token pages, context %d, step %d tokens", free, pageTokens, req.ContextLimit, req.MaxBatchTokens)
	case cost.PageBytes < 1 || cost.SlotBytes < 1 || cost.FixedBytes < 0 || workPerToken < 0 || workPerSeq < 0:
		return nil, fmt.Errorf("memory planner: a page costs %d bytes, a slot %d (both must be positive)", cost.PageBytes, cost.SlotBytes)
	}
	p := &MemoryPlan{Free: free, Total: total, Fraction: req.Fraction, PageBytes: cost.PageBytes, SlotBytes: cost.SlotBytes + workPerSeq,
		FixedBytes: cost.FixedBytes, PageTokens: pageTokens}
	p.Budget = int64(math.Floor(req.Fraction * float64(free)))
	p.Workspace = workPerToken * int64(req.MaxBatchTokens)
	avail := p.Budget - p.Workspace - p.FixedBytes
	perSeq := int64((req.ContextLimit + pageTokens - 1) / pageTokens) // pages of one sequence at the context limit
	if one := p.SlotBytes + perSeq*p.PageBytes; avail < one {
		return nil, fmt.Errorf("%w: one sequence of runtime.context_limit %d tokens needs %s (a state slot and %d pages of %d tokens), beside a workspace of %s for runtime.max_batch_tokens %d; runtime.memory_fraction %v of %s free leaves %s: lower the context limit or the step budget, or raise the fraction",
			ErrMemory, req.ContextLimit, bytesStr(one), perSeq, pageTokens, bytesStr(p.Workspace), req.MaxBatchTokens, req.Fraction, bytesStr(free), bytesStr(max(avail, 0)))
	}
	capS, capName := req.DefaultSlots, BindDefault
	if req.Slots > 0 {
		capS, capName = req.Slots, "runtime.slots"
	}
	if req.MaxRunning > 0 && (req.Slots == 0 || req.MaxRunning < capS) {
		capS, capName = req.MaxRunning, "runtime.max_running"
	}
	capS = max(capS, 1)
	memS := min((avail-perSeq*p.PageBytes)/p.SlotBytes, avail/2/p.SlotBytes)
	memS = max(memS, 1) // one always fits (checked above)
	p.Slots, p.Binding = capS, capName
	if memS < int64(capS) {
		p.Slots, p.Binding = int(memS), BindStateSlots
	}
	pages := (avail - int64(p.Slots)*p.SlotBytes) / p.PageBytes
	pages = min(pages, int64(p.Slots)*perSeq, math.MaxInt32)
	p.Pages = int(pages)
	p.ContextSeqs = int(pages / perSeq)
	if p.ContextSeqs < p.Slots {
		p.Binding = BindPages
	}
	p.MaxRunning = p.Slots
	if req.MaxRunning > 0 {
		p.MaxRunning = min(p.MaxRunning, req.MaxRunning)
	}
	if req.MaxBatchTokens < p.MaxRunning { // every running sequence takes a token of each step
		p.MaxRunning, p.Binding = req.MaxBatchTokens, "runtime.max_batch_tokens"
	}
	p.MaxBatchTokens = max(min(req.MaxBatchTokens, p.Pages*pageTokens), p.MaxRunning)
	p.Planned = p.FixedBytes + int64(p.Slots)*p.SlotBytes + int64(p.Pages)*p.PageBytes + p.Workspace
	if p.Planned > p.Budget { // the arithmetic above forbids it
		return nil, fmt.Errorf("memory planner: planned %d bytes over the budget of %d", p.Planned, p.Budget)
	}
	return p, nil
}

// WorkspacePerToken estimates the activation bytes one token of a step
// holds on the device at its peak: the residual streams, the widest of
// the MLP, MoE, attention and KDA projections, and the attention scores
// over the indexer's selection, fp32, with room for what lives beside
// them (×3).
func WorkspacePerToken(cfg *model.Config) int64 {
	wide := max(2*cfg.IntermediateSize, 2*cfg.NumExpertsPerTok*cfg.MoEIntermediateSize,
		cfg.NumAttentionHeads*(cfg.QKNopeHeadDim+cfg.QKRopeHeadDim+cfg.VHeadDim), 4*cfg.LinearNumHeads*cfg.LinearHeadDim,
		cfg.IndexNHeads*cfg.IndexHeadDim)
	return 4 * 3 * int64(max(cfg.HCMult, 1)*cfg.HiddenSize+wide+cfg.NumAttentionHeads*cfg.IndexTopK)
}

// WorkspacePerSeq estimates a running sequence's share of a step's
// workspace: its logits row and the sampler's rows beside it, fp32.
func WorkspacePerSeq(cfg *model.Config) int64 { return 4 * 3 * int64(cfg.VocabSize) }

// PlanStores is which stores the planner sizes together with the trunk's
// (each gets the same slots and pages).
type PlanStores struct {
	// MTP: the MTP layer's store (speculative method mtp).
	MTP bool
}

// PlanMemory measures the backend's free memory now (call it once the
// programs are compiled: the weights are then held), plans the pools
// (Plan) and makes the trunk store (and, with stores.MTP, the MTP store)
// of the planned slots and pages. The engine must have been made with
// Options.Planned; the plan is kept (MemoryPlan).
func (e *Engine) PlanMemory(req MemoryRequest, stores PlanStores) (*MemoryPlan, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.be == nil:
		return nil, fmt.Errorf("engine: closed")
	case !e.opts.Planned || e.store != nil:
		return nil, fmt.Errorf("engine: PlanMemory needs an engine made with Options.Planned, once")
	}
	mr, ok1 := e.be.(backend.MemoryReporter)
	sz, ok2 := e.be.(backend.StoreSizer)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("engine: device %s cannot say what memory is free or what a store costs: no memory planner", e.be.Name())
	}
	o := e.opts.storeOptions()
	o.MaxPositions = req.ContextLimit
	sets := [][]int{e.cfg.TrunkLayers()}
	if stores.MTP {
		sets = append(sets, e.cfg.MTPLayers())
	}
	var cost backend.StoreCost
	for _, layers := range sets {
		c, err := sz.StoreCost(e.cfg, layers, o)
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		cost.PageBytes += c.PageBytes
		cost.SlotBytes += c.SlotBytes
		cost.FixedBytes += c.FixedBytes
	}
	if d := e.DFlash(); d != nil { // the drafter's K/V rows, contiguous per slot
		cost.SlotBytes += cache.DraftSlotBytes(d.NumHiddenLayers, d.KVWidth(), req.ContextLimit)
	}
	P, err := cache.PageTokens(e.cfg, e.opts.PageTokens)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	free, total, err := mr.FreeMemory()
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	p, err := Plan(free, total, req, cost, P, WorkspacePerToken(e.cfg), WorkspacePerSeq(e.cfg))
	if err != nil {
		return nil, err
	}
	e.opts.Slots, e.opts.Pages, e.opts.MaxPositions = p.Slots, p.Pages, req.ContextLimit
	st, err := e.be.NewStore(e.cfg, e.cfg.TrunkLayers(), e.opts.storeOptions())
	if err != nil {
		return nil, fmt.Errorf("engine: the planned store (%d slots, %d pages): %w", p.Slots, p.Pages, err)
	}
	e.store, e.plan = st, p
	return p, nil
}

// MemoryPlan is the engine's memory plan (nil: none was made).
func (e *Engine) MemoryPlan() *MemoryPlan {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.plan
}

// bytesStr writes a byte count in MiB, or GiB from 1 GiB.
func bytesStr(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
}
