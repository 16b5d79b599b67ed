// Package spectest is what speculative decoding's tests share across
// backends (tests/ on the CPU, tests/gpu on CUDA and its emulator): the
// rollback scenario that compares a speculative run's logits and cache
// state with a plain run's after every verify step, and greedy identity
// through the scheduler; and the store's slot copy (Store.Copy, what an
// n > 1 request's choices are forked with), which the same bitwise state
// comparison checks.
package spectest

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/cache"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/core/speculative"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/stretchr/testify/require"
)

// Plain is a greedy run one token at a time: the generated tokens, the
// logits row after each processed position, and the slot's state after
// each length.
type Plain struct {
	Prompt []int32
	Tokens []int32
	// Logits[c] is the row the target computed at position c−1, the one
	// that chose the token at position c (for c ≥ len(Prompt)).
	Logits map[int][]float32
	// States[c] is the cache after c tokens.
	States map[int]*cache.Seq
}

// PlainRun prefills prompt on a fresh slot and decodes n greedy tokens one
// at a time, recording logits and states. key is the program of the decode
// steps (prefill runs as graph.Prefill).
func PlainRun(t testing.TB, e *engine.Engine, prompt []int32, n int) *Plain {
	t.Helper()
	st := e.Store()
	sr, ok := st.(backend.StateReader)
	require.True(t, ok, "the store cannot read its state back")
	slot, err := st.Alloc()
	require.NoError(t, err)
	defer func() { require.NoError(t, st.Free(slot)) }()
	p := &Plain{Prompt: prompt, Logits: map[int][]float32{}, States: map[int]*cache.Seq{}}
	res, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: prompt}}})
	require.NoError(t, err)
	c := len(prompt)
	for i := 0; i < n; i++ {
		p.Logits[c] = res.Row(0)
		s, err := sr.ReadState(slot)
		require.NoError(t, err)
		p.States[c] = s
		tok := int32(sample.Argmax(res.Row(0)))
		p.Tokens = append(p.Tokens, tok)
		if i == n-1 {
			break
		}
		res, err = e.Run(engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: []int32{tok}}}})
		require.NoError(t, err)
		c++
	}
	return p
}

// Step is one verify step of the rollback scenario: the drafts it proposed
// and how many the target accepted.
type Step struct {
	Drafts   []int32
	Accepted int
}

// RollbackRun replays plain's generation with verify spans: at every step
// it proposes the next steps tokens of the truth, those whose generated
// index is in wrong replaced by another token, checkpoints the slot, runs
// the span (graph.Verify, one logits row per token), accepts greedily, and
// cuts the slot back. After every step it asserts that the accepted count
// is the length of the correct prefix, that every verified row equals the
// plain run's row for that position bit for bit, and that the slot's
// state equals the plain run's at the same length (KDA windows and
// states, latents, indexer pools and pending rows: bit for bit). It
// returns the steps.
func RollbackRun(t testing.TB, e *engine.Engine, plain *Plain, steps int, wrong map[int]bool) []Step {
	t.Helper()
	st := e.Store()
	sr := st.(backend.StateReader)
	vocab := int32(e.Config().VocabSize)
	slot, err := st.Alloc()
	require.NoError(t, err)
	defer func() { require.NoError(t, st.Free(slot)) }()
	_, err = e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: plain.Prompt}}})
	require.NoError(t, err)
	P := len(plain.Prompt)
	g := 1 // generated tokens (the first is pending)
	var out []Step
	key := engine.Key{Mode: graph.Verify, Logits: graph.SpanLogits}
	for g < len(plain.Tokens) {
		c := P + g - 1 // committed length; plain.Tokens[g-1] is pending
		k := min(steps, len(plain.Tokens)-g)
		drafts := make([]int32, k)
		want := -1
		for j := range drafts {
			drafts[j] = plain.Tokens[g+j]
			if wrong[g+j] {
				drafts[j] = (drafts[j] + 1) % vocab
				if want < 0 {
					want = j
				}
			}
		}
		if want < 0 {
			want = k
		}
		require.NoError(t, st.Checkpoint(slot))
		toks := append([]int32{plain.Tokens[g-1]}, drafts...)
		res, err := e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: toks, LogitRows: len(toks)}}})
		require.NoError(t, err)
		require.Equal(t, len(toks), res.Rows)
		targets := make([]int32, len(toks))
		for j := range toks {
			row := res.Row(j)
			if w, ok := plain.Logits[c+1+j]; ok && j <= want { // rows past the first wrong draft follow a context plain never saw
				requireBitEqual(t, w, row, "logits at position %d (verify row %d, step at %d)", c+j, j, c)
			}
			targets[j] = int32(sample.Argmax(row))
		}
		acc, next := speculative.AcceptGreedy(targets, drafts)
		require.Equal(t, want, acc, "accepted drafts at position %d", c)
		require.Equal(t, plain.Tokens[g+acc-1], toks[acc]) // the accepted run follows the truth
		if g+acc < len(plain.Tokens) {
			require.Equal(t, plain.Tokens[g+acc], next, "the target's token after %d accepted drafts", acc)
		}
		require.NoError(t, st.Truncate(slot, c+acc+1))
		n, err := st.Len(slot)
		require.NoError(t, err)
		require.Equal(t, c+acc+1, n)
		if want, ok := plain.States[c+acc+1]; ok {
			got, err := sr.ReadState(slot)
			require.NoError(t, err)
			RequireStateEqual(t, want, got, fmt.Sprintf("after the verify step at %d (%d of %d drafts accepted)", c, acc, k))
		}
		out = append(out, Step{Drafts: drafts, Accepted: acc})
		g += acc + 1
	}
	return out
}

