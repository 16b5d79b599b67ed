// Package sched serves many requests on one engine with continuous
// batching: a scheduler goroutine runs one forward pass per step in which
// the decode tokens of running requests and prefill chunks of new ones share
// a ragged Mixed batch. New requests join at every step boundary; a request
// that ends (stop id, max tokens, abort, cancelled context, deadline) frees
// its cache slot at the next boundary at the latest, and nothing one request
// does can disturb another.
//
// Admission is bounded twice: requests run only while a cache slot is free
// (and fewer than MaxRunning run), and at most MaxQueue wait beyond that;
// past it Submit fails with ErrQueueFull.
package sched

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/speculative"
	"github.com/glmflash/glmflash/model"
	"github.com/rs/zerolog"
)

// Model is what the runtime drives; *engine.Engine implements it.
type Model interface {
	Config() *model.Config
	Store() backend.Store
	Run(key engine.Key, b *backend.Batch) (*backend.Result, error)
}

// Config bounds the scheduler. Zero fields take the defaults noted.
type Config struct {
	// MaxRunning requests hold cache slots and run at once (default and
	// upper bound: the store's capacity).
	MaxRunning int
	// MaxQueue requests may wait for a slot beyond those that can be
	// admitted now (default 64; negative: none may wait).
	MaxQueue int
	// MaxBatchTokens bounds the tokens of one forward pass (default 256;
	// at least MaxRunning, so that every running request advances).
	MaxBatchTokens int
	// PrefillChunk bounds the prompt tokens one request runs per step
	// (default 64), so long prompts do not stall other requests' decoding.
	PrefillChunk int
	// ContextLimit bounds prompt + generated tokens (default and upper
	// bound: the model's max_position_embeddings).
	ContextLimit int
	// MaxChoices bounds a request's N (default 16). A request of N
	// choices runs once N slots are free, so N is also held to
	// MaxRunning; each choice is within ContextLimit, so N × max_tokens
	// is bounded by MaxChoices × ContextLimit.
	MaxChoices int
}

// WithDefaults fills zero fields for a model and checks the result; it is
// idempotent.
func (c Config) WithDefaults(cfg *model.Config, slots int) (Config, error) {
	if c.MaxRunning == 0 {
		c.MaxRunning = slots
	}
	if c.MaxQueue == 0 {
		c.MaxQueue = 64
	}
	if c.MaxBatchTokens == 0 {
		c.MaxBatchTokens = max(256, c.MaxRunning)
	}
	if c.PrefillChunk == 0 {
		c.PrefillChunk = 64
	}
	if c.ContextLimit == 0 {
		c.ContextLimit = cfg.MaxPositionEmbeddings
	}
	if c.MaxChoices == 0 {
		c.MaxChoices = DefaultMaxChoices
	}
	switch {
	case c.MaxRunning < 1 || c.MaxRunning > slots:
		return c, fmt.Errorf("runtime: max_running must be in [1, %d] (the cache slots), got %d", slots, c.MaxRunning)
	case c.MaxBatchTokens < c.MaxRunning:
		return c, fmt.Errorf("runtime: max_batch_tokens (%d) must be ≥ max_running (%d) so that every running request advances each step", c.MaxBatchTokens, c.MaxRunning)
	case c.PrefillChunk < 1:
		return c, fmt.Errorf("runtime: prefill_chunk must be ≥ 1, got %d", c.PrefillChunk)
	case c.ContextLimit < 2 || (cfg.MaxPositionEmbeddings > 0 && c.ContextLimit > cfg.MaxPositionEmbeddings):
		return c, fmt.Errorf("runtime: context_limit must be in [2, %d] (max_position_embeddings), got %d", cfg.MaxPositionEmbeddings, c.ContextLimit)
	case c.MaxChoices < 1:
		return c, fmt.Errorf("runtime: max_choices must be ≥ 1, got %d", c.MaxChoices)
	}
	return c, nil
}

