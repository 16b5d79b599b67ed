package sched

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/speculative"
	"github.com/stretchr/testify/require"
)

func submitGroup(t *testing.T, rt *Scheduler, ctx context.Context, req Request) (*Group, []*request) {
	t.Helper()
	g, err := rt.SubmitGroup(ctx, req)
	require.NoError(t, err)
	var rs []*request
	for _, h := range g.Choices() {
		rs = append(rs, h.r)
	}
	return g, rs
}

// ran is what one step ran: its sequences' tokens and sampling specs.
type ran struct {
	toks  [][]int32
	specs []backend.SampleSpec
}

// runStep plans, executes and collects one step of an idle scheduler.
func runStep(t *testing.T, rt *Scheduler) ran {
	t.Helper()
	admit(t, rt)
	s := &step{}
	take(rt, s, nil)
	out := ran{toks: toks(s), specs: s.b.Sample}
	rt.executeStep(s, noPrepareNext)
	rt.collectStep(s)
	return out
}

// reap frees the slots of finalized requests, as the next step's planning
// does.
func reap(rt *Scheduler) {
	rt.mu.Lock()
	rt.reapLocked()
	rt.mu.Unlock()
}

func heldSlots(rt *Scheduler) int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.reserved
}

// A group step by step: admitted with a slot per choice (the carrier's and
// two held), its prompt but the last token prefilled by the carrier alone
// in chunks, then forked (the carrier's slot to choice 0, copies to the
// others) and each choice runs the last prompt token itself and samples
// with its own seed; the group's slots all come back at the end.
func TestGroupPrefillsOnceThenForks(t *testing.T) {
	m := newFakeModel(4)
	rt := idle(t, m, Config{MaxBatchTokens: 8, PrefillChunk: 4}, Options{})
	p := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	sp := sample.Params{Temperature: 1, TopP: 1, Seed: 40}
	g, cs := submitGroup(t, rt, context.Background(), Request{ID: "g", Prompt: p, MaxTokens: 2, Sampling: sp, N: 3, IgnoreEOS: true})
	require.Equal(t, "g", g.ID())
	for i, c := range cs {
		require.Equal(t, ChoiceID("g", i), c.ID)
		require.Equal(t, uint64(40+i), c.Sampling.Seed)
		require.True(t, c.NoSpeculation)
	}
	admit(t, rt)
	require.Equal(t, 3, m.st.InUse(), "a slot for each choice at admission")
	require.Equal(t, 2, heldSlots(rt))
	require.Len(t, rt.running, 1, "only the carrier runs")
	carrier := rt.running[0]
	require.True(t, carrier.carrier)
	carrierSlot := carrier.slot

	var prefill [][]int32
	for !slices.ContainsFunc(rt.running, func(r *request) bool { return r.grp == g.choices[0].r.grp && !r.carrier }) {
		s := runStep(t, rt)
		prefill = append(prefill, s.toks...)
		for _, sp := range s.specs {
			require.Equal(t, backend.SampleSpec{Params: sample.Greedy()}, sp, "the carrier never draws")
		}
	}
	require.Equal(t, [][]int32{{1, 2, 3, 4}, {5, 6, 7, 8}, {9}}, prefill, "the prompt but its last token, once")
	require.Equal(t, [][2]int{{carrierSlot, cs[1].slot}, {carrierSlot, cs[2].slot}}, m.st.copies)
	require.Equal(t, carrierSlot, cs[0].slot, "choice 0 runs in the carrier's slot")
	require.Equal(t, 0, heldSlots(rt))
	require.Equal(t, 3, m.st.InUse())
	require.Equal(t, []*request{cs[0], cs[1], cs[2]}, rt.running, "the carrier left, the choices run")
	for _, c := range cs {
		require.Equal(t, 9, c.fed)
		require.Equal(t, 9, c.cached)
	}

	s := runStep(t, rt)
	require.Equal(t, [][]int32{{10}, {10}, {10}}, s.toks, "each choice runs the last prompt token")
	for i, c := range cs {
		want := sample.New(c.Sampling)
		require.Equal(t, want.Draw(), s.specs[i].U, "choice %d draws from seed %d", i, 40+i)
		require.Equal(t, 1, c.generated)
	}
	runStep(t, rt)
	for i, c := range cs {
		require.NotNil(t, c.final, "choice %d", i)
		require.Equal(t, FinishLength, c.final.Reason)
		require.Equal(t, len(p), c.final.PromptTokens)
		require.Equal(t, uint64(40+i), c.final.Seed)
	}
	require.Equal(t, 0, m.st.InUse())
	require.Empty(t, rt.groups)
	require.Empty(t, rt.byID)
}

