package sched

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/speculative"
	"github.com/glmflash/glmflash/internal/syncbuf"
	"github.com/glmflash/glmflash/model"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

func specEngine(t *testing.T, slots, rollback int) *engine.Engine {
	t.Helper()
	ck, err := model.Open(fixture)
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	e, err := engine.New(ck.Config(), ck, engine.Options{Slots: slots, Rollback: rollback})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	return e
}

// truthOf generates every request plainly and returns the oracle's truth.
func truthOf(t *testing.T, reqs []Request) func([]int32) []int32 {
	t.Helper()
	e := specEngine(t, 4, 0)
	rt := newRuntime(t, e, Config{})
	m := map[string][]int32{}
	for _, r := range reqs {
		h, err := rt.Submit(context.Background(), r)
		require.NoError(t, err)
		toks, _, err := h.Wait(context.Background())
		require.NoError(t, err)
		var ids []int32
		for _, tk := range toks {
			ids = append(ids, tk.ID)
		}
		m[fmt.Sprint(r.Prompt)] = ids
	}
	return func(p []int32) []int32 { return m[fmt.Sprint(p)] }
}

// recMetrics records Verified calls (and nothing else).
type recMetrics struct {
	NopMetrics
	mu                sync.Mutex
	drafted, accepted int
	spans             int
}

func (m *recMetrics) Verified(d, a int) {
	m.mu.Lock()
	m.drafted, m.accepted, m.spans = m.drafted+d, m.accepted+a, m.spans+1
	m.mu.Unlock()
}

// A stop id inside an accepted run ends the request there, as plain
// decoding does: the tokens after it are never emitted; max_tokens cuts
// the same way, and every token's index and logprob are plain decoding's.
func TestSpecStopsInsideAcceptedRun(t *testing.T) {
	V := 256
	base := []Request{{Prompt: prompt(9, 1, V), MaxTokens: 20, Sampling: sample.Greedy(), IgnoreEOS: true, TopLogprobs: 2}}
	truth := truthOf(t, base)
	full := truth(base[0].Prompt)
	stop := full[6] // a token the oracle's run accepts in the middle of a span
	req := base[0]
	req.StopIDs = []int32{stop}
	want := full[:slices.Index(full, stop)+1]
	e := specEngine(t, 2, 6)
	d, err := speculative.NewScripted("oracle", 5, speculative.Oracle(truth, nil, V))
	require.NoError(t, err)
	met := &recMetrics{}
	rt, err := New(e, Config{}, Options{Drafter: d, Metrics: met})
	require.NoError(t, err)
	defer rt.Close()
	h, err := rt.Submit(context.Background(), req)
	require.NoError(t, err)
	toks, f, err := h.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, want, ids(toks))
	require.Equal(t, FinishStop, f.Reason)
	require.Equal(t, len(want), f.CompletionTokens)
	require.Positive(t, f.Spec.Accepted)
	for i, tk := range toks {
		require.Equal(t, i, tk.Index)
		require.Len(t, tk.Top, 2)
		require.Equal(t, tk.ID, tk.Top[0].ID, "greedy: the token is its row's most likely")
		require.Equal(t, tk.Logprob, tk.Top[0].Logprob)
	}
	require.Equal(t, f.Spec.Drafted, met.drafted)
	require.Equal(t, f.Spec.Accepted, met.accepted)
	require.Equal(t, f.Spec.Steps, met.spans)
	require.Equal(t, 0, e.Store().InUse(), "the slot was freed")

	req.StopIDs, req.MaxTokens = nil, 7
	h, err = rt.Submit(context.Background(), req)
	require.NoError(t, err)
	toks, f, err = h.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, full[:7], ids(toks))
	require.Equal(t, FinishLength, f.Reason)
}

// failing is a drafter whose Propose or Observe fails on chosen calls.
type failing struct {
	speculative.Drafter
	mu                      sync.Mutex
	proposeN, observeN      int
	failPropose, failObserv int
}

