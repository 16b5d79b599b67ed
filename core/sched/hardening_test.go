package sched

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/model"
	"github.com/stretchr/testify/require"
)

// eosModel is the engine with end-of-sequence ids in its configuration.
type eosModel struct {
	*engine.Engine
	cfg *model.Config
}

func (m eosModel) Config() *model.Config { return m.cfg }

// The model's EOS ends generation (FinishStop, the EOS token streamed and
// counted) unless the request sets IgnoreEOS.
func TestEOSStopsUnlessIgnored(t *testing.T) {
	e := openEngine(t, 2)
	req := Request{Prompt: prompt(7, 1, 256), MaxTokens: 10, Sampling: sample.Greedy()}
	want := alone(t, e, req)
	eos := want[3]
	cut := 1 + indexOf(want, eos)
	cfg := e.Config().Clone()
	cfg.EOSTokenIDs = []int{255, int(eos)}
	rt := newRuntime(t, eosModel{Engine: e, cfg: cfg}, Config{})

	h, err := rt.Submit(context.Background(), req)
	require.NoError(t, err)
	toks, f, err := h.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishStop, f.Reason)
	require.Equal(t, want[:cut], ids(toks))
	require.Equal(t, cut, f.CompletionTokens)

	req.IgnoreEOS = true
	h, err = rt.Submit(context.Background(), req)
	require.NoError(t, err)
	toks, f, err = h.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishLength, f.Reason)
	require.Equal(t, want, ids(toks))

	// EndIDs: what the text layer withholds the text of.
	req.StopIDs = []int32{7, eos}
	require.ElementsMatch(t, []int32{7, eos}, rt.EndIDs(req), "ignored EOS: the stop ids only")
	req.IgnoreEOS = false
	require.ElementsMatch(t, []int32{7, eos, 255}, rt.EndIDs(req), "stop ids and EOS, once each")
}

func indexOf(s []int32, v int32) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// nanModel poisons the logits of the sequence whose last token is poison
// (it has no Prepare, so every step goes through Run).
type nanModel struct {
	e      *engine.Engine
	poison int32
}

func (m nanModel) Config() *model.Config { return m.e.Config() }
func (m nanModel) Store() backend.Store  { return m.e.Store() }
func (m nanModel) Run(key engine.Key, b *backend.Batch) (*backend.Result, error) {
	plain := *b
	plain.Sample, plain.SamplesOnly = nil, false
	res, err := m.e.Run(key, &plain)
	if err != nil || key.Logits != graph.LastLogits {
		if err == nil && b.Sample != nil {
			res.Samples = backend.SampleHost(res.Logits, res.Vocab, b.Sample)
		}
		return res, err
	}
	for i, s := range b.Seqs {
		if s.Tokens[len(s.Tokens)-1] == m.poison {
			res.Row(i)[3] = float32(math.NaN())
		}
	}
	// the backend samples after the poison, as a device backend would
	res.Samples = backend.SampleHost(res.Logits, res.Vocab, b.Sample)
	return res, nil
}

// Non-finite logits end that request with an error finish (never a silent
// token 0); a request batched with it is unharmed.
func TestNonFiniteLogitsEndTheRequestWithAnError(t *testing.T) {
	e := openEngine(t, 2)
	rt := newRuntime(t, nanModel{e: e, poison: 77}, Config{})
	bad, err := rt.Submit(context.Background(), Request{Prompt: []int32{5, 77}, MaxTokens: 4, Sampling: sample.Greedy()})
	require.NoError(t, err)
	ok := Request{Prompt: []int32{5, 6}, MaxTokens: 4, Sampling: sample.Greedy()}
	good, err := rt.Submit(context.Background(), ok)
	require.NoError(t, err)
	toks, f, err := bad.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishError, f.Reason)
	require.Contains(t, f.Message, "non-finite logits: 1 of 256 values (the first, token 3, is NaN)")
	require.Empty(t, toks)
	toks, f, err = good.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishLength, f.Reason)
	require.Equal(t, alone(t, e, ok), ids(toks))
}

