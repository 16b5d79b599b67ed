package sched

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/speculative"
	"github.com/stretchr/testify/require"
)

// editsFromScratch is a request's edits for its next row computed from
// nothing but the request and its output so far, the way the fields are
// defined (vLLM's order: repetition penalty over prompt and output,
// frequency and presence over the output, logit bias; min_tokens bans the
// end ids while fewer tokens were generated).
func editsFromScratch(req Request, ends, out []int32) []sample.Edit {
	p := req.Processing
	rep := p.RepetitionPenalty
	if rep == 0 {
		rep = 1
	}
	counts := map[int32]int{}
	for _, t := range out {
		counts[t]++
	}
	touched := map[int32]bool{}
	inPrompt := map[int32]bool{}
	if rep != 1 {
		for _, t := range req.Prompt {
			touched[t], inPrompt[t] = true, true
		}
	}
	if rep != 1 || p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
		for t := range counts {
			touched[t] = true
		}
	}
	for t, b := range p.LogitBias {
		if b != 0 {
			touched[t] = true
		}
	}
	banned := map[int32]bool{}
	if len(out) < req.MinTokens {
		for _, t := range ends {
			touched[t], banned[t] = true, true
		}
	}
	var edits []sample.Edit
	for t := range touched {
		e := sample.Edit{Token: t, Penalty: 1}
		if rep != 1 && (inPrompt[t] || counts[t] > 0) {
			e.Penalty = float32(rep)
		}
		add := p.LogitBias[t] - p.FrequencyPenalty*float64(counts[t])
		if counts[t] > 0 {
			add -= p.PresencePenalty
		}
		e.Add = float32(add)
		if banned[t] {
			e.Add = float32(math.Inf(-1))
		}
		edits = append(edits, e)
	}
	slices.SortFunc(edits, func(a, b sample.Edit) int { return int(a.Token) - int(b.Token) })
	return edits
}

// The scheduler's edits, kept token by token, are at every step the edits
// computed from scratch: sorted, unique, the ban lifted exactly when
// min_tokens were generated, each field alone and all together.
func TestProcessingEditsAreIncremental(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const V = 64
	cases := []Request{
		{Processing: sample.Processing{RepetitionPenalty: 1.5}},
		{Processing: sample.Processing{RepetitionPenalty: 0.7}},
		{Processing: sample.Processing{PresencePenalty: 0.5}},
		{Processing: sample.Processing{FrequencyPenalty: -0.25}},
		{Processing: sample.Processing{LogitBias: map[int32]float64{3: 5, 40: -100, 7: 0}}},
		{MinTokens: 5},
		{MinTokens: 1, StopIDs: []int32{9}},
		{
			Processing: sample.Processing{RepetitionPenalty: 1.2, PresencePenalty: 0.3, FrequencyPenalty: 0.2, LogitBias: map[int32]float64{2: 1, 5: -2, 9: 3}},
			MinTokens:  7, StopIDs: []int32{5, 9, 11},
		},
	}
	for ci, req := range cases {
		for trial := range 5 {
			req.Prompt = make([]int32, 1+rng.IntN(20))
			for i := range req.Prompt {
				req.Prompt[i] = int32(rng.IntN(V / 2)) // repeats, and tokens the output will meet
			}
			ends := append([]int32{1, 63}, req.StopIDs...) // 1 and 63 stand for the EOS ids
			slices.Sort(ends)
			ends = slices.Compact(ends)
			pr := newProcs(&req, ends)
			require.NotNil(t, pr, "case %d", ci)
			var out []int32
			for step := 0; step < 30; step++ {
				want := editsFromScratch(req, ends, out)
				got := pr.Edits()
				if len(want) == 0 {
					require.Nil(t, got, "case %d trial %d step %d", ci, trial, step)
				} else {
					require.Equal(t, want, got, "case %d trial %d step %d", ci, trial, step)
				}
				tok := int32(rng.IntN(V))
				out = append(out, tok)
				pr.observe(tok, len(out))
			}
		}
	}
	require.Nil(t, newProcs(&Request{Prompt: []int32{1}}, []int32{1}), "nothing set: no state")
	require.Nil(t, newProcs(&Request{Prompt: []int32{1}, Processing: sample.Processing{RepetitionPenalty: 1}}, nil), "a penalty of 1 is off")
	pr := newProcs(&Request{Prompt: []int32{1}, Processing: sample.Processing{LogitBias: map[int32]float64{4: 0}}}, nil)
	require.Nil(t, pr.Edits(), "a zero bias edits nothing")
}