// Programs are the programs the scheduler runs: generation steps (last
// logits per sequence) and steps that hold a Score request (every row).
// Compile them all before serving (engine.Engine.Program) so that no step
// compiles a program inside the scheduler, stalling every stream.
var Programs = []engine.Key{
	{Mode: graph.Mixed, Logits: graph.LastLogits},
	{Mode: graph.Mixed, Logits: graph.AllLogits},
}

// Metrics receives the scheduler's measurements; every method must be
// cheap and safe for concurrent use. NopMetrics ignores them.
type Metrics interface {
	// Step: one forward pass over seqs sequences and tokens tokens.
	Step(seqs, tokens int, d time.Duration)
	// FirstToken: arrival → first generated token of a request.
	FirstToken(d time.Duration)
	// InterToken: gap between two consecutive tokens of a request.
	InterToken(d time.Duration)
	// Tokens: prompt tokens run and completion tokens produced.
	Tokens(prompt, completion int)
	// Finished: a request ended (once per request).
	Finished(f *Final)
	// Depth: requests waiting for a slot, and running.
	Depth(queued, running int)
	// Verified: one speculative verify span held drafted drafts, of which
	// the target accepted accepted (it produced accepted+1 tokens).
	Verified(drafted, accepted int)
}

// NopMetrics discards measurements.
type NopMetrics struct{}

func (NopMetrics) Step(int, int, time.Duration) {}
func (NopMetrics) FirstToken(time.Duration)     {}
func (NopMetrics) InterToken(time.Duration)     {}
func (NopMetrics) Tokens(int, int)              {}
func (NopMetrics) Finished(*Final)              {}
func (NopMetrics) Depth(int, int)               {}
func (NopMetrics) Verified(int, int)            {}

// Options are a runtime's collaborators.
type Options struct {
	Metrics Metrics
	Log     zerolog.Logger // one line per finished request; the zero Logger is silent
	// Drafter, when set, turns speculative decoding on: generation requests
	// (unless they opt out) get drafts, verified in the continuous batch.
	// The model's store must allow checkpoints of Drafter.MaxDrafts()+1
	// positions (engine.Options.Rollback). The scheduler calls the drafter
	// from its goroutine only; whoever made it closes it after the
	// scheduler.
	Drafter speculative.Drafter
	// SimulateAcceptance, when in (0, 1], pins the acceptance of every
	// verify span at this per-draft rate whatever the target says
	// (speculative.simulate_acceptance; speculative.SimulatedAccepts): the
	// accepted drafts are emitted as drafted, the target's own token of the
	// first rejected row (or the bonus) follows. It changes outputs, and
	// every request it touched says so (Final.SimulatedAcceptance). 0: off
	// (the target's acceptance rule). It needs a Drafter.
	SimulateAcceptance float64
	// StepFailed, when set, is told the error of every step that failed
	// (its requests fail with it), from the scheduler's goroutine, without
	// the scheduler's lock: a server can look for a cause that fails every
	// later step too (weights refused) and stop advertising itself.
	StepFailed func(err error)
}

// Scheduler schedules requests on a model.
type Scheduler struct {
	m      Model
	cfg    Config
	met    Metrics
	log    zerolog.Logger
	draft  speculative.Drafter // nil: no speculative decoding
	sim    float64             // Options.SimulateAcceptance (0: off)
	failed func(error)         // Options.StepFailed (nil: none)
	vocab  int
	eos    map[int32]bool // the model's end-of-sequence ids

	mu       sync.Mutex
	waiting  []*request // FIFO, not yet admitted
	running  []*request // hold a slot, in admission order
	byID     map[string]*request
	groups   map[string]*group // n > 1 requests by their id (their choices are in byID)
	reserved int               // slots held by choices of groups not yet forked
	draining bool
	closing  bool
	idle     chan struct{} // closed when draining and nothing is in flight
	rr       int           // round-robin start for decode tokens

	wake   chan struct{}
	exited chan struct{}

	// ahead counts steps whose host-side work was prepared while the
	// previous step executed.
	ahead atomic.Int64
	// preemptions counts requests preempted for KV pages (pages.go).
	preemptions atomic.Int64

	// afterFinal, when set (by tests), runs right after a final is
	// delivered, with mu held: it stands in for a scheduler that is
	// descheduled at that point on a loaded machine.
	afterFinal func()
}

