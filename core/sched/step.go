package sched

import (
	"fmt"
	"time"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/speculative"
)

// item is one sequence of a step's batch.
type item struct {
	r      *request
	tokens []int32
	row0   int // first logits row
	nrows  int // logits rows: its last nrows tokens' (1, or every token's)
	// Speculative steps: the item's first token's row in the batch (for
	// hidden rows), the drafts it may get and the drafts it got (tokens =
	// [next] + drafts) with their distributions.
	tok0      int
	maxDrafts int
	drafts    []int32
	q         []speculative.Dist
}

// step is one scheduling step as a value, in the spirit of vLLM v1's
// schedule / execute / update: it is planned from the queue state
// (planStep: the items, under mu; the drafts of a speculative step and its
// batch), executed without mu (executeStep: one forward pass, overlapped
// with the next step's host-side preparation when the model prepares on
// the host) and collected under mu (collectStep: tokens, finals, freed
// slots; a speculative step's acceptance and cut-backs, then what the
// drafter observes). Plain and speculative steps share it: only planning
// and collecting differ by kind.
type step struct {
	batch []item
	spec  bool // verify spans for drafted requests: SpecProgram, span logits
	all   bool // a plain step that holds a Score request: every row's logits

	key  engine.Key
	b    *backend.Batch
	ntok int               // tokens in b
	prep *backend.Prepared // b prepared on the host, ahead of the step or for it

	res *backend.Result
	err error // fails every request of the step; set before execution, it skips the pass

	obs []speculative.Observation // a speculative step's commits, for the drafter
}

// reset empties s for the next step, keeping the batch's storage.
func (s *step) reset() { *s = step{batch: s.batch[:0]} }

// loop is the scheduler goroutine: plan a step, execute it, collect it,
// until the scheduler closes. The next step's host-side work is prepared
// while a step executes (when its assumptions hold at the next planning,
// it is used).
func (rt *Scheduler) loop() {
	defer close(rt.exited)
	var s step
	var la *lookahead
	for rt.planStep(&s, la) {
		la = nil
		rt.executeStep(&s, func(pp Preparer) { la = rt.prepareNext(pp, &s) })
		rt.collectStep(&s)
	}
}

// planStep waits for work and plans the next step into s: the items under
// mu (the lookahead's when its assumptions held), then, without mu, a
// speculative step's drafts, and its batch. It reports false when the
// scheduler is closing and nothing is left.
func (rt *Scheduler) planStep(s *step, la *lookahead) bool {
	rt.mu.Lock()
	if !rt.awaitWorkLocked() {
		rt.mu.Unlock()
		return false
	}
	rt.takeLocked(s, la)
	rt.mu.Unlock()
	if !s.spec {
		s.buildPlain()
		return true
	}
	rt.propose(s) // the drafter may run a model: outside the lock
	rt.mu.Lock()
	rt.buildSpecLocked(s)
	rt.mu.Unlock()
	return true
}

// awaitWorkLocked reaps finalized requests and admits waiting ones until
// some request runs; it reports false when the scheduler is closing and
// nothing is left. It releases mu while it waits.
func (rt *Scheduler) awaitWorkLocked() bool {
	for {
		rt.reapLocked()
		if rt.closing && len(rt.running) == 0 && len(rt.waiting) == 0 {
			return false
		}
		rt.admitLocked()
		if len(rt.running) > 0 {
			return true
		}
		blocked := len(rt.waiting) > 0 // every slot is held outside the runtime
		rt.mu.Unlock()
		if blocked {
			select {
			case <-rt.wake:
			case <-time.After(5 * time.Millisecond):
			}
		} else {
			<-rt.wake
		}
		rt.mu.Lock()
	}
}

// takeLocked chooses the step's items from the running requests: the
// lookahead's when its assumptions held, else a fresh plan (planLocked).
// A step that holds a drafted request is speculative; a plain one draws
// its sampling specs here.
func (rt *Scheduler) takeLocked(s *step, la *lookahead) {
	s.reset()
	if !rt.takeLookaheadLocked(s, la) {
		s.batch = rt.planLocked(s.batch)
	}
	if rt.draft != nil && drafting(s.batch) {
		s.spec = true
		return
	}
	for _, it := range s.batch {
		s.all = s.all || it.r.Score
	}
	specs := rt.sampleSpecsLocked(s.batch, s.all)
	s.b = &backend.Batch{Sample: specs, SamplesOnly: !s.all}
	if s.prep != nil {
		if err := s.prep.SetSample(specs, !s.all); err != nil {
			s.prep = nil // fall back to a fresh preparation
		}
	}
}