// Validate refuses each field out of range with the field's name (as the
// OpenAI API spells it), and accepts the bounds.
func TestProcessingValidation(t *testing.T) {
	e := openEngine(t, 1)
	rt := newRuntime(t, e, Config{})
	base := Request{Prompt: prompt(5, 1, 256), MaxTokens: 8, Sampling: sample.Greedy()}
	ok := base
	ok.Processing = sample.Processing{RepetitionPenalty: 100, PresencePenalty: 2, FrequencyPenalty: -2, LogitBias: map[int32]float64{0: 100, 255: -100}}
	ok.MinTokens = 8
	require.NoError(t, rt.Validate(&ok))
	every := make([]int32, 256)
	for i := range every {
		every[i] = int32(i)
	}
	for _, c := range []struct {
		edit  func(*Request)
		field string
	}{
		{func(r *Request) { r.Processing.RepetitionPenalty = -0.5 }, "repetition_penalty"},
		{func(r *Request) { r.Processing.RepetitionPenalty = math.Inf(1) }, "repetition_penalty"},
		{func(r *Request) { r.Processing.PresencePenalty = 2.01 }, "presence_penalty"},
		{func(r *Request) { r.Processing.FrequencyPenalty = math.NaN() }, "frequency_penalty"},
		{func(r *Request) { r.Processing.LogitBias = map[int32]float64{256: 1} }, "logit_bias"},
		{func(r *Request) { r.Processing.LogitBias = map[int32]float64{3: -101} }, "logit_bias[3]"},
		{func(r *Request) { r.MinTokens = -1 }, "min_tokens"},
		{func(r *Request) { r.MinTokens = 9 }, "min_tokens"},
		{func(r *Request) { r.MinTokens, r.StopIDs = 1, every }, "min_tokens"},
	} {
		req := base
		c.edit(&req)
		err := rt.Validate(&req)
		var ie *InvalidError
		require.True(t, errors.As(err, &ie), "%s: %v", c.field, err)
		require.Equal(t, c.field, ie.Field, "%v", err)
		require.NotContains(t, ie.Msg, "not implemented")
		_, err = rt.Submit(context.Background(), req)
		require.Error(t, err)
	}
	// Every id a stop id is fine without min_tokens (the first token ends
	// the request).
	req := base
	req.StopIDs = every
	require.NoError(t, rt.Validate(&req))
}

// handRow processes a raw logits row by hand, in float64, from the
// request and its output so far (ends: its end ids).
func handRow(raw []float32, req Request, ends, out []int32) []float64 {
	p := req.Processing
	counts := map[int32]int{}
	for _, t := range out {
		counts[t]++
	}
	seen := map[int32]bool{}
	for _, t := range req.Prompt {
		seen[t] = true
	}
	for _, t := range out {
		seen[t] = true
	}
	row := make([]float64, len(raw))
	for i, l := range raw {
		t, v := int32(i), float64(l)
		if r := p.RepetitionPenalty; r != 0 && seen[t] {
			if v > 0 {
				v /= r
			} else {
				v *= r
			}
		}
		v -= p.FrequencyPenalty * float64(counts[t])
		if counts[t] > 0 {
			v -= p.PresencePenalty
		}
		v += p.LogitBias[t]
		if len(out) < req.MinTokens && slices.Contains(ends, t) {
			v = math.Inf(-1)
		}
		row[i] = v
	}
	return row
}

