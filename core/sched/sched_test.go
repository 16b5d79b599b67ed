package sched

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/internal/syncbuf"
	"github.com/glmflash/glmflash/kernels/parallel"
	"github.com/glmflash/glmflash/model"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// goleak: every test must leave no scheduler, AfterFunc or other goroutine.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(parallel.HelperFunc)) // the kernel pool lives for the process
}

const fixture = "../../testdata/glm5next-tiny-a/checkpoint"

func openEngine(t *testing.T, slots int) *engine.Engine {
	t.Helper()
	ck, err := model.Open(fixture)
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	e, err := engine.New(ck.Config(), ck, engine.Options{Slots: slots})
	require.NoError(t, err)
	return e
}

func newRuntime(t *testing.T, m Model, cfg Config) *Scheduler {
	t.Helper()
	rt, err := New(m, cfg, Options{})
	require.NoError(t, err)
	t.Cleanup(rt.Close)
	return rt
}

func prompt(n, seed, vocab int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((seed*131 + i*17 + i*i*7) % vocab)
	}
	return p
}

// alone generates with a fresh single-slot engine and a plain loop: the
// reference every batched result must equal.
func alone(t *testing.T, e *engine.Engine, req Request) []int32 {
	t.Helper()
	ref, err := engine.New(e.Config(), engineWeights(t), engine.Options{Slots: 1})
	require.NoError(t, err)
	slot, err := ref.Store().Alloc()
	require.NoError(t, err)
	key := engine.Key{Mode: graph.Mixed, Logits: graph.LastLogits}
	res, err := ref.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: req.Prompt}}})
	require.NoError(t, err)
	s := sample.New(req.Sampling)
	var out []int32
	for {
		tok := int32(s.Next(res.Row(0)))
		out = append(out, tok)
		for _, st := range req.StopIDs {
			if st == tok {
				return out
			}
		}
		if len(out) == req.MaxTokens {
			return out
		}
		res, err = ref.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: []int32{tok}}}})
		require.NoError(t, err)
	}
}

func engineWeights(t *testing.T) plan.Weights {
	ck, err := model.Open(fixture)
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	return ck
}

func ids(toks []Token) []int32 {
	out := make([]int32, len(toks))
	for i, t := range toks {
		out[i] = t.ID
	}
	return out
}

// Many requests of different lengths, chunked and mixed with each other's
// decode steps, each get exactly the tokens they get alone — greedy and
// seeded sampling alike.
func TestBatchingGivesEachRequestItsAloneTokens(t *testing.T) {
	e := openEngine(t, 6)
	rt := newRuntime(t, e, Config{MaxQueue: 32, MaxBatchTokens: 20, PrefillChunk: 7})
	V := e.Config().VocabSize
	var reqs []Request
	for i := 0; i < 14; i++ {
		r := Request{Prompt: prompt(1+i*5%37, i, V), MaxTokens: 3 + i%6, Sampling: sample.Greedy()}
		if i%3 == 1 {
			r.Sampling = sample.Params{Temperature: 0.9, TopK: 50, TopP: 0.95, MinP: 0.01, Seed: uint64(100 + i)}
		}
		reqs = append(reqs, r)
	}
	got := make([][]int32, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := rt.Submit(context.Background(), r)
			if !assertNoError(t, err) {
				return
			}
			toks, f, err := h.Wait(context.Background())
			if assertNoError(t, err) {
				require.Equal(t, FinishLength, f.Reason)
				require.Equal(t, len(r.Prompt), f.PromptTokens)
				require.Equal(t, r.MaxTokens, f.CompletionTokens)
				got[i] = ids(toks)
			}
		}()
	}
	wg.Wait()
	for i, r := range reqs {
		require.Equal(t, alone(t, e, r), got[i], "request %d", i)
	}
	require.Equal(t, 0, e.Store().InUse())
}

func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}

