package sched

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/speculative"
	"github.com/glmflash/glmflash/model"
	"github.com/stretchr/testify/require"
)

// The step's pieces on a fake model: no backend, no weights, no scheduler
// goroutine; each test sets a queue state, plans a step, executes it and
// collects it one phase at a time.

const fakeVocab = 32

// fakeStore is a store of slots with no cache behind them; it records
// checkpoints and cut-backs.
type fakeStore struct {
	mu             sync.Mutex
	used           []bool
	checkpoints    []int
	truncs         [][2]int // slot, n
	copies         [][2]int // src, dst
	failCheckpoint error
	failCopy       error
}

func (s *fakeStore) Alloc() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, u := range s.used {
		if !u {
			s.used[i] = true
			return i, nil
		}
	}
	return 0, errors.New("fake store: full")
}

func (s *fakeStore) Free(slot int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.used[slot] = false
	return nil
}

func (s *fakeStore) Len(int) (int, error) { return 0, nil }
func (s *fakeStore) Capacity() int        { return len(s.used) }

func (s *fakeStore) InUse() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, u := range s.used {
		if u {
			n++
		}
	}
	return n
}

func (s *fakeStore) Checkpoint(slot int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failCheckpoint != nil {
		return s.failCheckpoint
	}
	s.checkpoints = append(s.checkpoints, slot)
	return nil
}

func (s *fakeStore) Truncate(slot, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.truncs = append(s.truncs, [2]int{slot, n})
	return nil
}

func (s *fakeStore) Copy(src, dst int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failCopy != nil {
		return s.failCopy
	}
	if !s.used[src] || !s.used[dst] || src == dst {
		return errors.New("fake store: copy between unallocated or equal slots")
	}
	s.copies = append(s.copies, [2]int{src, dst})
	return nil
}

// fakeModel answers every logits row with pick(row) (logits, when the
// batch asks them, hold the row's index in column 0); it records the
// batches it ran.
type fakeModel struct {
	cfg  *model.Config
	st   *fakeStore
	pick func(row int) int32
	err  error

	mu   sync.Mutex
	keys []engine.Key
	runs []*backend.Batch
}

func newFakeModel(slots int) *fakeModel {
	return &fakeModel{
		cfg:  &model.Config{VocabSize: fakeVocab, HiddenSize: 4, MaxPositionEmbeddings: 128, EOSTokenIDs: []int{fakeVocab - 1}},
		st:   &fakeStore{used: make([]bool, slots)},
		pick: func(int) int32 { return 7 },
	}
}

func (m *fakeModel) Config() *model.Config { return m.cfg }
func (m *fakeModel) Store() backend.Store  { return m.st }
func (m *fakeModel) Rollback() int         { return 8 }

func (m *fakeModel) Run(key engine.Key, b *backend.Batch) (*backend.Result, error) {
	m.mu.Lock()
	m.keys, m.runs = append(m.keys, key), append(m.runs, b)
	m.mu.Unlock()
	if m.err != nil {
		return nil, m.err
	}
	return m.result(b.Sample, b.SamplesOnly), nil
}

func (m *fakeModel) result(specs []backend.SampleSpec, samplesOnly bool) *backend.Result {
	rows := len(specs) // one spec per logits row
	res := &backend.Result{Rows: rows, Vocab: fakeVocab, Samples: make([]backend.Sample, rows)}
	if !samplesOnly {
		res.Logits = make([]float32, rows*fakeVocab)
	}
	for i := range rows {
		res.Samples[i] = backend.Sample{Token: m.pick(i)}
		if res.Logits != nil {
			res.Logits[i*fakeVocab] = float32(i)
		}
	}
	return res
}

// stepMetrics records what the step reports.
type stepMetrics struct {
	NopMetrics
	mu                sync.Mutex
	steps             [][2]int // seqs, tokens
	prompt, generated int
	verified          [][2]int
}

func (m *stepMetrics) Step(seqs, tokens int, _ time.Duration) {
	m.mu.Lock()
	m.steps = append(m.steps, [2]int{seqs, tokens})
	m.mu.Unlock()
}