// handRun generates req alone on a fresh single-slot engine, each row
// processed by hand (handRow) and picked as the sampler does (greedy: the
// argmax; else Pick with the request's draws), and returns the tokens with
// their log-probabilities under the processed row.
func handRun(t *testing.T, e *engine.Engine, req Request, ends []int32) ([]int32, []float64) {
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
	var lps []float64
	for {
		row := handRow(res.Row(0), req, ends, out)
		var tok int32
		if req.Sampling.Temperature == 0 {
			tok = int32(slices.Index(row, slices.Max(row)))
		} else {
			r32 := make([]float32, len(row))
			for i, v := range row {
				r32[i] = float32(max(v, sample.Banned))
			}
			tok = int32(sample.Pick(r32, s.Params(), s.Draw()))
		}
		mx := slices.Max(row)
		var sum float64
		for _, v := range row {
			sum += math.Exp(v - mx)
		}
		out = append(out, tok)
		lps = append(lps, row[tok]-mx-math.Log(sum))
		if slices.Contains(ends, tok) || len(out) == req.MaxTokens {
			return out, lps
		}
		res, err = ref.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: []int32{tok}}}})
		require.NoError(t, err)
	}
}

// Requests with every processor, batched together (their edits must not
// mix) and chunked, get exactly the tokens of a hand computation from the
// raw logits, and their reported log-probabilities are the processed
// row's: greedy and sampled, with min_tokens holding the stop ids off.
func TestProcessingMatchesHandComputation(t *testing.T) {
	e := openEngine(t, 4)
	const V = 256
	plain := Request{Prompt: prompt(11, 3, V), MaxTokens: 14, Sampling: sample.Greedy()}
	free := alone(t, e, plain)
	reqs := []Request{
		{ // a stop id the model emits early, held off by min_tokens
			Prompt: plain.Prompt, MaxTokens: 14, Sampling: sample.Greedy(), TopLogprobs: 3,
			Processing: sample.Processing{RepetitionPenalty: 1.4, PresencePenalty: 0.6, FrequencyPenalty: 0.4, LogitBias: map[int32]float64{free[2]: 1.5, 17: -3}},
			MinTokens:  4, StopIDs: []int32{free[0], free[1]},
		},
		{
			Prompt: prompt(23, 5, V), MaxTokens: 12, Sampling: sample.Params{Temperature: 0.8, TopP: 0.95, TopK: 40, Seed: 11},
			Processing: sample.Processing{RepetitionPenalty: 0.6, FrequencyPenalty: -0.8},
		},
		{
			Prompt: prompt(4, 7, V), MaxTokens: 10, Sampling: sample.Params{Temperature: 1.2, TopP: 1, Seed: 3},
			Processing: sample.Processing{PresencePenalty: 1.5, LogitBias: map[int32]float64{5: 2, 6: 2, 200: -2}}, MinTokens: 10,
		},
		{Prompt: prompt(9, 9, V), MaxTokens: 9, Sampling: sample.Greedy(), Processing: sample.Processing{RepetitionPenalty: 3}},
	}
	rt := newRuntime(t, e, Config{MaxBatchTokens: 16, PrefillChunk: 5})
	got := make([][]Token, len(reqs))
	var wg sync.WaitGroup
	for i, req := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := rt.Submit(context.Background(), req)
			if err != nil {
				t.Error(err)
				return
			}
			got[i], _, err = h.Wait(context.Background())
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for i, req := range reqs {
		want, lps := handRun(t, e, req, rt.endIDsIn(&req))
		require.Equal(t, want, ids(got[i]), "request %d", i)
		for j, tk := range got[i] {
			require.InDelta(t, lps[j], float64(tk.Logprob), 1e-4, "request %d token %d: the processed row's log-probability", i, j)
		}
	}
	// The first request's stop ids came out at once without min_tokens:
	// the test holds something off.
	require.NotContains(t, ids(got[0])[:4], free[0])
	require.NotContains(t, ids(got[0])[:4], free[1])
	require.Len(t, got[2], 10)
	for _, tk := range got[0] {
		require.Equal(t, tk.ID, tk.Top[0].ID, "greedy: the pick is the processed row's most likely")
	}
}