// Ends before the fork: a choice aborted alone gives its held slot back at
// once and is not forked; when the last choice ends (its id aborted as a
// group) the prefill stops and every slot comes back.
func TestGroupAbortBeforeFork(t *testing.T) {
	m := newFakeModel(4)
	rt := idle(t, m, Config{PrefillChunk: 2}, Options{})
	_, cs := submitGroup(t, rt, context.Background(), Request{ID: "g", Prompt: []int32{1, 2, 3, 4, 5, 6, 7}, MaxTokens: 3, Sampling: sample.Greedy(), N: 3})
	runStep(t, rt)
	require.Equal(t, 3, m.st.InUse())
	require.NoError(t, rt.Abort(ChoiceID("g", 2)))
	require.Equal(t, FinishAbort, cs[2].final.Reason)
	require.Equal(t, 2, m.st.InUse(), "its held slot is free at once")
	require.Equal(t, 1, heldSlots(rt))
	runStep(t, rt)
	runStep(t, rt)
	require.Len(t, m.st.copies, 1, "one copy: choice 2 is not forked")
	require.Equal(t, []*request{cs[0], cs[1]}, rt.running)
	require.NoError(t, rt.Abort("g"))
	require.Equal(t, FinishAbort, cs[0].final.Reason)
	require.Equal(t, FinishAbort, cs[1].final.Reason)
	require.ErrorIs(t, rt.Abort("g"), ErrNotFound, "the group is gone")
	reap(rt)
	require.Equal(t, 0, m.st.InUse())

	// Every choice aborted during the prefill: the carrier stops too.
	_, cs = submitGroup(t, rt, context.Background(), Request{ID: "h", Prompt: []int32{1, 2, 3, 4, 5, 6, 7}, MaxTokens: 3, Sampling: sample.Greedy(), N: 2})
	runStep(t, rt)
	require.Equal(t, 2, m.st.InUse())
	require.NoError(t, rt.Abort(ChoiceID("h", 0)), "the choice that would inherit the carrier's slot")
	require.Equal(t, 2, m.st.InUse(), "the carrier's slot is the prefill's until it stops")
	require.NoError(t, rt.Abort(ChoiceID("h", 1)))
	require.Equal(t, 1, m.st.InUse(), "the held slot is back; the carrier's at the next boundary")
	require.Equal(t, FinishAbort, cs[0].final.Reason)
	require.Equal(t, FinishAbort, cs[1].final.Reason)
	reap(rt)
	require.Equal(t, 0, m.st.InUse())
	require.Empty(t, rt.running)
	require.Empty(t, rt.groups)
	require.Equal(t, 0, heldSlots(rt))
}

// Choice 0 ended before the fork: the carrier's slot goes back at the fork
// and the others get copies.
func TestGroupForkWithoutTheFirstChoice(t *testing.T) {
	m := newFakeModel(4)
	rt := idle(t, m, Config{}, Options{})
	_, cs := submitGroup(t, rt, context.Background(), Request{ID: "g", Prompt: []int32{1, 2, 3}, MaxTokens: 1, Sampling: sample.Greedy(), N: 3})
	admit(t, rt)
	carrierSlot := rt.running[0].slot
	require.NoError(t, rt.Abort(ChoiceID("g", 0)))
	runStep(t, rt) // the prefill, then the fork
	require.Equal(t, [][2]int{{carrierSlot, cs[1].slot}, {carrierSlot, cs[2].slot}}, m.st.copies)
	require.Equal(t, 2, m.st.InUse(), "the carrier's slot is back")
	runStep(t, rt)
	require.Equal(t, FinishLength, cs[1].final.Reason)
	require.Equal(t, FinishLength, cs[2].final.Reason)
	require.Equal(t, 0, m.st.InUse())
}