func (m *stepMetrics) Tokens(p, c int) {
	m.mu.Lock()
	m.prompt, m.generated = m.prompt+p, m.generated+c
	m.mu.Unlock()
}

func (m *stepMetrics) Verified(d, a int) {
	m.mu.Lock()
	m.verified = append(m.verified, [2]int{d, a})
	m.mu.Unlock()
}

// idle makes a scheduler whose goroutine does not run: the test drives its
// steps. Cleanup closes it as Close would and runs the loop to its end.
func idle(t *testing.T, m Model, cfg Config, opts Options) *Scheduler {
	t.Helper()
	rt, err := newScheduler(m, cfg, opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		rt.mu.Lock()
		rt.draining, rt.closing = true, true
		rt.mu.Unlock()
		rt.abortAll("the test ended")
		rt.loop() // reaps every slot and returns: closing, nothing left
	})
	return rt
}

func submit(t *testing.T, rt *Scheduler, req Request) *request {
	t.Helper()
	h, err := rt.Submit(context.Background(), req)
	require.NoError(t, err)
	return h.r
}

// admit runs the start of planning: finalized requests reaped, waiting ones
// admitted.
func admit(t *testing.T, rt *Scheduler) {
	t.Helper()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	require.True(t, rt.awaitWorkLocked())
}

// take plans a step (no lookahead) and builds its batch as planStep does.
func take(rt *Scheduler, s *step, la *lookahead) {
	rt.mu.Lock()
	rt.takeLocked(s, la)
	rt.mu.Unlock()
	if !s.spec {
		s.buildPlain()
		return
	}
	rt.propose(s)
	rt.mu.Lock()
	rt.buildSpecLocked(s)
	rt.mu.Unlock()
}

func noPrepareNext(Preparer) { panic("a plain model has nothing to prepare ahead") }

func toks(s *step) [][]int32 {
	var out [][]int32
	for _, it := range s.batch {
		out = append(out, it.tokens)
	}
	return out
}

// decoding puts r in the state of a request whose prompt ran and that
// generated n tokens, the last one next.
func decoding(r *request, n int, next int32) {
	r.fed, r.cached, r.generated, r.next = len(r.Prompt), len(r.Prompt)+n-1, n, next
}

// A plain step planned from a queue state: one decode token per generating
// request, then prompt chunks in admission order within the token budget;
// sampling draws only for the rows that yield a token; the round-robin
// start advances.
func TestStepPlansFromTheQueueState(t *testing.T) {
	m := newFakeModel(4)
	rt := idle(t, m, Config{MaxRunning: 3, MaxBatchTokens: 8, PrefillChunk: 4}, Options{})
	a := submit(t, rt, Request{Prompt: []int32{1, 2, 3}, MaxTokens: 5, Sampling: sample.Params{Temperature: 1, TopP: 1, Seed: 3}})
	b := submit(t, rt, Request{Prompt: []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, MaxTokens: 5, Sampling: sample.Greedy()})
	c := submit(t, rt, Request{Prompt: []int32{11, 12}, MaxTokens: 5, Sampling: sample.Params{Temperature: 1, TopP: 1, Seed: 4}})
	d := submit(t, rt, Request{Prompt: []int32{13}, MaxTokens: 5, Sampling: sample.Greedy()})
	admit(t, rt)
	require.Equal(t, []*request{a, b, c}, rt.running, "MaxRunning bounds admission")
	require.Equal(t, []*request{d}, rt.waiting)
	decoding(a, 1, 5)
	b.fed, b.cached = 4, 4

	var s step
	take(rt, &s, nil)
	require.False(t, s.spec)
	require.False(t, s.all)
	require.Equal(t, [][]int32{{5}, {5, 6, 7, 8}, {11, 12}}, toks(&s), "a's decode token, b's next chunk, c's prompt (chunk bounded by the budget)")
	require.Equal(t, 1, rt.rr)
	require.Equal(t, engine.Key{Mode: graph.Mixed, Logits: graph.LastLogits}, s.key)
	require.Equal(t, 7, s.ntok)
	require.True(t, s.b.SamplesOnly)
	require.Len(t, s.b.Sample, 3, "one row per sequence")
	for i, it := range s.batch {
		require.Equal(t, i, it.row0)
		require.Equal(t, backend.Seq{Slot: it.r.slot, Tokens: it.tokens}, s.b.Seqs[i])
	}
	require.NotZero(t, s.b.Sample[0].U, "a's decode token draws")
	require.Equal(t, backend.SampleSpec{Params: sample.Greedy()}, s.b.Sample[1], "b's chunk ends inside its prompt: a greedy placeholder")
	require.NotZero(t, s.b.Sample[2].U, "c's prompt ends: its first token draws")
	require.Equal(t, 1.0, s.b.Sample[2].Params.Temperature)

	// The next plan starts the decode tokens one request later.
	clear(s.batch)
	decoding(b, 1, 9)
	decoding(c, 1, 10)
	take(rt, &s, nil)
	require.Equal(t, [][]int32{{9}, {10}, {5}}, toks(&s))
	require.Equal(t, 2, rt.rr)
}