func (f *failing) Propose(p []speculative.Proposal) error {
	f.mu.Lock()
	f.proposeN++
	n := f.proposeN
	f.mu.Unlock()
	if n == f.failPropose {
		return errors.New("drafter broke in Propose")
	}
	return f.Drafter.Propose(p)
}

func (f *failing) Observe(o []speculative.Observation) error {
	f.mu.Lock()
	f.observeN++
	n := f.observeN
	f.mu.Unlock()
	if n == f.failObserv {
		return errors.New("drafter broke in Observe")
	}
	return f.Drafter.Observe(o)
}

// A drafter that fails turns speculation off for the requests it was
// drafting (a warning names them) and they finish with plain decoding's
// tokens; aborting and cancelling speculating requests mid-stream frees
// their slots and drafter state; nothing leaks (goleak, -race).
func TestSpecDrafterFailureAndCancel(t *testing.T) {
	V := 256
	var reqs []Request
	for i := range 4 {
		reqs = append(reqs, Request{Prompt: prompt(5+9*i, i+2, V), MaxTokens: 18, Sampling: sample.Greedy(), IgnoreEOS: true})
	}
	truth := truthOf(t, reqs)
	for _, fail := range []struct{ propose, observe int }{{3, 0}, {0, 4}} {
		e := specEngine(t, 4, 5)
		inner, err := speculative.NewScripted("oracle", 4, speculative.Oracle(truth, speculative.WrongAt(3, 9), V))
		require.NoError(t, err)
		d := &failing{Drafter: inner, failPropose: fail.propose, failObserv: fail.observe}
		logs := &syncbuf.Buffer{}
		rt, err := New(e, Config{PrefillChunk: 8}, Options{Drafter: d, Log: zerolog.New(logs)})
		require.NoError(t, err)
		var hs []*Handle
		for _, r := range reqs {
			h, err := rt.Submit(context.Background(), r)
			require.NoError(t, err)
			hs = append(hs, h)
		}
		for i, h := range hs {
			toks, f, err := h.Wait(context.Background())
			require.NoError(t, err)
			require.Equal(t, truth(reqs[i].Prompt), ids(toks), "request %d (fail %+v)", i, fail)
			require.Equal(t, FinishLength, f.Reason)
		}
		require.Contains(t, logs.String(), "the drafter failed: speculative decoding is off for this request")
		rt.Close()
		require.Equal(t, 0, e.Store().InUse())
	}

	// abort and cancel while drafting
	e := specEngine(t, 4, 5)
	d, err := speculative.NewScripted("oracle", 4, speculative.Oracle(truth, nil, V))
	require.NoError(t, err)
	rt, err := New(e, Config{}, Options{Drafter: d})
	require.NoError(t, err)
	defer rt.Close()
	long := Request{ID: "long", Prompt: reqs[0].Prompt, MaxTokens: 3000, Sampling: sample.Greedy(), IgnoreEOS: true}
	h, err := rt.Submit(context.Background(), long)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	h2, err := rt.Submit(ctx, Request{Prompt: reqs[1].Prompt, MaxTokens: 3000, Sampling: sample.Greedy(), IgnoreEOS: true})
	require.NoError(t, err)
	_, _, err = h.Recv(context.Background())
	require.NoError(t, err)
	_, _, err = h2.Recv(context.Background())
	require.NoError(t, err)
	require.NoError(t, rt.Abort("long"))
	cancel()
	_, f, err := h.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishAbort, f.Reason)
	_, f, err = h2.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishCancelled, f.Reason)
	require.Eventually(t, func() bool { return e.Store().InUse() == 0 }, 5*time.Second, 5*time.Millisecond)
}

// A runtime refuses a drafter its store cannot roll back for.
func TestSpecNeedsRollbackDepth(t *testing.T) {
	e := specEngine(t, 2, 3)
	d, err := speculative.NewScripted("oracle", 5, func(speculative.History, int) ([]int32, []speculative.Dist) { return nil, nil })
	require.NoError(t, err)
	_, err = New(e, Config{}, Options{Drafter: d})
	require.ErrorContains(t, err, "rolls back 6 positions")
}