// run submits req and waits for it.
func run(t *testing.T, rt *Scheduler, req Request) ([]int32, *Final) {
	t.Helper()
	h, err := rt.Submit(context.Background(), req)
	require.NoError(t, err)
	toks, f, err := h.Wait(context.Background())
	require.NoError(t, err)
	return ids(toks), f
}

// logit_bias +100 forces a token, whatever the draw; −100 bans one: the
// token unbiased sampling draws most often never comes out.
func TestLogitBiasForcesAndBans(t *testing.T) {
	e := openEngine(t, 2)
	rt := newRuntime(t, e, Config{})
	const V = 256
	for seed := range uint64(6) {
		req := Request{Prompt: prompt(6, int(seed), V), MaxTokens: 8, Sampling: sample.Params{Temperature: 1, TopP: 1, Seed: seed}}
		req.Processing.LogitBias = map[int32]float64{42: 100}
		toks, _ := run(t, rt, req)
		require.Equal(t, slices.Repeat([]int32{42}, 8), toks, "seed %d", seed)
	}
	freq := map[int32]int{}
	var reqs []Request
	for seed := range uint64(12) {
		req := Request{Prompt: prompt(6, 1, V), MaxTokens: 12, Sampling: sample.Params{Temperature: 1, TopP: 1, Seed: seed}}
		reqs = append(reqs, req)
		toks, _ := run(t, rt, req)
		for _, tk := range toks {
			freq[tk]++
		}
	}
	var top int32
	for tk, n := range freq {
		if n > freq[top] || (n == freq[top] && tk < top) {
			top = tk
		}
	}
	require.GreaterOrEqual(t, freq[top], 3, "the unbiased runs draw the token several times")
	for _, req := range reqs {
		req.Processing.LogitBias = map[int32]float64{top: -100}
		toks, _ := run(t, rt, req)
		require.NotContains(t, toks, top)
	}
	greedy := Request{Prompt: prompt(6, 1, V), MaxTokens: 12, Sampling: sample.Greedy()}
	toks, _ := run(t, rt, greedy)
	greedy.Processing.LogitBias = map[int32]float64{toks[0]: -100}
	banned, _ := run(t, rt, greedy)
	require.NotContains(t, banned, toks[0])
}

// min_tokens holds the model's EOS and the stop ids off: an EOS id forced
// by a bias comes out exactly at position min_tokens, not before; without
// min_tokens it ends the request at once. With IgnoreEOS only the stop ids
// are held off.
func TestMinTokensHoldsEndIDsOff(t *testing.T) {
	e := openEngine(t, 2)
	const eos = 200
	cfg := e.Config().Clone()
	cfg.EOSTokenIDs = []int{eos}
	rt := newRuntime(t, eosModel{Engine: e, cfg: cfg}, Config{})
	base := Request{Prompt: prompt(8, 2, 256), MaxTokens: 20, Sampling: sample.Params{Temperature: 1, TopP: 1, Seed: 9}}
	base.Processing.LogitBias = map[int32]float64{eos: 100}

	toks, f := run(t, rt, base)
	require.Equal(t, []int32{eos}, toks)
	require.Equal(t, FinishStop, f.Reason)

	for _, min := range []int{1, 4, 19} {
		req := base
		req.MinTokens = min
		toks, f = run(t, rt, req)
		require.Len(t, toks, min+1, "min_tokens %d", min)
		require.NotContains(t, toks[:min], int32(eos))
		require.Equal(t, int32(eos), toks[min])
		require.Equal(t, FinishStop, f.Reason)
	}
	// A stop id the same way, beside the EOS.
	req := base
	req.Processing.LogitBias = map[int32]float64{eos: 100, 77: 100}
	req.StopIDs, req.MinTokens = []int32{77}, 6
	toks, _ = run(t, rt, req)
	require.Len(t, toks, 7)
	for _, tk := range toks[:6] {
		require.NotContains(t, []int32{eos, 77}, tk)
	}
	// min_tokens = max_tokens: the end ids never come out.
	req.MaxTokens, req.MinTokens = 6, 6
	toks, f = run(t, rt, req)
	require.Len(t, toks, 6)
	require.Equal(t, FinishLength, f.Reason)
	// IgnoreEOS: the EOS is an ordinary token, drawn at once.
	req = base
	req.IgnoreEOS, req.MinTokens, req.MaxTokens = true, 3, 3
	toks, _ = run(t, rt, req)
	require.Equal(t, []int32{eos, eos, eos}, toks)
}