// A step that holds a Score request computes every row: AllLogits, rows
// laid out token by token, one spec per row.
func TestStepWithAScoreRequestComputesEveryRow(t *testing.T) {
	m := newFakeModel(2)
	rt := idle(t, m, Config{PrefillChunk: 3}, Options{})
	g := submit(t, rt, Request{Prompt: []int32{1, 2}, MaxTokens: 3, Sampling: sample.Greedy()})
	sc := submit(t, rt, Request{Prompt: []int32{4, 5, 6, 7}, Score: true})
	admit(t, rt)
	decoding(g, 1, 3)

	var s step
	take(rt, &s, nil)
	require.True(t, s.all)
	require.Equal(t, graph.AllLogits, s.key.Logits)
	require.False(t, s.b.SamplesOnly)
	require.Equal(t, [][]int32{{3}, {4, 5, 6}}, toks(&s))
	require.Equal(t, []int{0, 1}, []int{s.batch[0].row0, s.batch[1].row0})
	require.Len(t, s.b.Sample, 4)

	rt.executeStep(&s, noPrepareNext)
	rt.collectStep(&s)
	require.Equal(t, 3, sc.fed)
	require.Equal(t, 2, g.generated)
	require.Equal(t, int32(7), g.next, "g's row is its last (row 0), picked 7")
	require.Nil(t, sc.final, "the score request has a token left")

	take(rt, &s, nil)
	require.Equal(t, [][]int32{{7}, {7}}, toks(&s))
	rt.executeStep(&s, noPrepareNext)
	rt.collectStep(&s)
	require.NotNil(t, sc.final)
	require.Equal(t, FinishScored, sc.final.Reason)
	require.Equal(t, 1, sc.final.Rows)
	require.Equal(t, float32(1), sc.final.Logits[0], "the prompt's last row: the step's row 1")
}