// Preparer is implemented by models that can do a batch's host-side work
// (validation, batch metadata) ahead of execution; *engine.Engine does,
// for programs where the host-length-reuse pass removed every read of
// executor-produced lengths.
type Preparer interface {
	HostLengths(key engine.Key) bool
	Prepare(key engine.Key, b *backend.Batch, pos []int) (*backend.Prepared, error)
	Execute(key engine.Key, pr *backend.Prepared) (*backend.Result, error)
}

// PreparedAhead is how many steps were prepared on the host while the
// previous step was executing.
func (rt *Scheduler) PreparedAhead() int64 { return rt.ahead.Load() }

// New starts a runtime's scheduler goroutine; Close stops it.
func New(m Model, cfg Config, opts Options) (*Scheduler, error) {
	rt, err := newScheduler(m, cfg, opts)
	if err != nil {
		return nil, err
	}
	go rt.loop()
	return rt, nil
}

// newScheduler makes a scheduler without starting its goroutine (tests
// drive its steps one phase at a time).
func newScheduler(m Model, cfg Config, opts Options) (*Scheduler, error) {
	c, err := cfg.WithDefaults(m.Config(), m.Store().Capacity())
	if err != nil {
		return nil, err
	}
	if opts.Metrics == nil {
		opts.Metrics = NopMetrics{}
	}
	if d := opts.Drafter; d != nil {
		rb, ok := m.(interface{ Rollback() int })
		if !ok || rb.Rollback() < d.MaxDrafts()+1 {
			have := 0
			if ok {
				have = rb.Rollback()
			}
			return nil, fmt.Errorf("runtime: speculative decoding with %d drafts needs a store that rolls back %d positions (engine.Options.Rollback), it rolls back %d", d.MaxDrafts(), d.MaxDrafts()+1, have)
		}
	}
	if sim := opts.SimulateAcceptance; sim != 0 && (!(sim > 0 && sim <= 1) || opts.Drafter == nil) {
		return nil, fmt.Errorf("runtime: simulated acceptance must be a per-draft rate in (0, 1] with a drafter (0: off), got %v (drafter set: %v)", sim, opts.Drafter != nil)
	}
	rt := &Scheduler{
		m: m, cfg: c, met: opts.Metrics, log: opts.Log, draft: opts.Drafter, sim: opts.SimulateAcceptance, failed: opts.StepFailed, vocab: m.Config().VocabSize,
		byID: map[string]*request{}, groups: map[string]*group{}, wake: make(chan struct{}, 1), exited: make(chan struct{}), eos: map[int32]bool{},
	}
	for _, id := range m.Config().EOSTokenIDs {
		rt.eos[int32(id)] = true
	}
	return rt, nil
}

// Config is the effective configuration (defaults applied).
func (rt *Scheduler) Config() Config { return rt.cfg }

// SimulatedAcceptance is Options.SimulateAcceptance (0: off): the rate at
// which the scheduler simulates every verify span's acceptance.
func (rt *Scheduler) SimulatedAcceptance() float64 { return rt.sim }