func TestStopIDsAndTokenFields(t *testing.T) {
	e := openEngine(t, 2)
	rt := newRuntime(t, e, Config{})
	base := Request{Prompt: prompt(9, 3, 256), MaxTokens: 8, Sampling: sample.Greedy(), TopLogprobs: 3}
	want := alone(t, e, base)
	stopAt := 4
	for i := 0; i < stopAt; i++ {
		require.NotEqual(t, want[stopAt], want[i], "pick a prompt whose 5th token is new")
	}
	req := base
	req.StopIDs = []int32{want[stopAt]}
	h, err := rt.Submit(context.Background(), req)
	require.NoError(t, err)
	toks, f, err := h.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishStop, f.Reason)
	require.Equal(t, want[:stopAt+1], ids(toks))
	require.Equal(t, stopAt+1, f.CompletionTokens)
	require.Positive(t, f.TTFT)
	require.GreaterOrEqual(t, f.Total, f.TTFT)
	for i, tk := range toks {
		require.Equal(t, i, tk.Index)
		require.Len(t, tk.Top, 3)
		require.Equal(t, tk.ID, tk.Top[0].ID, "greedy picks the most likely token")
		require.InDelta(t, tk.Top[0].Logprob, tk.Logprob, 1e-6)
		require.LessOrEqual(t, tk.Logprob, float32(0))
		require.GreaterOrEqual(t, tk.Top[0].Logprob, tk.Top[1].Logprob)
		require.GreaterOrEqual(t, tk.Top[1].Logprob, tk.Top[2].Logprob)
	}
}

func TestLogprobs(t *testing.T) {
	row := []float32{1, 3, 2, 3, -1}
	lp, top := sample.Logprobs(row, 2, 3)
	var z float64
	for _, v := range row {
		z += math.Exp(float64(v))
	}
	require.InDelta(t, 2-math.Log(z), float64(lp), 1e-6)
	require.Equal(t, []int32{1, 3, 2}, []int32{top[0].ID, top[1].ID, top[2].ID})
	require.InDelta(t, 3-math.Log(z), float64(top[0].Logprob), 1e-6)
	_, none := sample.Logprobs(row, 0, 0)
	require.Nil(t, none)
}

func TestScore(t *testing.T) {
	e := openEngine(t, 2)
	rt := newRuntime(t, e, Config{PrefillChunk: 5, MaxBatchTokens: 8})
	toks := prompt(13, 7, 256)
	// reference: one AllLogits pass on a separate engine
	ref, err := engine.New(e.Config(), engineWeights(t), engine.Options{Slots: 1})
	require.NoError(t, err)
	slot, _ := ref.Store().Alloc()
	want, err := ref.Run(engine.Key{Mode: graph.Mixed, Logits: graph.AllLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: toks}}})
	require.NoError(t, err)

	// a generating request shares the steps
	gen, err := rt.Submit(context.Background(), Request{Prompt: prompt(6, 1, 256), MaxTokens: 6, Sampling: sample.Greedy()})
	require.NoError(t, err)
	for _, all := range []bool{true, false} {
		h, err := rt.Submit(context.Background(), Request{Prompt: toks, Score: true, AllPositions: all})
		require.NoError(t, err)
		got, f, err := h.Wait(context.Background())
		require.NoError(t, err)
		require.Empty(t, got)
		require.Equal(t, FinishScored, f.Reason)
		require.Equal(t, 256, f.Vocab)
		if all {
			require.Equal(t, 13, f.Rows)
			require.Less(t, maxDiff(want.Logits, f.Logits), 1e-4)
		} else {
			require.Equal(t, 1, f.Rows)
			require.Less(t, maxDiff(want.Row(12), f.Logits), 1e-4)
		}
	}
	gtoks, _, err := gen.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, alone(t, e, Request{Prompt: prompt(6, 1, 256), MaxTokens: 6, Sampling: sample.Greedy()}), ids(gtoks))
	require.Eventually(t, func() bool { return e.Store().InUse() == 0 }, 5*time.Second, time.Millisecond)
}

func maxDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	d := 0.0
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

// slowModel delays every step so that tests can act in the middle of a
// generation; it can also panic on demand.
type slowModel struct {
	*engine.Engine
	delay   time.Duration
	mu      sync.Mutex
	panicOn int32 // a token id that makes Run panic (-1: never)
	steps   int
}

func (m *slowModel) Run(key engine.Key, b *backend.Batch) (*backend.Result, error) {
	time.Sleep(m.delay)
	m.mu.Lock()
	m.steps++
	p := m.panicOn
	m.mu.Unlock()
	for _, s := range b.Seqs {
		for _, tok := range s.Tokens {
			if tok == p {
				panic("kernel exploded")
			}
		}
	}
	return m.Engine.Run(key, b)
}

func TestCancelFreesSlotAndSparesOthers(t *testing.T) {
	e := openEngine(t, 4)
	m := &slowModel{Engine: e, delay: 2 * time.Millisecond, panicOn: -1}
	rt := newRuntime(t, m, Config{})
	other := Request{Prompt: prompt(11, 2, 256), MaxTokens: 40, Sampling: sample.Greedy()}
	oh, err := rt.Submit(context.Background(), other)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	h, err := rt.Submit(ctx, Request{Prompt: prompt(5, 9, 256), MaxTokens: 1000, Sampling: sample.Greedy()})
	require.NoError(t, err)
	toks, f, err := h.Recv(context.Background())
	require.NoError(t, err)
	require.Nil(t, f)
	require.NotEmpty(t, toks)
	require.Equal(t, 2, e.Store().InUse())
	cancel()
	_, f, err = h.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishCancelled, f.Reason)
	require.Eventually(t, func() bool { return e.Store().InUse() == 1 }, 5*time.Second, time.Millisecond)

	otoks, of, err := oh.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishLength, of.Reason)
	require.Equal(t, alone(t, e, other), ids(otoks))
	require.Eventually(t, func() bool { return e.Store().InUse() == 0 }, 5*time.Second, time.Millisecond)
}

func TestDeadlineAndAbort(t *testing.T) {
	e := openEngine(t, 4)
	m := &slowModel{Engine: e, delay: 2 * time.Millisecond, panicOn: -1}
	rt := newRuntime(t, m, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	h, err := rt.Submit(ctx, Request{Prompt: prompt(5, 1, 256), MaxTokens: 1000, Sampling: sample.Greedy()})
	require.NoError(t, err)
	_, f, err := h.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishCancelled, f.Reason)
	require.Equal(t, "deadline exceeded", f.Message)

	h, err = rt.Submit(context.Background(), Request{ID: "mine", Prompt: prompt(5, 1, 256), MaxTokens: 1000, Sampling: sample.Greedy()})
	require.NoError(t, err)
	require.Equal(t, "mine", h.ID())
	_, err = rt.Submit(context.Background(), Request{ID: "mine", Prompt: prompt(5, 1, 256), MaxTokens: 1, Sampling: sample.Greedy()})
	require.ErrorIs(t, err, ErrDuplicateID)
	_, _, err = h.Recv(context.Background())
	require.NoError(t, err)
	require.NoError(t, rt.Abort("mine"))
	_, f, err = h.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishAbort, f.Reason)
	require.Positive(t, f.CompletionTokens)
	require.ErrorIs(t, rt.Abort("mine"), ErrNotFound)
	require.ErrorIs(t, rt.Abort("nobody"), ErrNotFound)
	require.Eventually(t, func() bool { return e.Store().InUse() == 0 }, 5*time.Second, time.Millisecond)
}