// Collecting a plain step: prompt chunks advance, a completed prompt and a
// decode token each deliver a token, a stop id ends its request and frees
// its slot before the final, a request killed while the step ran is
// skipped and reaped; metrics count the step and its tokens.
func TestStepCollectsResults(t *testing.T) {
	m := newFakeModel(3)
	met := &stepMetrics{}
	rt := idle(t, m, Config{PrefillChunk: 4}, Options{Metrics: met})
	a := submit(t, rt, Request{Prompt: []int32{1, 2, 3}, MaxTokens: 5, Sampling: sample.Greedy(), StopIDs: []int32{9}})
	b := submit(t, rt, Request{Prompt: []int32{1, 2, 3, 4, 5, 6}, MaxTokens: 5, Sampling: sample.Greedy()})
	c := submit(t, rt, Request{Prompt: []int32{1, 2}, MaxTokens: 5, Sampling: sample.Greedy()})
	k := submit(t, rt, Request{Prompt: []int32{1}, MaxTokens: 5, Sampling: sample.Greedy()})
	admit(t, rt)
	require.Equal(t, []*request{a, b, c}, rt.running)
	decoding(a, 1, 4)
	m.pick = func(row int) int32 { return []int32{9, 20, 21}[row] }

	var s step
	take(rt, &s, nil)
	require.Equal(t, [][]int32{{4}, {1, 2, 3, 4}, {1, 2}}, toks(&s))
	rt.executeStep(&s, noPrepareNext)
	require.Equal(t, [][2]int{{3, 7}}, met.steps)
	require.Len(t, m.runs, 1)
	rt.kill(c, FinishAbort, "gone while the step ran")
	rt.collectStep(&s)

	require.NotNil(t, a.final, "a's token is a stop id")
	require.Equal(t, FinishStop, a.final.Reason)
	require.Equal(t, 2, a.final.CompletionTokens)
	require.Equal(t, []Token{{ID: 9, Index: 1}}, a.pending)
	require.Equal(t, 4, b.fed)
	require.Equal(t, 4, b.cached)
	require.Zero(t, b.generated, "b's prompt goes on")
	require.Equal(t, FinishAbort, c.final.Reason)
	require.Zero(t, c.generated, "c's pick is not delivered")
	require.Empty(t, c.pending)
	require.Equal(t, []*request{b}, rt.running, "a and c are reaped")
	require.Equal(t, 1, m.st.InUse())
	require.Equal(t, 4, met.prompt)
	require.Equal(t, 1, met.generated)
	require.Nil(t, s.batch[0].r, "the step's items are cleared")

	// The next planning admits k into a freed slot.
	admit(t, rt)
	require.Equal(t, []*request{b, k}, rt.running)
}

// A failed pass fails every request of its step with the engine's error,
// and an engine panic is such an error.
func TestStepErrorFailsItsRequests(t *testing.T) {
	m := newFakeModel(2)
	var failed []error
	rt := idle(t, m, Config{}, Options{StepFailed: func(err error) { failed = append(failed, err) }})
	a := submit(t, rt, Request{Prompt: []int32{1, 2, 3}, MaxTokens: 5, Sampling: sample.Greedy()})
	b := submit(t, rt, Request{Prompt: []int32{4}, MaxTokens: 5, Sampling: sample.Greedy()})
	admit(t, rt)
	m.err = errors.New("device lost")
	var s step
	take(rt, &s, nil)
	rt.executeStep(&s, noPrepareNext)
	rt.collectStep(&s)
	for _, r := range []*request{a, b} {
		require.Equal(t, FinishError, r.final.Reason)
		require.Equal(t, "device lost", r.final.Message)
	}
	require.Zero(t, m.st.InUse())
	require.Len(t, failed, 1, "Options.StepFailed hears of the failed step once")
	require.EqualError(t, failed[0], "device lost")

	c := submit(t, rt, Request{Prompt: []int32{1, 2, 3}, MaxTokens: 5, Sampling: sample.Greedy()})
	admit(t, rt)
	m.err = nil
	m.pick = func(int) int32 { panic("kernel exploded") }
	take(rt, &s, nil)
	rt.executeStep(&s, noPrepareNext)
	rt.collectStep(&s)
	require.Equal(t, FinishError, c.final.Reason)
	require.Equal(t, "engine panic: kernel exploded", c.final.Message)
	require.Len(t, failed, 2)
}

// prepModel prepares batches on the host; its Execute waits until the
// test releases it, so that what runs meanwhile is visible.
type prepModel struct {
	*fakeModel
	release  chan struct{}
	prepared int
}

// fakeProgram is the plan a Prepared consults (its vocabulary and the
// logits' rows: one per sequence).
type fakeProgram struct{ backend.Program }

func (fakeProgram) Plan() *plan.Plan {
	return &plan.Plan{Vocab: fakeVocab, Logits: &ir.Value{Shape: []int{ir.DimS, fakeVocab}}}
}