// Repetition penalty 100 never repeats a token under greedy decoding
// (neither the prompt's nor its own), where the same prompts without it
// repeat.
func TestRepetitionPenaltyNeverRepeats(t *testing.T) {
	e := openEngine(t, 2)
	rt := newRuntime(t, e, Config{})
	repeats := 0
	for s := range 6 {
		req := Request{Prompt: prompt(5, s, 256), MaxTokens: 40, Sampling: sample.Greedy()}
		toks, _ := run(t, rt, req)
		all := append(distinct(req.Prompt), toks...)
		repeats += len(all) - len(distinct(all))
		req.Processing.RepetitionPenalty = 100
		toks, _ = run(t, rt, req)
		require.Len(t, toks, 40)
		all = append(distinct(req.Prompt), toks...)
		require.Len(t, distinct(all), len(all), "prompt %d: %v", s, toks)
	}
	require.Positive(t, repeats, "without the penalty greedy decoding repeats")
}

func distinct(x []int32) []int32 {
	y := slices.Clone(x)
	slices.Sort(y)
	return slices.Compact(y)
}

// repeatRate is the share of generated tokens that repeat an earlier
// token of their output, over many seeds.
func repeatRate(t *testing.T, rt *Scheduler, p sample.Processing) float64 {
	t.Helper()
	rep, n := 0, 0
	for seed := range uint64(16) {
		req := Request{Prompt: prompt(4, int(seed%4), 256), MaxTokens: 24, Sampling: sample.Params{Temperature: 0.4, TopP: 1, Seed: 1000 + seed}, Processing: p}
		toks, _ := run(t, rt, req)
		seen := map[int32]bool{}
		for _, tk := range toks {
			if seen[tk] {
				rep++
			}
			seen[tk] = true
			n++
		}
	}
	return float64(rep) / float64(n)
}

// Presence and frequency penalties lower the rate at which sampled output
// repeats itself, negative ones raise it (over 16 seeds × 24 tokens).
func TestPresenceAndFrequencyLowerRepeats(t *testing.T) {
	e := openEngine(t, 2)
	rt := newRuntime(t, e, Config{})
	base := repeatRate(t, rt, sample.Processing{})
	presence := repeatRate(t, rt, sample.Processing{PresencePenalty: 2})
	frequency := repeatRate(t, rt, sample.Processing{FrequencyPenalty: 2})
	more := repeatRate(t, rt, sample.Processing{PresencePenalty: -2, FrequencyPenalty: -1})
	t.Logf("repeat rate: none %.3f, presence 2 %.3f, frequency 2 %.3f, both negative %.3f", base, presence, frequency, more)
	require.Greater(t, base, 0.05, "unpenalized sampling repeats (the draws are seeded: the rates are reproducible)")
	require.Less(t, presence, base/2)
	require.Less(t, frequency, base/2)
	require.Greater(t, more, base*1.5)
}

// Nothing set, or set to its off value (repetition penalty 1, zero
// biases), changes nothing: the tokens and log-probabilities of plain
// decoding, greedy and sampled.
func TestProcessingOffIsIdentity(t *testing.T) {
	e := openEngine(t, 2)
	rt := newRuntime(t, e, Config{})
	for _, sp := range []sample.Params{sample.Greedy(), {Temperature: 0.9, TopP: 0.9, Seed: 4}} {
		req := Request{Prompt: prompt(7, 4, 256), MaxTokens: 10, Sampling: sp, TopLogprobs: 2}
		want := alone(t, e, req)
		h, err := rt.Submit(context.Background(), req)
		require.NoError(t, err)
		plain, _, err := h.Wait(context.Background())
		require.NoError(t, err)
		require.Equal(t, want, ids(plain))
		for _, p := range []sample.Processing{{RepetitionPenalty: 1}, {LogitBias: map[int32]float64{want[0]: 0, 3: 0}}} {
			req.Processing = p
			h, err := rt.Submit(context.Background(), req)
			require.NoError(t, err)
			got, _, err := h.Wait(context.Background())
			require.NoError(t, err)
			require.Equal(t, plain, got, "%+v", p)
		}
	}
}