// Score requests share speculative steps (their rows selected per span: all
// positions or the last) and get the logits of a plain pass.
func TestSpecScoreShares(t *testing.T) {
	V := 256
	gen := Request{Prompt: prompt(6, 1, V), MaxTokens: 30, Sampling: sample.Greedy(), IgnoreEOS: true}
	truth := truthOf(t, []Request{gen})
	e := specEngine(t, 3, 4)
	d, err := speculative.NewScripted("oracle", 3, speculative.Oracle(truth, speculative.WrongAt(4), V))
	require.NoError(t, err)
	rt, err := New(e, Config{PrefillChunk: 5, MaxBatchTokens: 16}, Options{Drafter: d})
	require.NoError(t, err)
	defer rt.Close()
	toks := prompt(13, 7, V)
	ref := specEngine(t, 1, 0)
	slot, _ := ref.Store().Alloc()
	want, err := ref.Run(engine.Key{Mode: graph.Mixed, Logits: graph.AllLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: toks}}})
	require.NoError(t, err)
	g, err := rt.Submit(context.Background(), gen)
	require.NoError(t, err)
	_, _, err = g.Recv(context.Background()) // speculating by now
	require.NoError(t, err)
	for _, all := range []bool{true, false} {
		h, err := rt.Submit(context.Background(), Request{Prompt: toks, Score: true, AllPositions: all})
		require.NoError(t, err)
		_, f, err := h.Wait(context.Background())
		require.NoError(t, err)
		require.Equal(t, FinishScored, f.Reason)
		if all {
			require.Equal(t, 13, f.Rows)
			require.Less(t, maxDiff(want.Logits, f.Logits), 1e-4) // chunked prefill: KDA's chunks round differently
		} else {
			require.Equal(t, 1, f.Rows)
			require.Less(t, maxDiff(want.Row(12), f.Logits), 1e-4)
		}
	}
	gtoks, f, err := g.Wait(context.Background())
	require.NoError(t, err)
	require.Positive(t, f.Spec.Steps)
	require.Equal(t, truth(gen.Prompt)[len(truth(gen.Prompt))-len(gtoks):], ids(gtoks))
}

// Verify spans take the pages of every draft they may get: with a page
// pool too small for the requests together, speculating requests are
// preempted (their drafting stopped) and recomputed, and every output is
// still plain greedy decoding's.
func TestPreemptWhileSpeculating(t *testing.T) {
	V := 256
	var reqs []Request
	for i := range 4 {
		reqs = append(reqs, Request{Prompt: prompt(9+3*i, 10+i, V), MaxTokens: 24, Sampling: sample.Greedy(), IgnoreEOS: true})
	}
	truth := truthOf(t, reqs)
	ck, err := model.Open(fixture)
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	e, err := engine.New(ck.Config(), ck, engine.Options{Slots: 4, Rollback: 6, PageTokens: 8, Pages: 10})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	d, err := speculative.NewScripted("oracle", 5, speculative.Oracle(truth, nil, V))
	require.NoError(t, err)
	rt, err := New(e, Config{MaxBatchTokens: 32, PrefillChunk: 8}, Options{Drafter: d})
	require.NoError(t, err)
	defer rt.Close()
	var hs []*Handle
	for _, r := range reqs {
		h, err := rt.Submit(context.Background(), r)
		require.NoError(t, err)
		hs = append(hs, h)
	}
	accepted := 0
	for i, h := range hs {
		toks, f, err := h.Wait(context.Background())
		require.NoError(t, err)
		require.Equal(t, FinishLength, f.Reason, "request %d: %s", i, f.Message)
		require.Equal(t, truth(reqs[i].Prompt), ids(toks), "request %d", i)
		accepted += f.Spec.Accepted
	}
	require.Positive(t, rt.Preemptions())
	require.Positive(t, accepted, "the requests speculated")
	require.Zero(t, e.Store().(backend.PagedStore).PageStats().Used)
}