func (m *prepModel) HostLengths(key engine.Key) bool { return key.Logits == graph.LastLogits }

func (m *prepModel) Prepare(_ engine.Key, b *backend.Batch, pos []int) (*backend.Prepared, error) {
	m.mu.Lock()
	m.prepared++
	m.mu.Unlock()
	pr := &backend.Prepared{Prog: fakeProgram{}, Store: m.st, Sample: b.Sample, SamplesOnly: b.SamplesOnly}
	for i, sq := range b.Seqs {
		pr.Spans = append(pr.Spans, backend.Span{Slot: sq.Slot, Pos0: pos[i], N: len(sq.Tokens), Row0: pr.T, Rows: 1})
		pr.Tokens = append(pr.Tokens, sq.Tokens...)
		pr.T += len(sq.Tokens)
	}
	return pr, nil
}

func (m *prepModel) Execute(_ engine.Key, pr *backend.Prepared) (*backend.Result, error) {
	select {
	case <-m.release:
	case <-time.After(10 * time.Second):
		return nil, errors.New("nothing ran beside the execution")
	}
	return m.result(pr.Sample, pr.SamplesOnly), nil
}

// With host-side lengths the step executes in the background while the
// next step is planned and prepared; the next planning takes that
// preparation when its assumptions held (filling in the decode tokens and
// sampling specs), and plans afresh when they did not.
func TestStepPreparesTheNextStepDuringExecution(t *testing.T) {
	m := &prepModel{fakeModel: newFakeModel(2), release: make(chan struct{})}
	rt := idle(t, m, Config{PrefillChunk: 2}, Options{})
	a := submit(t, rt, Request{Prompt: []int32{1, 2}, MaxTokens: 5, Sampling: sample.Greedy()})
	b := submit(t, rt, Request{Prompt: []int32{3, 4, 5}, MaxTokens: 5, Sampling: sample.Greedy()})
	admit(t, rt)
	decoding(a, 1, 6)
	m.pick = func(row int) int32 { return 12 + int32(row) }

	var s step
	take(rt, &s, nil)
	require.Equal(t, [][]int32{{6}, {3, 4}}, toks(&s))
	var la *lookahead
	rt.executeStep(&s, func(pp Preparer) {
		la = rt.prepareNext(pp, &s)
		close(m.release) // the execution ends only after the next step was prepared
	})
	require.NoError(t, s.err)
	require.Equal(t, 2, m.prepared, "this step's batch and the next")
	require.NotNil(t, la)
	require.Equal(t, [][]int32{{0}, {5}}, [][]int32{la.batch[0].tokens, la.batch[1].tokens}, "a decode placeholder, b's last chunk")
	require.Equal(t, []int{3, 2}, la.pos, "the lengths the step leaves")
	rt.collectStep(&s)
	require.Equal(t, int32(12), a.next)
	require.Equal(t, 2, b.fed)

	take(rt, &s, la)
	require.Equal(t, int64(1), rt.PreparedAhead())
	require.Same(t, la.prep, s.prep, "the preparation made during the last step")
	require.Equal(t, [][]int32{{12}, {5}}, toks(&s))
	require.Equal(t, []int32{12, 5}, s.prep.Tokens, "a's decode token filled in")
	require.Equal(t, s.b.Sample, s.prep.Sample)
	require.Equal(t, 2, rt.rr)

	// b's prompt ends in this step and it generates next: the step after
	// is prepared for it, but a finishes (max tokens), so that preparation
	// is not used.
	m.release = make(chan struct{})
	a.MaxTokens = 2
	la = nil
	rt.executeStep(&s, func(pp Preparer) {
		la = rt.prepareNext(pp, &s)
		close(m.release)
	})
	require.Equal(t, 3, m.prepared, "only the step after: this one was prepared ahead")
	require.NotNil(t, la)
	rt.collectStep(&s)
	require.Equal(t, FinishLength, a.final.Reason)
	admit(t, rt)
	take(rt, &s, la)
	require.Equal(t, int64(1), rt.PreparedAhead(), "the running set changed: planned afresh")
	require.Nil(t, s.prep)
	require.Equal(t, [][]int32{{13}}, toks(&s), "b's first token")
}