// buildPlain completes a plain step's batch. Generation needs only each
// sequence's last row; a step that holds a Score request computes every
// row (AllLogits) and picks the last rows of the others, which gives them
// the same logits.
func (s *step) buildPlain() {
	s.key = engine.Key{Mode: graph.Mixed, Logits: graph.LastLogits}
	if s.all {
		s.key.Logits = graph.AllLogits
	}
	s.b.Seqs = make([]backend.Seq, len(s.batch))
	rows := 0
	for i := range s.batch {
		it := &s.batch[i]
		s.b.Seqs[i] = backend.Seq{Slot: it.r.slot, Tokens: it.tokens}
		s.ntok += len(it.tokens)
		it.nrows = 1
		if s.all {
			it.nrows = len(it.tokens)
		}
		it.row0 = rows
		rows += it.nrows
	}
}

// executeStep runs the step's forward pass (unless planning failed it).
// When the model prepares batches on the host and the step reads only
// host-side lengths, the pass executes in the background while
// prepareNext prepares the next step (assuming every request continues);
// it is used only if that assumption holds at the next planning.
func (rt *Scheduler) executeStep(s *step, prepareNext func(Preparer)) {
	t0 := time.Now()
	pp, ok := rt.m.(Preparer)
	switch {
	case s.err != nil:
	case !s.spec && ok && s.key.Logits == graph.LastLogits && pp.HostLengths(s.key):
		if s.prep == nil {
			s.prep, s.err = pp.Prepare(s.key, s.b, positions(s.batch))
		}
		if s.err != nil {
			break
		}
		key, prep := s.key, s.prep
		var res *backend.Result
		var err error
		done := make(chan struct{})
		go func() {
			defer close(done)
			res, err = rt.execute(pp, key, prep)
		}()
		prepareNext(pp)
		<-done
		s.res, s.err = res, err
	default:
		s.res, s.err = rt.run(s.key, s.b)
	}
	rt.met.Step(len(s.batch), s.ntok, time.Since(t0))
}

// collectStep applies the step's results under mu (collectLocked); then,
// without mu, the drafter observes what a speculative step committed.
func (rt *Scheduler) collectStep(s *step) {
	rt.mu.Lock()
	rt.collectLocked(s)
	rt.mu.Unlock()
	if s.err != nil && rt.failed != nil {
		rt.failed(s.err)
	}
	if s.spec {
		rt.observe(s)
	}
	clear(s.batch)
}

// run executes one forward pass; a panic in the engine becomes an error
// that fails this step's requests instead of the process.
func (rt *Scheduler) run(key engine.Key, b *backend.Batch) (res *backend.Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("engine panic: %v", p)
		}
	}()
	return rt.m.Run(key, b)
}

// execute runs a prepared step, turning an engine panic into an error.
func (rt *Scheduler) execute(pp Preparer, key engine.Key, pr *backend.Prepared) (res *backend.Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("engine panic: %v", p)
		}
	}()
	return pp.Execute(key, pr)
}

// planLocked chooses this step's tokens: first one decode token for each
// generating request (round-robin when the budget is short), then prompt
// chunks in admission order.
func (rt *Scheduler) planLocked(batch []item) []item {
	budget := rt.cfg.MaxBatchTokens
	n := len(rt.running)
	start := rt.rr % n
	rt.rr++
	for k := 0; k < n && budget > 0; k++ {
		r := rt.running[(start+k)%n]
		if !r.prefilling() {
			batch = append(batch, item{r: r, tokens: []int32{r.next}})
			budget--
		}
	}
	// drafts after every decode token and before prompt chunks: at most the
	// drafter's, and one fewer than the tokens the request may still emit
	// (a verify step emits its accepted drafts and one token of the target)
	for i := range batch {
		r := batch[i].r
		if !r.drafting || budget == 0 {
			continue
		}
		left := min(r.MaxTokens-r.generated, rt.cfg.ContextLimit-len(r.Prompt)-r.generated)
		k := min(rt.draft.MaxDrafts(), left-1, budget)
		if k > 0 {
			batch[i].maxDrafts = k
			budget -= k
		}
	}
	for _, r := range rt.running {
		if budget == 0 {
			break
		}
		if !r.prefilling() {
			continue
		}
		c := min(rt.cfg.PrefillChunk, len(r.feed())-r.fed, budget)
		if r.Score {
			// A Score request's chunks are fixed (scoreChunk), whatever
			// else the step holds: its logits must not depend on the
			// requests it is batched with. One that does not fit waits.
			c = rt.scoreChunk(r)
			if c > budget {
				continue
			}
		}
		batch = append(batch, item{r: r, tokens: r.feed()[r.fed : r.fed+c]})
		budget -= c
	}
	return rt.fitPagesLocked(batch)
}