// EndIDs are the ids that end req with FinishStop: its stop ids and, unless
// req.IgnoreEOS, the model's end-of-sequence ids (the text layer writes no
// text for them).
func (rt *Scheduler) EndIDs(req Request) []int32 {
	ids := slices.Clone(req.StopIDs)
	if !req.IgnoreEOS {
		for id := range rt.eos {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	return ids
}

// Validate checks a request against the model and the limits without
// submitting it; the error is an *InvalidError naming the field.
func (rt *Scheduler) Validate(req *Request) error {
	if len(req.Prompt) == 0 {
		return invalid("prompt_ids", "the prompt is empty")
	}
	for i, t := range req.Prompt {
		if t < 0 || int(t) >= rt.vocab {
			return invalid(fmt.Sprintf("prompt_ids[%d]", i), "token id %d is outside the vocabulary [0, %d)", t, rt.vocab)
		}
	}
	lim := rt.cfg.ContextLimit
	if len(req.Prompt) > lim {
		return invalid("prompt_ids", "the prompt has %d tokens, more than the context limit %d", len(req.Prompt), lim)
	}
	if err := rt.validateN(req); err != nil {
		return err
	}
	if req.Score {
		if req.Constraint != nil {
			return invalid("constraint", "a Score request generates nothing to constrain")
		}
		return nil
	}
	if req.MaxTokens < 1 {
		return invalid("max_tokens", "must be ≥ 1, got %d", req.MaxTokens)
	}
	if req.MaxTokens > lim-len(req.Prompt) { // not prompt + max_tokens: that wraps near MaxInt
		return invalid("max_tokens", "prompt (%d tokens) + max_tokens (%d) exceed the context limit %d", len(req.Prompt), req.MaxTokens, lim)
	}
	if err := req.Sampling.Validate(); err != nil {
		return &InvalidError{Field: "sampling", Msg: err.Error()}
	}
	if len(req.StopIDs) > MaxStopIDs {
		return invalid("stop_ids", "at most %d ids, got %d", MaxStopIDs, len(req.StopIDs))
	}
	for i, t := range req.StopIDs {
		if t < 0 || int(t) >= rt.vocab {
			return invalid(fmt.Sprintf("stop_ids[%d]", i), "token id %d is outside the vocabulary [0, %d)", t, rt.vocab)
		}
	}
	if req.TopLogprobs < 0 || req.TopLogprobs > MaxTopLogprobs {
		return invalid("top_logprobs", "must be in [0, %d], got %d", MaxTopLogprobs, req.TopLogprobs)
	}
	if err := rt.validateProcessing(req); err != nil {
		return err
	}
	if req.Constraint != nil {
		if req.MinTokens > 0 {
			// min_tokens bans the EOS ids a grammar may need to end with.
			return invalid("min_tokens", "not supported with a constraint (structured output)")
		}
		if m, ok := req.Constraint.(interface{ MinTokens() int }); ok && req.MaxTokens < m.MinTokens() {
			return invalid("max_tokens", "the output's grammar needs at least %d tokens, got max_tokens %d", m.MinTokens(), req.MaxTokens)
		}
	}
	return nil
}

// NewID returns a fresh random request id.
func NewID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Submit queues a request. The request is cancelled when ctx ends (its
// slot is freed at the next step boundary). Errors: *InvalidError,
// ErrQueueFull, ErrDraining, ErrClosed, ErrDuplicateID.
func (rt *Scheduler) Submit(ctx context.Context, req Request) (*Handle, error) {
	if err := rt.Validate(&req); err != nil {
		return nil, err
	}
	if req.N > 1 {
		return nil, invalid("n", "%d choices: submit the request with SubmitGroup", req.N)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if req.ID == "" {
		req.ID = NewID()
	}
	req.Prompt = slices.Clone(req.Prompt)
	req.StopIDs = slices.Clone(req.StopIDs)
	r := &request{Request: req, slot: -1, arrived: time.Now(), notify: make(chan struct{}, 1)}
	if !req.Score {
		r.sampler = sample.New(req.Sampling)
		r.proc = newProcs(&req, rt.endIDsIn(&req))
		if req.Stops != nil {
			r.stops = req.Stops()
		}
	}
	rt.mu.Lock()
	switch {
	case rt.closing:
		rt.mu.Unlock()
		return nil, ErrClosed
	case rt.draining:
		rt.mu.Unlock()
		return nil, ErrDraining
	case rt.byID[req.ID] != nil || rt.groups[req.ID] != nil:
		rt.mu.Unlock()
		return nil, ErrDuplicateID
	}
	if rt.queueFullLocked() {
		rt.mu.Unlock()
		return nil, ErrQueueFull
	}
	rt.waiting = append(rt.waiting, r)
	rt.byID[req.ID] = r
	// Registered under mu: the callback runs in its own goroutine and takes mu.
	r.stopWatch = context.AfterFunc(ctx, func() { rt.kill(r, FinishCancelled, cancelled(ctx)) })
	rt.depthLocked()
	rt.mu.Unlock()
	signal(rt.wake)
	return &Handle{r: r}, nil
}

// cancelled is the final's message for a submitter's context that ended.
func cancelled(ctx context.Context) string {
	if ctx.Err() == context.DeadlineExceeded {
		return "deadline exceeded"
	}
	return "the caller cancelled"
}

// queueFullLocked reports whether a new request would pass MaxQueue:
// requests that can be admitted at the next step do not count as queued.
func (rt *Scheduler) queueFullLocked() bool {
	return len(rt.waiting)-rt.slotsFreeLocked() >= max(0, rt.cfg.MaxQueue)
}

// slotsFreeLocked is how many more requests may run: MaxRunning (within
// the store's slots) less those running and the slots held for choices
// not yet forked.
func (rt *Scheduler) slotsFreeLocked() int {
	return min(rt.cfg.MaxRunning, rt.m.Store().Capacity()) - len(rt.running) - rt.reserved
}

// Abort ends an in-flight request with FinishAbort.
func (rt *Scheduler) Abort(id string) error { return rt.AbortBy(id, "", true) }

// AbortBy ends an in-flight request on behalf of a caller: only the
// request's Owner, or an admin, may. For anyone else the request does not
// exist (ErrNotFound): ids of other callers' requests are not revealed.
func (rt *Scheduler) AbortBy(id, owner string, admin bool) error {
	rt.mu.Lock()
	r := rt.byID[id]
	g := rt.groups[id]
	rt.mu.Unlock()
	if g != nil { // an n > 1 request: every choice
		if !admin && g.owner != owner {
			return ErrNotFound
		}
		if rt.killGroup(g, FinishAbort, "aborted by request") == 0 {
			return ErrNotFound
		}
		return nil
	}
	if r == nil || (!admin && r.Owner != owner) {
		return ErrNotFound
	}
	if !rt.kill(r, FinishAbort, "aborted by request") {
		return ErrNotFound
	}
	return nil
}

// Stop ends an in-flight request with FinishStop on behalf of its
// submitter, which found a stop string (core/text) in the first tokens of
// its output: the final (and the log and metrics) count those as the
// completion tokens, and the request counts as stopped, not aborted.
func (rt *Scheduler) Stop(id string, tokens int) error {
	rt.mu.Lock()
	r := rt.byID[id]
	rt.mu.Unlock()
	if r == nil || !rt.killCounting(r, FinishStop, "stop string", tokens) {
		return ErrNotFound
	}
	return nil
}

// Matching lists the ids of in-flight requests for which match (given the
// id and the owner) is true, for an admin's look-up.
func (rt *Scheduler) Matching(match func(id, owner string) bool) []string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var ids []string
	for id, r := range rt.byID {
		if match(id, r.Owner) {
			ids = append(ids, id)
		}
	}
	for id, g := range rt.groups {
		if match(id, g.owner) {
			ids = append(ids, id)
		}
	}
	return ids
}

// InFlight counts requests not yet finished (waiting and running).
func (rt *Scheduler) InFlight() (waiting, running int) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return len(rt.waiting), len(rt.running)
}

// kill finalizes r from outside the scheduler: at once for its submitter;
// a running request's slot is freed at the next step boundary.
func (rt *Scheduler) kill(r *request, reason FinishReason, msg string) bool {
	return rt.killCounting(r, reason, msg, -1)
}

// killCounting is kill whose final counts at most tokens completion tokens
// (negative: all that were generated).
func (rt *Scheduler) killCounting(r *request, reason FinishReason, msg string, tokens int) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.killCountingLocked(r, reason, msg, tokens)
}

// killLocked is kill with mu held. A choice of a group not yet forked
// gives its held slot back at once (no step uses it); the last one ends
// the group's prefill.
func (rt *Scheduler) killLocked(r *request, reason FinishReason, msg string) bool {
	return rt.killCountingLocked(r, reason, msg, -1)
}

// killCountingLocked is killCounting with mu held.
func (rt *Scheduler) killCountingLocked(r *request, reason FinishReason, msg string, tokens int) bool {
	if r.killed || rt.byID[r.ID] != r {
		return false
	}
	r.killed = true
	if tokens >= 0 {
		r.counted, r.stopCounted = min(tokens, r.generated), true
	}
	if i := slices.Index(rt.waiting, r); i >= 0 {
		rt.waiting = slices.Delete(rt.waiting, i, i+1)
	}
	if g := r.grp; g != nil && !g.forked {
		rt.dropChoiceLocked(g, r)
	}
	rt.finishLocked(r, reason, msg)
	signal(rt.wake)
	return true
}

// finishLocked delivers r's final and forgets it (the slot, if any, is the
// scheduler's to free).
func (rt *Scheduler) finishLocked(r *request, reason FinishReason, msg string) {
	now := time.Now()
	f := &Final{
		ID: r.ID, Reason: reason, Message: msg, PromptTokens: len(r.Prompt), CompletionTokens: r.generated,
		Total: now.Sub(r.arrived), Seed: r.Sampling.Seed, Spec: r.stats,
	}
	if r.stats.Steps > 0 {
		f.SimulatedAcceptance = rt.sim
	}
	if r.stopCounted {
		f.CompletionTokens = r.counted
	}
	if !r.admitted.IsZero() {
		f.Queue = r.admitted.Sub(r.arrived)
	}
	if !r.firstTok.IsZero() {
		f.TTFT = r.firstTok.Sub(r.arrived)
	}
	if reason == FinishScored {
		f.Logits, f.Rows, f.Vocab = r.logits, r.rows, rt.vocab
		r.logits = nil
	}
	if r.stopWatch != nil {
		r.stopWatch()
	}
	delete(rt.byID, r.ID)
	if g := r.grp; g != nil {
		rt.choiceEndedLocked(g)
	}
	if !r.setFinal(f) {
		return
	}
	if rt.afterFinal != nil {
		rt.afterFinal()
	}
	rt.met.Finished(f)
	ev := rt.log.Info()
	if reason == FinishError {
		ev = rt.log.Warn()
	}
	if msg != "" {
		ev = ev.Str("detail", msg) // not "message": zerolog's own key for the line's text
	}
	ev = ev.Str("request_id", r.ID).Str("reason", reason.String()).
		Int("prompt_tokens", f.PromptTokens).Int("completion_tokens", f.CompletionTokens).
		Float64("queue_ms", ms(f.Queue)).Float64("ttft_ms", ms(f.TTFT)).Float64("total_ms", ms(f.Total))
	if f.Spec.Steps > 0 {
		ev = ev.Int("spec_steps", f.Spec.Steps).Int("spec_drafted", f.Spec.Drafted).Int("spec_accepted", f.Spec.Accepted).
			Float64("spec_acceptance_length", f.Spec.AcceptanceLength())
		if f.SimulatedAcceptance > 0 { // the outputs are not the model's
			ev = ev.Float64("spec_simulated_acceptance", f.SimulatedAcceptance)
		}
	}
	ev.Msg("request finished")
	rt.depthLocked()
	if rt.draining && len(rt.byID) == 0 && rt.idle != nil {
		close(rt.idle)
		rt.idle = nil
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func (rt *Scheduler) depthLocked() {
	rt.met.Depth(max(0, len(rt.waiting)-max(0, rt.slotsFreeLocked())), len(rt.running))
}

// Drain stops admitting new requests and waits for those in flight to
// finish; when ctx ends first it aborts the rest. It returns how many it
// aborted. Drain leaves the scheduler running; Close stops it.
func (rt *Scheduler) Drain(ctx context.Context) int {
	rt.mu.Lock()
	rt.draining = true
	if len(rt.byID) == 0 {
		rt.mu.Unlock()
		return 0
	}
	if rt.idle == nil {
		rt.idle = make(chan struct{})
	}
	idle := rt.idle
	rt.mu.Unlock()
	select {
	case <-idle:
		return 0
	case <-ctx.Done():
	}
	return rt.abortAll("the server is draining and its deadline passed")
}

func (rt *Scheduler) abortAll(msg string) int {
	rt.mu.Lock()
	var all []*request
	for _, r := range rt.byID {
		all = append(all, r)
	}
	rt.mu.Unlock()
	n := 0
	for _, r := range all {
		if rt.kill(r, FinishAbort, msg) {
			n++
		}
	}
	return n
}

// Close aborts whatever is in flight, waits for the current step to end,
// frees every slot and stops the scheduler. It is safe to call twice.
func (rt *Scheduler) Close() { rt.CloseWithin(context.Background()) }

// CloseWithin is Close that waits for the current step only until ctx
// ends: every request is finalized at once either way, but a forward pass
// cannot be interrupted, so the scheduler may still be running it (it stops
// after). It reports whether the scheduler stopped; when it did not, the
// model's weights are still in use and must not be released.
func (rt *Scheduler) CloseWithin(ctx context.Context) bool {
	rt.mu.Lock()
	rt.draining = true
	rt.closing = true
	rt.mu.Unlock()
	rt.abortAll("the runtime is closing")
	signal(rt.wake)
	select {
	case <-rt.exited:
		return true
	case <-ctx.Done():
		return false
	}
}

// reapLocked frees the slots of requests finalized from outside.
func (rt *Scheduler) reapLocked() {
	kept := rt.running[:0]
	for _, r := range rt.running {
		if r.killed {
			rt.freeLocked(r)
			continue
		}
		kept = append(kept, r)
	}
	clear(rt.running[len(kept):])
	rt.running = kept
	rt.depthLocked()
}

func (rt *Scheduler) freeLocked(r *request) {
	if r.drafting {
		rt.draft.Stop(r.ID)
		r.drafting = false
	}
	if r.slot >= 0 {
		if err := rt.m.Store().Free(r.slot); err != nil {
			rt.log.Error().Err(err).Str("request_id", r.ID).Msg("freeing a cache slot")
		}
		r.slot = -1
	}
}

// admitLocked moves waiting requests to running while slots allow.
func (rt *Scheduler) admitLocked() {
	for len(rt.waiting) > 0 && len(rt.running)+rt.reserved < rt.cfg.MaxRunning {
		if rt.waiting[0].carrier {
			if !rt.admitGroupLocked(rt.waiting[0].grp) {
				break // its slots are not free yet: first come, first served
			}
			continue
		}
		if !rt.pagesAdmitLocked(len(rt.waiting[0].feed()), 1) {
			break // the pages of its prompt are not free: first come, first served
		}
		slot, err := rt.m.Store().Alloc()
		if err != nil {
			break // every slot is taken (perhaps by another user of the store)
		}
		r := rt.waiting[0]
		rt.waiting = slices.Delete(rt.waiting, 0, 1)
		r.slot = slot
		if r.admitted.IsZero() { // a preempted request keeps its first admission
			r.admitted = time.Now()
		}
		rt.running = append(rt.running, r)
		// Processed and constrained requests decode plainly: a verify
		// span's rows would each need the edits (or the mask) of the
		// output as if its drafts were taken.
		if rt.draft != nil && !r.Score && !r.NoSpeculation && !r.processed() && r.Constraint == nil {
			if err := rt.draft.Start(r.ID, r.Prompt); err != nil {
				rt.log.Warn().Err(err).Str("request_id", r.ID).Msg("speculative decoding is off for this request")
			} else {
				r.drafting = true
			}
		}
	}
	rt.depthLocked()
}

// scoreChunkLocked keeps what a Score request asked of a prompt chunk's
// logits (rows row0..last for its n tokens: every row, or the prompt's
// last) and finishes the request at the prompt's end.
func (rt *Scheduler) scoreChunkLocked(r *request, res *backend.Result, row0, last, n int) {
	if r.AllPositions {
		r.logits = append(r.logits, res.Logits[row0*res.Vocab:(last+1)*res.Vocab]...)
		r.rows += n
	}
	if !r.prefilling() {
		if !r.AllPositions {
			r.logits = append(r.logits, res.Row(last)...)
			r.rows = 1
		}
		rt.completeLocked(r, FinishScored, "")
	}
}

// emitPickLocked delivers the token a row's sample picked, or ends r with
// the sampler's error: generated says whether a token was delivered, more
// whether r goes on.
func (rt *Scheduler) emitPickLocked(r *request, pick backend.Sample, now time.Time) (generated, more bool) {
	if pick.Err != nil {
		rt.completeLocked(r, FinishError, pick.Err.Error())
		return false, false
	}
	return true, rt.emitLocked(r, Token{ID: pick.Token, Index: r.generated, Logprob: pick.Logprob, Top: pick.Top}, now)
}

// emitLocked delivers one generated token of r and ends r when the token
// is a stop id (or the model's EOS) or the last one its limits allow; it
// reports whether r goes on.
func (rt *Scheduler) emitLocked(r *request, t Token, now time.Time) bool {
	r.generated++
	if r.proc != nil {
		r.proc.observe(t.ID, r.generated)
	}
	if r.firstTok.IsZero() {
		r.firstTok = now
		rt.met.FirstToken(now.Sub(r.arrived))
	} else {
		rt.met.InterToken(now.Sub(r.lastTok))
	}
	r.lastTok = now
	r.next = t.ID
	r.out = append(r.out, t.ID)
	done := false
	if r.Constraint != nil {
		var err error
		if done, err = r.Constraint.Accept(t.ID); err != nil {
			rt.completeLocked(r, FinishError, "constraint: "+err.Error())
			return false
		}
	}
	r.emit(t)
	stopped := r.stops != nil && r.stops.Feed(t.ID)
	switch {
	case stopped:
		rt.completeLocked(r, FinishStop, "stop string")
		return false
	case done || slices.Contains(r.StopIDs, t.ID) || (rt.eos[t.ID] && !r.IgnoreEOS):
		rt.completeLocked(r, FinishStop, "")
		return false
	case r.generated >= r.MaxTokens || len(r.Prompt)+r.generated >= rt.cfg.ContextLimit:
		rt.completeLocked(r, FinishLength, "")
		return false
	}
	return true
}

// completeLocked finishes a request from the scheduler, after its last
// step: the slot is freed before the final is delivered, so a client that
// sees the final also sees the slot back in the store.
func (rt *Scheduler) completeLocked(r *request, reason FinishReason, msg string) {
	if r.carrier { // the shared prefill failed: every choice fails with it
		rt.killGroupLocked(r.grp, reason, msg)
		return
	}
	r.killed = true
	rt.freeLocked(r)
	rt.finishLocked(r, reason, msg)
}