func TestQueueBoundAndQueuedCancel(t *testing.T) {
	e := openEngine(t, 4)
	m := &slowModel{Engine: e, delay: time.Millisecond, panicOn: -1}
	rt := newRuntime(t, m, Config{MaxRunning: 1, MaxQueue: 1})
	long := Request{Prompt: prompt(3, 1, 256), MaxTokens: 4000, Sampling: sample.Greedy()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, err := rt.Submit(ctx, long)
	require.NoError(t, err)
	_, _, err = a.Recv(ctx) // running now
	require.NoError(t, err)
	qctx, qcancel := context.WithCancel(context.Background())
	b, err := rt.Submit(qctx, long)
	require.NoError(t, err)
	_, err = rt.Submit(ctx, long)
	require.ErrorIs(t, err, ErrQueueFull)
	w, r := rt.InFlight()
	require.Equal(t, 1, w)
	require.Equal(t, 1, r)
	// cancelling the queued one ends it at once and makes room
	qcancel()
	_, f, err := b.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishCancelled, f.Reason)
	require.Zero(t, f.Queue)
	require.Zero(t, f.CompletionTokens)
	c, err := rt.Submit(ctx, Request{Prompt: prompt(3, 1, 256), MaxTokens: 2, Sampling: sample.Greedy()})
	require.NoError(t, err)
	require.NoError(t, rt.Abort(a.ID()))
	_, f, err = c.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishLength, f.Reason)
	require.Positive(t, f.Queue)
}

func TestDrain(t *testing.T) {
	e := openEngine(t, 4)
	m := &slowModel{Engine: e, delay: time.Millisecond, panicOn: -1}
	rt, err := New(m, Config{}, Options{})
	require.NoError(t, err)
	short, err := rt.Submit(context.Background(), Request{Prompt: prompt(3, 1, 256), MaxTokens: 5, Sampling: sample.Greedy()})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.Equal(t, 0, rt.Drain(ctx), "a short request finishes within the deadline")
	_, f, err := short.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishLength, f.Reason)
	_, err = rt.Submit(context.Background(), Request{Prompt: prompt(3, 1, 256), MaxTokens: 5, Sampling: sample.Greedy()})
	require.ErrorIs(t, err, ErrDraining)
	rt.Close()

	rt, err = New(m, Config{}, Options{})
	require.NoError(t, err)
	long, err := rt.Submit(context.Background(), Request{Prompt: prompt(3, 1, 256), MaxTokens: 4000, Sampling: sample.Greedy()})
	require.NoError(t, err)
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	require.Equal(t, 1, rt.Drain(ctx), "a long one is aborted at the deadline")
	_, f, err = long.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishAbort, f.Reason)
	rt.Close()
	rt.Close()
	require.Equal(t, 0, e.Store().InUse())
	_, err = rt.Submit(context.Background(), Request{Prompt: prompt(3, 1, 256), MaxTokens: 5, Sampling: sample.Greedy()})
	require.ErrorIs(t, err, ErrClosed)
}

func TestEnginePanicFailsOnlyThatStep(t *testing.T) {
	e := openEngine(t, 2)
	m := &slowModel{Engine: e, panicOn: 255}
	rt := newRuntime(t, m, Config{})
	h, err := rt.Submit(context.Background(), Request{Prompt: []int32{1, 255}, MaxTokens: 3, Sampling: sample.Greedy()})
	require.NoError(t, err)
	_, f, err := h.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishError, f.Reason)
	require.Contains(t, f.Message, "kernel exploded")
	require.Eventually(t, func() bool { return e.Store().InUse() == 0 }, 5*time.Second, time.Millisecond)
	ok := Request{Prompt: []int32{1, 2}, MaxTokens: 3, Sampling: sample.Greedy()}
	h, err = rt.Submit(context.Background(), ok)
	require.NoError(t, err)
	toks, f, err := h.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishLength, f.Reason)
	require.Equal(t, alone(t, e, ok), ids(toks))
}