// Processed requests decode plainly when the runtime speculates (say, a
// min_tokens request's drafts would be verified against unprocessed
// rows): they get no verify span, and their tokens are plain decoding's,
// while an unprocessed request beside them speculates.
func TestProcessedRequestsNeverSpeculate(t *testing.T) {
	const V = 256
	plain := Request{Prompt: prompt(9, 1, V), MaxTokens: 16, Sampling: sample.Greedy(), IgnoreEOS: true}
	pen := plain
	pen.Prompt = prompt(9, 2, V)
	pen.Processing.RepetitionPenalty = 2
	minT := plain
	minT.Prompt = prompt(9, 3, V)
	minT.MinTokens, minT.StopIDs = 3, []int32{5}
	truth := truthOf(t, []Request{plain, pen, minT})

	e := specEngine(t, 3, 6)
	d, err := speculative.NewScripted("oracle", 5, speculative.Oracle(truth, nil, V))
	require.NoError(t, err)
	rt, err := New(e, Config{}, Options{Drafter: d})
	require.NoError(t, err)
	defer rt.Close()
	for _, req := range []Request{plain, pen, minT} {
		toks, f := run(t, rt, req)
		require.Equal(t, truth(req.Prompt), toks)
		if req.Processing.Active() || req.MinTokens > 0 {
			require.Zero(t, f.Spec.Steps, "a processed request never speculates")
		} else {
			require.Positive(t, f.Spec.Steps, "the unprocessed one does")
		}
	}
}

// The host cost of a processed request per generated token: one observe
// (its entry updated, or inserted) and the next row's edits, with a 2,048-
// token prompt under every penalty, 64 biases and min_tokens, on the
// released vocabulary; and, beside it, what the host sampler then spends
// applying those edits to a row (a copy of the row and the edits).
func BenchmarkProcessingPerToken(b *testing.B) {
	const V = 154880
	rng := rand.New(rand.NewPCG(3, 4))
	req := Request{Prompt: make([]int32, 2048), MaxTokens: 4096, MinTokens: 16, StopIDs: []int32{1, 2, 3},
		Processing: sample.Processing{RepetitionPenalty: 1.1, PresencePenalty: 0.5, FrequencyPenalty: 0.5, LogitBias: map[int32]float64{}}}
	for i := range req.Prompt {
		req.Prompt[i] = int32(rng.IntN(V))
	}
	for range 64 {
		req.Processing.LogitBias[int32(rng.IntN(V))] = 1
	}
	toks := make([]int32, 4096)
	for i := range toks {
		toks[i] = int32(rng.IntN(V / 8)) // repeats, as text has
	}
	b.Run("observe+edits", func(b *testing.B) {
		pr := newProcs(&req, []int32{1, 2, 3, 4})
		n := 0
		for b.Loop() {
			if n == len(toks) {
				b.StopTimer()
				pr, n = newProcs(&req, []int32{1, 2, 3, 4}), 0
				b.StartTimer()
			}
			n++
			pr.observe(toks[n-1], n)
			_ = pr.Edits()
		}
	})
	b.Run("apply", func(b *testing.B) {
		pr := newProcs(&req, []int32{1, 2, 3, 4})
		for i, t := range toks[:1024] {
			pr.observe(t, i+1)
		}
		raw := make([]float32, V)
		for i := range raw {
			raw[i] = rng.Float32()
		}
		row := make([]float32, V)
		b.ReportMetric(float64(len(pr.Edits())), "edits")
		for b.Loop() {
			copy(row, raw)
			sample.Apply(row, pr.Edits(), nil)
		}
	})
}