// scoreChunk is the size of a Score request's next prompt chunk: the
// prompt is cut at fixed multiples of min(PrefillChunk, MaxBatchTokens −
// MaxRunning + 1) from its start, never where the step's budget runs out.
// Chunk boundaries change the arithmetic (the attention of a chunk over the
// cache, the linear attention's chunked recurrence), so a budget-shaped cut
// made a score differ bitwise with the load (issue 37). The size fits the
// budget left when every other running request decodes a token, so the
// request waits at most for older prompts ahead of it.
func (rt *Scheduler) scoreChunk(r *request) int {
	size := min(rt.cfg.PrefillChunk, rt.cfg.MaxBatchTokens-rt.cfg.MaxRunning+1)
	return min(size-r.fed%size, len(r.Prompt)-r.fed)
}

// collectLocked turns a step's results into tokens, finals and freed
// slots: a failed step fails its requests; otherwise each item's prompt
// chunk or decode token advances its request (collectItemLocked), and a
// speculative step's verify spans are accepted and cut back, its commits
// kept for the drafter (collectSpecItemLocked).
func (rt *Scheduler) collectLocked(s *step) {
	now := time.Now()
	var n tally
	for _, it := range s.batch {
		r := it.r
		if r.killed {
			continue // finalized meanwhile; reaped below (Free closes a checkpoint)
		}
		if s.err != nil {
			rt.completeLocked(r, FinishError, s.err.Error())
			continue
		}
		if s.spec {
			rt.collectSpecItemLocked(s, it, now, &n)
		} else {
			rt.collectItemLocked(it, s.res, now, &n)
		}
	}
	rt.met.Tokens(n.prompt, n.generated)
	rt.reapLocked()
}

// tally counts a step's prompt tokens run and tokens generated.
type tally struct{ prompt, generated int }

// collectItemLocked applies a prompt chunk's or a decode token's result:
// r's cache (and prompt) advance, a Score request keeps its rows, and the
// row that yields a token (the prompt's end, a decode token: the item's
// last) delivers it. It returns the token that follows the item's in r's
// sequence (the next prompt token, or the delivered one) and whether r
// goes on.
func (rt *Scheduler) collectItemLocked(it item, res *backend.Result, now time.Time, n *tally) (next int32, more bool) {
	r := it.r
	last := it.row0 + it.nrows - 1
	r.cached += len(it.tokens)
	if r.prefilling() {
		r.fed += len(it.tokens)
		n.prompt += len(it.tokens)
		if r.Score {
			rt.scoreChunkLocked(r, res, it.row0, last, len(it.tokens))
			return 0, false
		}
		if r.carrier && !r.prefilling() {
			rt.forkLocked(r.grp) // the shared prefill is done
			return 0, false
		}
		if r.prefilling() {
			return r.feed()[r.fed], true // more prompt to run
		}
		if r.resuming { // recomputed after a preemption: its next token was delivered before
			r.resuming, r.seq = false, nil
			r.next = r.out[len(r.out)-1]
			return r.next, true
		}
	}
	pick := res.Samples[last]
	gen, more := rt.emitPickLocked(r, pick, now)
	if gen {
		n.generated++
	}
	return pick.Token, more
}

// sampleSpecsLocked draws this step's sampling specs: one per logits row
// (every token's row when all, else one per item). Only a row that yields a
// token consumes its request's randomness (the last row of a request whose
// prompt this step completes, or a decode token); the others are greedy
// placeholders the scheduler ignores.
func (rt *Scheduler) sampleSpecsLocked(batch []item, all bool) []backend.SampleSpec {
	specs := make([]backend.SampleSpec, 0, len(batch))
	for _, it := range batch {
		nrows := 1
		if all {
			nrows = len(it.tokens)
		}
		specs = appendSpecsLocked(specs, it.r, len(it.tokens), nrows)
	}
	return specs
}

// appendSpecsLocked appends the specs of one request's nrows logits rows
// in a step that feeds it ntok tokens: greedy placeholders, then, for the
// row that yields a token (the prompt's end or a decode token), the
// request's sampling with a fresh draw.
func appendSpecsLocked(specs []backend.SampleSpec, r *request, ntok, nrows int) []backend.SampleSpec {
	for range nrows - 1 {
		specs = append(specs, backend.SampleSpec{Params: sample.Greedy()})
	}
	if r.Score || r.carrier || r.killed || r.resuming || r.fed+ntok < len(r.feed()) {
		return append(specs, backend.SampleSpec{Params: sample.Greedy()})
	}
	spec := backend.SampleSpec{Params: r.sampler.Params(), U: r.sampler.Draw(), TopLogprobs: r.TopLogprobs, Edits: r.proc.Edits()}
	if r.Constraint != nil {
		// Validate keeps MaxTokens within the context limit, so these are
		// the tokens r may still generate.
		spec.Allow = r.Constraint.Allow(r.MaxTokens - r.generated)
	}
	return append(specs, spec)
}

// positions are the batch's sequences' cached lengths as the scheduler
// counts them (the host-side lengths).
func positions(batch []item) []int {
	pos := make([]int, len(batch))
	for i, it := range batch {
		pos[i] = it.r.cached
	}
	return pos
}