func TestValidate(t *testing.T) {
	e := openEngine(t, 1)
	rt := newRuntime(t, e, Config{ContextLimit: 64})
	good := func() Request { return Request{Prompt: []int32{1, 2, 3}, MaxTokens: 4, Sampling: sample.Greedy()} }
	cases := map[string]func(*Request){
		"prompt_ids":             func(r *Request) { r.Prompt = nil },
		"prompt_ids[1]":          func(r *Request) { r.Prompt = []int32{1, 256} },
		"prompt_ids[0]":          func(r *Request) { r.Prompt = []int32{-1} },
		"prompt_ids ":            func(r *Request) { r.Prompt = prompt(65, 1, 256) },
		"max_tokens":             func(r *Request) { r.MaxTokens = 0 },
		"max_tokens ":            func(r *Request) { r.MaxTokens = 62 },
		"max_tokens  ":           func(r *Request) { r.MaxTokens = math.MaxInt - 1 }, // prompt + max_tokens wrapped
		"stop_ids[0]":            func(r *Request) { r.StopIDs = []int32{300} },
		"top_logprobs":           func(r *Request) { r.TopLogprobs = 21 },
		"sampling: temperature":  func(r *Request) { r.Sampling.Temperature = -1 },
		"sampling: top_p":        func(r *Request) { r.Sampling.TopP = 0 },
		"sampling: top_k":        func(r *Request) { r.Sampling.TopK = -1 },
		"sampling: min_p":        func(r *Request) { r.Sampling.MinP = 1 },
		"sampling: temperature ": func(r *Request) { r.Sampling.Temperature = math.NaN() },
	}
	for name, mut := range cases {
		r := good()
		mut(&r)
		_, err := rt.Submit(context.Background(), r)
		var ie *InvalidError
		require.True(t, errors.As(err, &ie), "%s: %v", name, err)
		want := strings.TrimRight(name, " ")
		require.Contains(t, err.Error(), want, name)
	}
	r := good()
	r.MaxTokens = 61 // exactly the limit
	h, err := rt.Submit(context.Background(), r)
	require.NoError(t, err)
	_, f, err := h.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, 61, f.CompletionTokens)
}

func TestConfigDefaultsAndErrors(t *testing.T) {
	cfg := &model.Config{MaxPositionEmbeddings: 4096}
	c, err := Config{}.WithDefaults(cfg, 8)
	require.NoError(t, err)
	require.Equal(t, Config{MaxRunning: 8, MaxQueue: 64, MaxBatchTokens: 256, PrefillChunk: 64, ContextLimit: 4096, MaxChoices: 16}, c)
	for _, bad := range []Config{{MaxRunning: 9}, {MaxRunning: 8, MaxBatchTokens: 4}, {PrefillChunk: -1}, {ContextLimit: 5000}, {MaxChoices: -1}} {
		_, err := bad.WithDefaults(cfg, 8)
		require.Error(t, err, fmt.Sprint(bad))
	}
}

// The store is shared with other users: admission waits for a free slot.
func TestAdmissionWaitsForStoreSlots(t *testing.T) {
	e := openEngine(t, 2)
	rt := newRuntime(t, e, Config{})
	a, err := e.Store().Alloc()
	require.NoError(t, err)
	b, err := e.Store().Alloc()
	require.NoError(t, err)
	h, err := rt.Submit(context.Background(), Request{Prompt: []int32{1, 2}, MaxTokens: 2, Sampling: sample.Greedy()})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, _, err = h.Recv(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded, "no slot, no progress")
	require.NoError(t, e.Store().Free(a))
	_, f, err := h.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishLength, f.Reason)
	require.Eventually(t, func() bool { return e.Store().InUse() == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, e.Store().Free(b))
}