// fakeDrafter proposes drafts from a function of the sequence and records
// what it observes.
type fakeDrafter struct {
	max     int
	drafts  func(seq speculative.SeqID) []int32
	propErr error
	mu      sync.Mutex
	started []speculative.SeqID
	stopped []speculative.SeqID
	obs     []speculative.Observation
}

func (d *fakeDrafter) Name() string             { return "fake" }
func (d *fakeDrafter) Needs() speculative.Needs { return speculative.Needs{} }
func (d *fakeDrafter) MaxDrafts() int           { return d.max }
func (d *fakeDrafter) Close() error             { return nil }
func (d *fakeDrafter) Start(seq speculative.SeqID, _ []int32) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.started = append(d.started, seq)
	return nil
}

func (d *fakeDrafter) Stop(seq speculative.SeqID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = append(d.stopped, seq)
}

func (d *fakeDrafter) Observe(obs []speculative.Observation) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.obs = append(d.obs, obs...)
	return nil
}

func (d *fakeDrafter) Propose(props []speculative.Proposal) error {
	if d.propErr != nil {
		return d.propErr
	}
	for i := range props {
		props[i].Drafts = d.drafts(props[i].Seq)
	}
	return nil
}

// A speculative step: planned like a plain one, with drafts for the
// drafted requests' decode tokens (at most the drafter's, one fewer than
// the tokens left); its batch runs each verify span under a checkpoint;
// collection accepts the drafts' matching prefix and the target's token,
// cuts the slot back to them, counts the span, and the drafter observes
// the commit.
func TestSpecStepPlansVerifiesAndRollsBack(t *testing.T) {
	m := newFakeModel(3)
	d := &fakeDrafter{max: 3, drafts: func(speculative.SeqID) []int32 { return []int32{20, 21, 22, 23} }}
	met := &stepMetrics{}
	rt := idle(t, m, Config{PrefillChunk: 4}, Options{Drafter: d, Metrics: met})
	a := submit(t, rt, Request{ID: "a", Prompt: []int32{1, 2, 3}, MaxTokens: 10, Sampling: sample.Greedy()})
	short := submit(t, rt, Request{ID: "short", Prompt: []int32{4}, MaxTokens: 3, Sampling: sample.Greedy()})
	plain := submit(t, rt, Request{ID: "plain", Prompt: []int32{5, 6, 7, 8, 9}, MaxTokens: 3, Sampling: sample.Greedy(), NoSpeculation: true})
	admit(t, rt)
	require.Equal(t, []speculative.SeqID{"a", "short"}, d.started)
	decoding(a, 1, 5)
	decoding(short, 2, 6) // one token left: no drafts
	// rows: a's span 0..3 (the target agrees with 20, 21, then says 9),
	// short's 4, plain's 5
	m.pick = func(row int) int32 { return []int32{20, 21, 9, 30, 17, 18}[row] }

	var s step
	take(rt, &s, nil)
	require.True(t, s.spec)
	require.Equal(t, SpecProgram(d), s.key)
	require.Equal(t, [][]int32{{5, 20, 21, 22}, {6}, {5, 6, 7, 8}}, toks(&s), "a's drafts cut to the drafter's max")
	require.Equal(t, []int{3, 0, 0}, []int{s.batch[0].maxDrafts, s.batch[1].maxDrafts, s.batch[2].maxDrafts})
	require.Equal(t, []int{0, 4, 5}, []int{s.batch[0].row0, s.batch[1].row0, s.batch[2].row0})
	require.Equal(t, []int{0, 4, 5}, []int{s.batch[0].tok0, s.batch[1].tok0, s.batch[2].tok0})
	require.Equal(t, []int{a.slot}, m.st.checkpoints)
	require.True(t, s.b.SamplesOnly, "greedy acceptance reads the picks")
	require.Len(t, s.b.Sample, 6)
	require.Equal(t, 4, s.b.Seqs[0].LogitRows)
	require.Equal(t, 9, s.ntok)

	rt.executeStep(&s, noPrepareNext)
	rt.collectStep(&s)
	require.Equal(t, []Token{{ID: 20, Index: 1}, {ID: 21, Index: 2}, {ID: 9, Index: 3}}, a.pending)
	require.Equal(t, 4, a.generated)
	require.Equal(t, 6, a.cached, "three committed tokens after the three cached")
	require.Equal(t, [][2]int{{a.slot, 6}}, m.st.truncs)
	require.Equal(t, speculative.Stats{Steps: 1, Drafted: 3, Accepted: 2}, a.stats)
	require.Equal(t, [][2]int{{3, 2}}, met.verified)
	require.Equal(t, FinishLength, short.final.Reason)
	require.Equal(t, 4, plain.fed)
	require.Equal(t, []speculative.Observation{{Seq: "a", Pos0: 3, Tokens: []int32{5, 20, 21}, Next: 9, Drafted: 3, Accepted: 2, Verify: true}}, d.obs,
		"only drafted requests that go on are observed")
	require.Equal(t, 3+1, met.generated, "a's accepted run and token, short's token")
	require.Equal(t, 4, met.prompt)
}