// ForkRun checks Store.Copy against plain: a slot that ran the prompt and
// the first decoded tokens (after decoded of them) is copied onto a slot
// that held another, longer sequence; the copy's state equals the
// source's and the plain run's bit for bit; each slot then decodes the
// rest of plain's tokens on its own and every row equals plain's logits,
// and the copy's state plain's, bit for bit (the source is unchanged by
// the copy, the copy owns its state). Copy refuses a slot onto itself, a
// free slot and a source with an open checkpoint (when the store keeps
// rollback records).
func ForkRun(t testing.TB, e *engine.Engine, plain *Plain, decoded int) {
	t.Helper()
	st := e.Store()
	sr := st.(backend.StateReader)
	prefill := engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}
	decode := engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}
	src, err := st.Alloc()
	require.NoError(t, err)
	defer func() { require.NoError(t, st.Free(src)) }()
	dst, err := st.Alloc()
	require.NoError(t, err)
	defer func() { require.NoError(t, st.Free(dst)) }()
	// dst first holds a longer sequence of other tokens: the copy must
	// replace all of it.
	other := make([]int32, len(plain.Prompt)+decoded+5)
	for i := range other {
		other[i] = int32((i*7 + 3) % e.Config().VocabSize)
	}
	_, err = e.Run(prefill, &backend.Batch{Seqs: []backend.Seq{{Slot: dst, Tokens: other}}})
	require.NoError(t, err)
	_, err = e.Run(prefill, &backend.Batch{Seqs: []backend.Seq{{Slot: src, Tokens: plain.Prompt}}})
	require.NoError(t, err)
	c := len(plain.Prompt)
	for i := range decoded {
		_, err = e.Run(decode, &backend.Batch{Seqs: []backend.Seq{{Slot: src, Tokens: []int32{plain.Tokens[i]}}}})
		require.NoError(t, err)
		c++
	}
	require.Error(t, st.Copy(src, src), "a slot copied onto itself")
	free, err := st.Alloc()
	require.NoError(t, err)
	require.NoError(t, st.Free(free))
	require.Error(t, st.Copy(free, dst), "a free source")
	require.Error(t, st.Copy(src, free), "a free destination")
	if st.Checkpoint(src) == nil {
		require.Error(t, st.Copy(src, dst), "a source with an open checkpoint")
		require.NoError(t, st.Truncate(src, c))
	}
	require.NoError(t, st.Copy(src, dst))
	n, err := st.Len(dst)
	require.NoError(t, err)
	require.Equal(t, c, n, "the copy's length")
	a, err := sr.ReadState(src)
	require.NoError(t, err)
	b, err := sr.ReadState(dst)
	require.NoError(t, err)
	RequireStateEqual(t, a, b, "the copy against its source")
	if want, ok := plain.States[c]; ok {
		RequireStateEqual(t, want, b, fmt.Sprintf("the copy against the plain run at %d tokens", c))
	}
	for _, slot := range []int{dst, src} {
		for i := decoded; i < len(plain.Tokens)-1; i++ {
			pos := len(plain.Prompt) + i
			res, err := e.Run(decode, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: []int32{plain.Tokens[i]}}}})
			require.NoError(t, err)
			if w, ok := plain.Logits[pos+1]; ok {
				requireBitEqual(t, w, res.Row(0), "slot %d (copy %v): logits at position %d", slot, slot == dst, pos)
			}
		}
		if want, ok := plain.States[len(plain.Prompt)+len(plain.Tokens)-1]; ok {
			got, err := sr.ReadState(slot)
			require.NoError(t, err)
			RequireStateEqual(t, want, got, fmt.Sprintf("slot %d (copy %v) at the end", slot, slot == dst))
		}
	}
}