// A request finished by the scheduler (length, stop or score) has its slot
// back in the store by the time its final is delivered: a client that sees
// the final and immediately counts free slots must not see a stale one.
// (CI once caught Score returning before its slot was freed.)
func TestSlotIsFreeWhenFinalArrives(t *testing.T) {
	e := openEngine(t, 1)
	rt := newRuntime(t, e, Config{PrefillChunk: 4})
	rt.afterFinal = func() { time.Sleep(3 * time.Millisecond) }
	for i := 0; i < 12; i++ {
		var req Request
		switch i % 3 {
		case 0:
			req = Request{Prompt: prompt(5, i, 256), MaxTokens: 3, Sampling: sample.Greedy()}
		case 1:
			req = Request{Prompt: prompt(9, i, 256), Score: true, AllPositions: i%2 == 0}
		case 2:
			first := alone(t, e, Request{Prompt: prompt(5, i, 256), MaxTokens: 1, Sampling: sample.Greedy()})
			req = Request{Prompt: prompt(5, i, 256), MaxTokens: 50, StopIDs: first, Sampling: sample.Greedy()}
		}
		h, err := rt.Submit(context.Background(), req)
		require.NoError(t, err)
		_, f, err := h.Wait(context.Background())
		require.NoError(t, err)
		require.Contains(t, []FinishReason{FinishLength, FinishScored, FinishStop}, f.Reason)
		require.Equal(t, 0, e.Store().InUse(), "request %d (%s)", i, f.Reason)
	}
}

// The per-request log line is valid structured JSON: no key twice (a
// duplicate "message" once shadowed zerolog's own), and the fields a log
// pipeline reads are there.
func TestRequestLogLineHasUniqueKeys(t *testing.T) {
	e := openEngine(t, 1)
	var buf syncbuf.Buffer
	rt, err := New(e, Config{}, Options{Log: zerolog.New(&buf)})
	require.NoError(t, err)
	h, err := rt.Submit(context.Background(), Request{ID: "r-1", Prompt: prompt(4, 1, 256), MaxTokens: 2, Sampling: sample.Greedy()})
	require.NoError(t, err)
	_, _, err = h.Wait(context.Background())
	require.NoError(t, err)
	rt.Close()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.NotEmpty(t, lines)
	for _, line := range lines {
		dec := json.NewDecoder(strings.NewReader(line))
		tok, err := dec.Token()
		require.NoError(t, err)
		require.Equal(t, json.Delim('{'), tok)
		seen := map[string]bool{}
		for dec.More() {
			k, err := dec.Token()
			require.NoError(t, err)
			require.False(t, seen[k.(string)], "key %q twice in %s", k, line)
			seen[k.(string)] = true
			var v json.RawMessage
			require.NoError(t, dec.Decode(&v))
		}
		if strings.Contains(line, "request finished") {
			for _, k := range []string{"request_id", "reason", "prompt_tokens", "completion_tokens", "ttft_ms", "total_ms", "message"} {
				require.True(t, seen[k], "field %s missing in %s", k, line)
			}
		}
	}
}

// preemptMetrics counts preemptions (PreemptMetrics).
type preemptMetrics struct {
	NopMetrics
	mu sync.Mutex
	n  int
}

func (m *preemptMetrics) Preempted() { m.mu.Lock(); m.n++; m.mu.Unlock() }