// A checkpoint that fails fails the speculative step before the pass; a
// drafter whose Propose fails turns speculation off for its requests,
// which decode plainly in the same step.
func TestSpecStepFailures(t *testing.T) {
	m := newFakeModel(2)
	d := &fakeDrafter{max: 2, drafts: func(speculative.SeqID) []int32 { return []int32{20, 21} }}
	met := &stepMetrics{}
	rt := idle(t, m, Config{}, Options{Drafter: d, Metrics: met})
	a := submit(t, rt, Request{ID: "a", Prompt: []int32{1, 2}, MaxTokens: 10, Sampling: sample.Greedy()})
	admit(t, rt)
	decoding(a, 1, 5)
	m.st.failCheckpoint = errors.New("no rollback record")
	var s step
	take(rt, &s, nil)
	require.ErrorIs(t, s.err, m.st.failCheckpoint)
	rt.executeStep(&s, noPrepareNext)
	require.Empty(t, m.runs, "the pass is skipped")
	require.Len(t, met.steps, 1, "the step is still measured")
	rt.collectStep(&s)
	require.Equal(t, FinishError, a.final.Reason)
	require.Equal(t, "no rollback record", a.final.Message)
	require.Empty(t, d.obs)

	m.st.failCheckpoint = nil
	d.propErr = errors.New("drafter broke")
	b := submit(t, rt, Request{ID: "b", Prompt: []int32{1, 2}, MaxTokens: 10, Sampling: sample.Greedy()})
	admit(t, rt)
	require.Equal(t, []speculative.SeqID{"a"}, d.stopped, "a's drafting stopped with its slot")
	decoding(b, 1, 5)
	take(rt, &s, nil)
	require.True(t, s.spec, "planned as speculative")
	require.False(t, b.drafting)
	require.Contains(t, d.stopped, speculative.SeqID("b"))
	require.Equal(t, [][]int32{{5}}, toks(&s), "a plain decode token")
	require.Empty(t, m.st.checkpoints)
	rt.executeStep(&s, noPrepareNext)
	rt.collectStep(&s)
	require.Equal(t, []Token{{ID: 7, Index: 1}}, b.pending)
	require.Empty(t, d.obs, "no longer drafted: not observed")
}