// blockingModel holds every forward pass until released.
type blockingModel struct {
	e       *engine.Engine
	entered chan struct{}
	release chan struct{}
}

func (m blockingModel) Config() *model.Config { return m.e.Config() }
func (m blockingModel) Store() backend.Store  { return m.e.Store() }
func (m blockingModel) Run(key engine.Key, b *backend.Batch) (*backend.Result, error) {
	select {
	case m.entered <- struct{}{}:
	default:
	}
	<-m.release
	return m.e.Run(key, b)
}

// CloseWithin returns when its context ends even while a forward pass runs
// (a shutdown bounded by drain_timeout even mid-step); the request is
// finalized at once, and the scheduler stops after the step.
func TestCloseWithinIsBoundedMidStep(t *testing.T) {
	e := openEngine(t, 1)
	m := blockingModel{e: e, entered: make(chan struct{}, 1), release: make(chan struct{})}
	rt, err := New(m, Config{}, Options{})
	require.NoError(t, err)
	h, err := rt.Submit(context.Background(), Request{Prompt: []int32{1, 2}, MaxTokens: 3, Sampling: sample.Greedy()})
	require.NoError(t, err)
	<-m.entered // the step is running
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the deadline has passed
	require.False(t, rt.CloseWithin(ctx), "the step still runs")
	_, f, err := h.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishAbort, f.Reason, "the caller is answered at once")
	close(m.release)
	require.True(t, rt.CloseWithin(context.Background()), "the scheduler stops after the step")
}

// Only the caller that submitted a request (or an admin) may abort it.
func TestAbortByOwner(t *testing.T) {
	e := openEngine(t, 1)
	rt := newRuntime(t, e, Config{})
	h, err := rt.Submit(context.Background(), Request{ID: "r1", Owner: "alice", Prompt: []int32{1, 2}, MaxTokens: 4000, Sampling: sample.Greedy()})
	require.NoError(t, err)
	require.ErrorIs(t, rt.AbortBy("r1", "mallory", false), ErrNotFound)
	require.ErrorIs(t, rt.AbortBy("r1", "", false), ErrNotFound)
	require.NoError(t, rt.AbortBy("r1", "alice", false))
	_, f, err := h.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishAbort, f.Reason)
	h, err = rt.Submit(context.Background(), Request{ID: "r2", Owner: "alice", Prompt: []int32{1, 2}, MaxTokens: 4000, Sampling: sample.Greedy()})
	require.NoError(t, err)
	require.NoError(t, rt.AbortBy("r2", "root", true), "an admin may abort anyone's")
	_, f, err = h.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishAbort, f.Reason)
}

// countingModel counts forward passes and holds the first until released.
type countingModel struct {
	blockingModel
	mu    *sync.Mutex
	steps *int
}

func (m countingModel) Run(key engine.Key, b *backend.Batch) (*backend.Result, error) {
	m.mu.Lock()
	*m.steps++
	first := *m.steps == 1
	m.mu.Unlock()
	if first {
		return m.blockingModel.Run(key, b)
	}
	return m.e.Run(key, b)
}

// A Score whose caller goes away stops at the next step: the runtime does
// not run the rest of its prompt.
func TestScoreStopsWhenTheCallerGoesAway(t *testing.T) {
	e := openEngine(t, 1)
	var mu sync.Mutex
	steps := 0
	m := countingModel{blockingModel: blockingModel{e: e, entered: make(chan struct{}, 1), release: make(chan struct{})}, mu: &mu, steps: &steps}
	rt := newRuntime(t, m, Config{PrefillChunk: 4})
	ctx, cancel := context.WithCancel(context.Background())
	h, err := rt.Submit(ctx, Request{Prompt: prompt(400, 3, 256), Score: true, AllPositions: true})
	require.NoError(t, err)
	<-m.entered // the first of 100 prompt chunks runs
	cancel()
	_, f, err := h.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishCancelled, f.Reason)
	close(m.release)
	require.Eventually(t, func() bool { return e.Store().InUse() == 0 }, 10*time.Second, time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.LessOrEqual(t, steps, 2, "at most the running step and one prepared ahead")
}