// A page pool too small for every running request's context preempts the
// newest (recompute preemption) instead of failing it: each request's
// streamed tokens, received as they come, are exactly those of a run
// without preemption — none lost, none repeated — greedy and seeded alike,
// and the preemptions are counted.
func TestPreemptRecomputesWithIdenticalOutput(t *testing.T) {
	ck, err := model.Open(fixture)
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	V := ck.Config().VocabSize
	var reqs []Request
	for i := range 6 {
		r := Request{Prompt: prompt(9+i*3, i, V), MaxTokens: 24, Sampling: sample.Greedy(), IgnoreEOS: true}
		if i%3 == 2 {
			r.Sampling = sample.Params{Temperature: 0.8, TopK: 40, TopP: 1, Seed: uint64(7 + i)}
		}
		reqs = append(reqs, r)
	}
	var logBuf syncbuf.Buffer
	run := func(pages int, met Metrics) ([][]int32, *Scheduler) {
		e, err := engine.New(ck.Config(), ck, engine.Options{Slots: 6, PageTokens: 8, Pages: pages})
		require.NoError(t, err)
		t.Cleanup(func() { e.Close() })
		rt, err := New(e, Config{MaxBatchTokens: 32, PrefillChunk: 8}, Options{Metrics: met, Log: zerolog.New(&logBuf)})
		require.NoError(t, err)
		t.Cleanup(rt.Close)
		out := make([][]int32, len(reqs))
		var wg sync.WaitGroup
		for i, r := range reqs {
			h, err := rt.Submit(context.Background(), r)
			require.NoError(t, err)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					toks, f, err := h.Recv(context.Background())
					if err != nil || f != nil {
						if f != nil && f.Reason != FinishLength {
							t.Errorf("request %d: %s %s", i, f.Reason, f.Message)
						}
						return
					}
					for _, tk := range toks {
						if tk.Index != len(out[i]) {
							t.Errorf("request %d: token index %d after %d tokens", i, tk.Index, len(out[i]))
						}
						out[i] = append(out[i], tk.ID)
					}
				}
			}()
		}
		wg.Wait()
		return out, rt
	}
	want, ref := run(0, nil) // every slot can hold the whole context
	require.Zero(t, ref.Preemptions())
	// 6 requests of 33..48 tokens each need 5..6 pages of 8 tokens: 12
	// pages hold about two at a time
	met := &preemptMetrics{}
	got, rt := run(12, met)
	require.Positive(t, rt.Preemptions())
	resumed := 0 // preempted after streaming tokens: recomputed, then resumed
	for _, line := range strings.Split(strings.TrimSpace(logBuf.String()), "\n") {
		var ev struct {
			Msg       string `json:"message"`
			Generated int    `json:"generated"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &ev))
		if strings.HasPrefix(ev.Msg, "preempted") && ev.Generated > 0 {
			resumed++
		}
	}
	require.Positive(t, resumed)
	require.EqualValues(t, rt.Preemptions(), met.n)
	for i := range reqs {
		require.Len(t, got[i], reqs[i].MaxTokens, "request %d", i)
		require.Equal(t, want[i], got[i], "request %d", i)
	}
	st := rt.m.Store().(backend.PagedStore).PageStats()
	require.Zero(t, st.Used, "every page is back in the pool")
}

// A request waits while the pages of its prompt are not free: beside a
// long request that will fill the pool, a second one is not admitted (it
// would be preempted at once), so nothing is preempted and both get the
// tokens a run alone gives.
func TestAdmissionWaitsForPromptPages(t *testing.T) {
	ck, err := model.Open(fixture)
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	e, err := engine.New(ck.Config(), ck, engine.Options{Slots: 2, PageTokens: 8, Pages: 12})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	rt := newRuntime(t, e, Config{MaxBatchTokens: 32, PrefillChunk: 8})
	V := e.Config().VocabSize
	long := Request{Prompt: prompt(60, 1, V), MaxTokens: 36, Sampling: sample.Greedy(), IgnoreEOS: true}  // 96 tokens: all 12 pages
	short := Request{Prompt: prompt(40, 2, V), MaxTokens: 30, Sampling: sample.Greedy(), IgnoreEOS: true} // admitted beside it, it would be preempted
	h1, err := rt.Submit(context.Background(), long)
	require.NoError(t, err)
	h2, err := rt.Submit(context.Background(), short)
	require.NoError(t, err)
	for i, c := range []struct {
		h   *Handle
		req Request
	}{{h1, long}, {h2, short}} {
		toks, f, err := c.h.Wait(context.Background())
		require.NoError(t, err)
		require.Equal(t, FinishLength, f.Reason, "request %d: %s", i, f.Message)
		require.Equal(t, alone(t, e, c.req), ids(toks), "request %d", i)
	}
	require.Zero(t, rt.Preemptions())
}