// A lookahead whose preparation does not take this step's decode tokens
// is still the step's plan; the step is prepared afresh.
func TestStepFallsBackWhenTheLookaheadPreparationDoesNotFit(t *testing.T) {
	m := &prepModel{fakeModel: newFakeModel(2), release: make(chan struct{})}
	close(m.release)
	rt := idle(t, m, Config{}, Options{})
	a := submit(t, rt, Request{Prompt: []int32{1, 2}, MaxTokens: 5, Sampling: sample.Greedy()})
	b := submit(t, rt, Request{Prompt: []int32{3}, MaxTokens: 5, Sampling: sample.Greedy()})
	admit(t, rt)
	decoding(a, 1, 6)
	decoding(b, 1, 8)
	var s step
	take(rt, &s, nil)
	rt.mu.Lock()
	la := rt.lookaheadLocked(s.batch)
	rt.mu.Unlock()
	require.NotNil(t, la)
	// prepared with two tokens per sequence: SetTokens refuses one
	la.prep = &backend.Prepared{Prog: fakeProgram{}, Spans: []backend.Span{{N: 2}, {N: 2, Row0: 2}}, Tokens: make([]int32, 4), T: 4}
	rt.executeStep(&s, skipPrepareNext)
	rt.collectStep(&s)

	take(rt, &s, la)
	require.Equal(t, int64(1), rt.PreparedAhead(), "the lookahead's plan is used")
	require.Nil(t, s.prep, "but not its preparation")
	require.Equal(t, [][]int32{{7}, {7}}, toks(&s))
	before := m.prepared
	rt.executeStep(&s, skipPrepareNext)
	require.NoError(t, s.err)
	require.Equal(t, before+1, m.prepared, "prepared afresh")
}

// skipPrepareNext prepares nothing ahead.
func skipPrepareNext(Preparer) {}

// A Score request's prompt is cut at fixed multiples of its chunk size
// whatever else the step holds: a chunk the budget cannot hold waits for
// the next step instead of being cut short (issue 37: the cut followed the
// budget, and the scores differed bitwise with the load).
func TestScoreChunksDoNotDependOnTheLoad(t *testing.T) {
	m := newFakeModel(4)
	rt := idle(t, m, Config{MaxRunning: 3, MaxBatchTokens: 8, PrefillChunk: 4}, Options{})
	g := submit(t, rt, Request{Prompt: []int32{1, 2, 3, 4, 5}, MaxTokens: 5, Sampling: sample.Greedy()})
	sc := submit(t, rt, Request{Prompt: []int32{10, 11, 12, 13, 14, 15, 16, 17, 18, 19}, Score: true})
	admit(t, rt)
	require.Equal(t, 4, rt.scoreChunk(sc), "min(prefill_chunk 4, max_batch_tokens 8 − max_running 3 + 1)")
	g.fed, g.cached = 1, 1 // g's remaining 4 prompt tokens leave the Score request 4

	var s step
	take(rt, &s, nil)
	require.Equal(t, [][]int32{{2, 3, 4, 5}, {10, 11, 12, 13}}, toks(&s))
	sc.fed, sc.cached = 4, 4
	decoding(g, 1, 7)
	take(rt, &s, nil)
	require.Equal(t, [][]int32{{7}, {14, 15, 16, 17}}, toks(&s), "the next fixed chunk")

	// a prompt ahead of it leaves 8 − 1 − 4 = 3 tokens of budget: the
	// Score request waits rather than run a 3-token chunk (the old plan
	// ran 14, 15, 16), then runs the whole next chunk
	h := submit(t, rt, Request{Prompt: []int32{1, 2, 3, 4, 5}, MaxTokens: 5, Sampling: sample.Greedy()})
	admit(t, rt)
	rt.running = []*request{g, h, sc}
	h.fed, h.cached = 1, 1
	take(rt, &s, nil)
	require.Equal(t, [][]int32{{7}, {2, 3, 4, 5}}, toks(&s), "the Score request waits")
	decoding(h, 1, 8)
	take(rt, &s, nil)
	require.Equal(t, [][]int32{{7}, {8}, {14, 15, 16, 17}}, toks(&s))
	sc.fed, sc.cached = 8, 8
	take(rt, &s, nil)
	require.Equal(t, [][]int32{{8}, {7}, {18, 19}}, toks(&s), "the prompt's last, shorter chunk")
}