// The submitter's context cancels every choice: queued (never admitted),
// during the prefill, and after the fork; no slot is left held and the
// context's watch is stopped (goleak).
func TestGroupCancelFreesEverySlot(t *testing.T) {
	for _, after := range []int{0, 1, 3} { // steps before the cancel: queued, prefilling, forked
		m := newFakeModel(3)
		rt := idle(t, m, Config{PrefillChunk: 2}, Options{})
		ctx, cancel := context.WithCancel(context.Background())
		_, cs := submitGroup(t, rt, ctx, Request{Prompt: []int32{1, 2, 3, 4, 5}, MaxTokens: 8, Sampling: sample.Greedy(), N: 3})
		for range after {
			runStep(t, rt)
		}
		cancel()
		for i, c := range cs {
			require.Eventually(t, func() bool {
				c.mu.Lock()
				defer c.mu.Unlock()
				return c.final != nil
			}, 5*time.Second, time.Millisecond, "choice %d after %d steps", i, after)
			require.Equal(t, FinishCancelled, c.final.Reason)
		}
		rt.mu.Lock()
		rt.reapLocked()
		require.Empty(t, rt.running)
		require.Empty(t, rt.waiting)
		require.Empty(t, rt.groups)
		require.Zero(t, rt.reserved)
		rt.mu.Unlock()
		require.Equal(t, 0, m.st.InUse(), "after %d steps", after)
	}
}

// A failed prefill fails every choice; a failed copy fails its choice
// alone; a one-token prompt forks at admission (nothing to share).
func TestGroupFailuresAndOneTokenPrompts(t *testing.T) {
	m := newFakeModel(3)
	rt := idle(t, m, Config{}, Options{})
	_, cs := submitGroup(t, rt, context.Background(), Request{Prompt: []int32{1, 2, 3}, MaxTokens: 2, Sampling: sample.Greedy(), N: 3})
	m.err = errors.New("boom")
	runStep(t, rt)
	for _, c := range cs {
		require.Equal(t, FinishError, c.final.Reason)
		require.Contains(t, c.final.Message, "boom")
	}
	reap(rt)
	require.Equal(t, 0, m.st.InUse())
	m.err = nil

	m.st.failCopy = errors.New("no copy")
	_, cs = submitGroup(t, rt, context.Background(), Request{Prompt: []int32{1, 2, 3}, MaxTokens: 1, Sampling: sample.Greedy(), N: 2})
	runStep(t, rt)
	require.Nil(t, cs[0].final)
	require.Equal(t, FinishError, cs[1].final.Reason)
	require.Contains(t, cs[1].final.Message, "no copy")
	require.Equal(t, 1, m.st.InUse())
	runStep(t, rt)
	require.Equal(t, FinishLength, cs[0].final.Reason)
	require.Equal(t, 0, m.st.InUse())
	m.st.failCopy = nil

	_, cs = submitGroup(t, rt, context.Background(), Request{Prompt: []int32{5}, MaxTokens: 1, Sampling: sample.Greedy(), N: 3})
	admit(t, rt)
	require.Equal(t, []*request{cs[0], cs[1], cs[2]}, rt.running, "forked at admission")
	require.Len(t, m.st.copies, 2)
	s := runStep(t, rt)
	require.Equal(t, [][]int32{{5}, {5}, {5}}, s.toks)
	require.Equal(t, 0, m.st.InUse())
}

// A group waits for a slot per choice, first come first served, and holds
// no slot meanwhile; requests behind it wait too.
func TestGroupAdmissionWaitsForItsSlots(t *testing.T) {
	m := newFakeModel(3)
	rt := idle(t, m, Config{}, Options{})
	a := submit(t, rt, Request{Prompt: []int32{1}, MaxTokens: 2, Sampling: sample.Greedy()})
	_, cs := submitGroup(t, rt, context.Background(), Request{Prompt: []int32{1, 2}, MaxTokens: 1, Sampling: sample.Greedy(), N: 3})
	b := submit(t, rt, Request{Prompt: []int32{1}, MaxTokens: 1, Sampling: sample.Greedy()})
	admit(t, rt)
	require.Equal(t, []*request{a}, rt.running)
	require.Equal(t, 1, m.st.InUse())
	require.Len(t, rt.waiting, 2)
	runStep(t, rt)
	runStep(t, rt) // a finishes
	admit(t, rt)
	require.Equal(t, 3, m.st.InUse(), "the group's three slots")
	require.Equal(t, []*request{b}, rt.waiting, "b waits behind the group")
	for range 3 {
		runStep(t, rt)
	}
	for _, c := range cs {
		require.Equal(t, FinishLength, c.final.Reason)
	}
}