func requireBitEqual(t testing.TB, want, got []float32, format string, args ...any) {
	t.Helper()
	require.Equal(t, len(want), len(got), fmt.Sprintf(format, args...))
	for i := range want {
		if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
			require.Failf(t, "values differ", "%s: element %d is %v, want %v (bit for bit)", fmt.Sprintf(format, args...), i, got[i], want[i])
		}
	}
}

// RequireStateEqual asserts two slots' states are equal bit for bit: the
// length, every KDA layer's conv window and recurrent state, every DSA
// layer's latents, and every indexer's complete pools and pending rows.
func RequireStateEqual(t testing.TB, want, got *cache.Seq, what string) {
	t.Helper()
	require.Equal(t, want.Len, got.Len, "%s: length", what)
	for l := range want.Conv {
		requireBitEqual(t, want.Conv[l], got.Conv[l], "%s: layer %d conv window", what, l)
		requireBitEqual(t, want.State[l], got.State[l], "%s: layer %d recurrent state", what, l)
		requireBitEqual(t, want.CKV[l].Flatten(), got.CKV[l].Flatten(), "%s: layer %d latents", what, l)
		if want.Index[l] == nil {
			require.Nil(t, got.Index[l], "%s: layer %d indexer", what, l)
			continue
		}
		requireBitEqual(t, want.Index[l].Pools.Flatten(), got.Index[l].Pools.Flatten(), "%s: layer %d indexer pools", what, l)
		requireBitEqual(t, want.Index[l].PendK, got.Index[l].PendK, "%s: layer %d pending keys", what, l)
		requireBitEqual(t, want.Index[l].PendG, got.Index[l].PendG, "%s: layer %d pending gates", what, l)
	}
}

// Request is one request of a scheduler scenario.
type Request struct {
	ID        string // "" : the scheduler makes one
	Prompt    []int32
	MaxTokens int
	// Plain opts out of speculation.
	Plain    bool
	Sampling sample.Params
	StopIDs  []int32
}

// Outcome is a request's tokens and final.
type Outcome struct {
	Tokens []int32
	Final  *sched.Final
}

// Serve runs reqs at once through a scheduler on m with the given drafter
// (nil: plain decoding) and returns their outcomes in order.
func Serve(t testing.TB, m sched.Model, cfg sched.Config, d speculative.Drafter, reqs []Request) []Outcome {
	t.Helper()
	rt, err := sched.New(m, cfg, sched.Options{Drafter: d})
	require.NoError(t, err)
	defer rt.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	hs := make([]*sched.Handle, len(reqs))
	for i, r := range reqs {
		p := r.Sampling
		if p.TopP == 0 {
			p.TopP = 1
		}
		h, err := rt.Submit(ctx, sched.Request{ID: r.ID, Prompt: r.Prompt, MaxTokens: r.MaxTokens, Sampling: p, IgnoreEOS: true, StopIDs: r.StopIDs, NoSpeculation: r.Plain})
		require.NoError(t, err)
		hs[i] = h
	}
	out := make([]Outcome, len(reqs))
	for i, h := range hs {
		toks, f, err := h.Wait(ctx)
		require.NoError(t, err)
		require.NotEqual(t, sched.FinishError, f.Reason, "request %d failed: %s", i, f.Message)
		for _, tk := range toks {
			out[i].Tokens = append(out[i].Tokens, tk.ID)
		}
		out[i].Final = f
	}
	return out
}

// Truth runs reqs plainly and returns a function giving each prompt's
// generated tokens: the Oracle drafter's truth.
func Truth(outs []Outcome, reqs []Request) func(prompt []int32) []int32 {
	m := map[string][]int32{}
	for i, r := range reqs {
		m[fmt.Sprint(r.Prompt)] = outs[i].Tokens
	}
	return func(p []int32) []int32 { return m[fmt.Sprint(p)] }
}

// RequireSameTokens asserts that two runs produced the same tokens for
// every request.
func RequireSameTokens(t testing.TB, want, got []Outcome, what string) {
	t.Helper()
	for i := range want {
		require.True(t, slices.Equal(want[i].Tokens, got[i].Tokens), "%s: request %d: speculative tokens %v differ from plain %v", what, i, got[i].Tokens, want[i].Tokens)
		require.Equal(t, want[i].Final.Reason, got[i].Final.Reason, "%s: request %d finish reason", what, i)
	}
}

// DFlashDrafter writes the random drafter of a -dflash preset (e.g.
// tiny-dflash) for the trunk cfg and opens it; it is closed at the test's
// end.
func DFlashDrafter(t testing.TB, preset string, cfg *model.Config, seed int64) *model.DFlashCheckpoint {
	t.Helper()
	d, err := randckpt.DFlashPreset(preset, cfg)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, randckpt.WriteDFlash(dir, d, randckpt.Options{Seed: seed}))
	dk, err := model.OpenDFlash(dir, model.OpenOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { dk.Close() })
	return dk
}