// n is validated: at least 1, at most max_choices and max_running, not with
// a Score request or a constraint; Submit takes one choice; ids of a group
// and of its choices are unique among requests in flight.
func TestGroupValidation(t *testing.T) {
	m := newFakeModel(4)
	rt := idle(t, m, Config{MaxChoices: 3}, Options{})
	base := Request{Prompt: []int32{1, 2}, MaxTokens: 2, Sampling: sample.Greedy()}
	for _, c := range []struct {
		n    int
		mod  func(*Request)
		want string
	}{
		{-1, nil, "must be ≥ 1"},
		{4, nil, "at most 3 choices (runtime.max_choices)"},
		{2, func(r *Request) { r.Score = true }, "a Score request"},
	} {
		r := base
		r.N = c.n
		if c.mod != nil {
			c.mod(&r)
		}
		_, err := rt.SubmitGroup(context.Background(), r)
		var ie *InvalidError
		require.ErrorAs(t, err, &ie, "n = %d", c.n)
		require.Equal(t, "n", ie.Field)
		require.Contains(t, ie.Msg, c.want)
	}
	rt2 := idle(t, newFakeModel(4), Config{MaxRunning: 2}, Options{})
	r := base
	r.N = 3
	_, err := rt2.SubmitGroup(context.Background(), r)
	require.ErrorContains(t, err, "runtime.max_running")
	_, err = rt.Submit(context.Background(), Request{Prompt: []int32{1}, MaxTokens: 1, Sampling: sample.Greedy(), N: 2})
	require.ErrorContains(t, err, "SubmitGroup")

	r = base
	r.ID, r.N = "x", 2
	submitGroup(t, rt, context.Background(), r)
	_, err = rt.SubmitGroup(context.Background(), r)
	require.ErrorIs(t, err, ErrDuplicateID)
	_, err = rt.Submit(context.Background(), Request{ID: "x", Prompt: []int32{1}, MaxTokens: 1, Sampling: sample.Greedy()})
	require.ErrorIs(t, err, ErrDuplicateID, "a plain request with the group's id")
	_, err = rt.Submit(context.Background(), Request{ID: ChoiceID("x", 1), Prompt: []int32{1}, MaxTokens: 1, Sampling: sample.Greedy()})
	require.ErrorIs(t, err, ErrDuplicateID, "a plain request with a choice's id")
	r.ID = "y"
	submit(t, rt, Request{ID: ChoiceID("z", 0), Prompt: []int32{1}, MaxTokens: 1, Sampling: sample.Greedy()})
	r.ID = "z"
	_, err = rt.SubmitGroup(context.Background(), r)
	require.ErrorIs(t, err, ErrDuplicateID, "a group whose choice's id is in flight")
	require.Contains(t, rt.Matching(func(id, _ string) bool { return id == "x" }), "x", "an admin finds a group by its id")

	one, err := rt.SubmitGroup(context.Background(), Request{ID: "solo", Prompt: []int32{1}, MaxTokens: 1, Sampling: sample.Greedy()})
	require.NoError(t, err)
	require.Len(t, one.Choices(), 1)
	require.Equal(t, "solo", one.Choices()[0].ID(), "n = 1 is a plain request")
}

// tokenCounter counts the tokens each step runs.
type tokenCounter struct {
	*engine.Engine
	mu     sync.Mutex
	tokens int
}

func (m *tokenCounter) Run(key engine.Key, b *backend.Batch) (*backend.Result, error) {
	m.mu.Lock()
	for _, s := range b.Seqs {
		m.tokens += len(s.Tokens)
	}
	m.mu.Unlock()
	return m.Engine.Run(key, b)
}

func (m *tokenCounter) ran() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.tokens
}

func waitAll(t *testing.T, g *Group) [][]int32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out [][]int32
	for i, h := range g.Choices() {
		ts, f, err := h.Wait(ctx)
		require.NoError(t, err)
		require.NotEqual(t, FinishError, f.Reason, "choice %d: %s", i, f.Message)
		var ids []int32
		for _, tk := range ts {
			ids = append(ids, tk.ID)
		}
		out = append(out, ids)
	}
	return out
}

// On the tiny fixture (CPU): greedy n = 4 gives four identical choices
// equal to the n = 1 request, and the prompt ran once: the model ran the
// prompt but its last token once, then one token per choice per step.
// Sampled, choice i equals an n = 1 request with seed + i. No slot is left.
func TestGroupOnTheEngine(t *testing.T) {
	e := openEngine(t, 6)
	m := &tokenCounter{Engine: e}
	rt := newRuntime(t, m, Config{PrefillChunk: 8})
	V := e.Config().VocabSize
	p := prompt(21, 5, V)
	const maxTok = 6
	ctx := context.Background()
	single := func(sp sample.Params) []int32 {
		h, err := rt.Submit(ctx, Request{Prompt: p, MaxTokens: maxTok, Sampling: sp, IgnoreEOS: true})
		require.NoError(t, err)
		ts, f, err := h.Wait(ctx)
		require.NoError(t, err)
		require.Equal(t, FinishLength, f.Reason)
		var ids []int32
		for _, tk := range ts {
			ids = append(ids, tk.ID)
		}
		return ids
	}

	want := single(sample.Greedy())
	before := m.ran()
	g, err := rt.SubmitGroup(ctx, Request{Prompt: p, MaxTokens: maxTok, Sampling: sample.Greedy(), IgnoreEOS: true, N: 4})
	require.NoError(t, err)
	got := waitAll(t, g)
	for i := range got {
		require.Equal(t, want, got[i], "greedy choice %d", i)
	}
	require.Equal(t, len(p)-1+4*maxTok, m.ran()-before, "the prompt ran once: %d tokens, then %d per choice", len(p)-1, maxTok)

	sp := sample.Params{Temperature: 1, TopP: 0.95, Seed: 77}
	g, err = rt.SubmitGroup(ctx, Request{Prompt: p, MaxTokens: maxTok, Sampling: sp, IgnoreEOS: true, N: 4})
	require.NoError(t, err)
	got = waitAll(t, g)
	distinct := map[string]bool{}
	for i := range got {
		one := sp
		one.Seed = sp.Seed + uint64(i)
		require.Equal(t, single(one), got[i], "sampled choice %d follows seed %d", i, one.Seed)
		distinct[string(fmtIDs(got[i]))] = true
	}
	require.Greater(t, len(distinct), 1, "sampled choices differ")
	require.Eventually(t, func() bool { return e.Store().InUse() == 0 }, 5*time.Second, time.Millisecond)
}

func fmtIDs(ids []int32) []byte {
	var b []byte
	for _, id := range ids {
		b = append(b, byte(id), byte(id>>8), byte(id>>16))
	}
	return b
}

// With speculative decoding on, a group's choices decode plainly beside a
// speculating request (the drafter knows no forks): every greedy choice
// gives the plain tokens, the speculating request its own and its drafts.
func TestGroupBesideSpeculation(t *testing.T) {
	V := 256
	base := []Request{
		{Prompt: prompt(9, 1, V), MaxTokens: 12, Sampling: sample.Greedy(), IgnoreEOS: true},
		{Prompt: prompt(13, 2, V), MaxTokens: 10, Sampling: sample.Greedy(), IgnoreEOS: true},
	}
	truth := truthOf(t, base)
	e := specEngine(t, 4, 6)
	d, err := speculative.NewScripted("oracle", 5, speculative.Oracle(truth, nil, V))
	require.NoError(t, err)
	rt, err := New(e, Config{PrefillChunk: 4}, Options{Drafter: d})
	require.NoError(t, err)
	defer rt.Close()
	ctx := context.Background()
	h, err := rt.Submit(ctx, base[0])
	require.NoError(t, err)
	gr := base[1]
	gr.N = 3
	g, err := rt.SubmitGroup(ctx, gr)
	require.NoError(t, err)
	toks, f, err := h.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, truth(base[0].Prompt), ids(toks))
	require.Positive(t, f.Spec.Steps, "the plain request speculated")
	for i, c := range g.Choices() {
		toks, f, err := c.Wait(ctx)
		require.NoError(t, err)
		require.Equal(t, truth(base[1].Prompt), ids(toks), "choice %d", i)
		require.Zero(t, f.Spec.Steps, "choice %d decodes plainly", i)
	}
	require.Eventually(t, func() bool { return e.Store().InUse() == 0 }, 5*time.Second, time.Millisecond)
}

// Each choice keeps its own logits processing: with a repetition penalty
// of 100 under greedy decoding no choice repeats a token, and every choice
// equals the n = 1 processed request (its penalties counted over its own
// output only).
func TestGroupChoicesProcessTheirOwnOutput(t *testing.T) {
	e := openEngine(t, 4)
	rt := newRuntime(t, e, Config{})
	ctx := context.Background()
	req := Request{Prompt: prompt(7, 4, e.Config().VocabSize), MaxTokens: 10, Sampling: sample.Greedy(), IgnoreEOS: true,
		Processing: sample.Processing{RepetitionPenalty: 100}}
	h, err := rt.Submit(ctx, req)
	require.NoError(t, err)
	ts, _, err := h.Wait(ctx)
	require.NoError(t, err)
	want := ids(ts)
	req.N = 3
	g, err := rt.SubmitGroup(ctx, req)
	require.NoError(t, err)
	for i, got := range waitAll(t, g) {
		require.Equal(t, want, got, "choice %d", i)
		seen := map[int32]bool{}
		for _, tk := range got {
			require.False(t, seen[tk], "choice %d repeats %d", i, tk)
			seen[tk] = true
		}
	}
}
