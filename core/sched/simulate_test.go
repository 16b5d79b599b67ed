package sched

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/speculative"
	"github.com/glmflash/glmflash/internal/syncbuf"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// constDrafts is a script that always drafts as many copies of one token
// as it may: without simulation the target accepts (almost) none of them.
func constDrafts(tok int32) speculative.ScriptFunc {
	return func(_ speculative.History, max int) ([]int32, []speculative.Dist) {
		d := make([]int32, max)
		for i := range d {
			d[i] = tok
		}
		return d, nil
	}
}

// Simulated acceptance pins each verify span's acceptance at the per-draft
// rate whatever the target says: drafts the target never picks are
// accepted by a seeded chain, whose per-draft rate over every span
// (accepted ÷ (accepted + spans ended by a rejection), counted by a Timed
// drafter from what the scheduler committed: every span but a request's
// last) is within four binomial
// standard deviations of the setting, for greedy and sampled requests. A
// greedy token the target's row chose (at a rejection or the bonus) is the
// target's greedy token after the output before it, as plain decoding of
// that text gives. The accepted drafts are emitted as drafted (a forced draft's logprob, which
// the device's pick did not compute, is NaN), every request's Final and
// its request-finished log line say the acceptance was simulated, and the
// metrics count the spans. Requests that never verified say nothing.
func TestSimulatedAcceptance(t *testing.T) {
	V := 256
	const rate, drafted = 0.7, int32(7)
	for _, temp := range []float64{0, 0.8} {
		e := specEngine(t, 4, 4)
		sc, err := speculative.NewScripted("const", 3, constDrafts(drafted))
		require.NoError(t, err)
		d := speculative.NewTimed(sc, nil)
		logs := &syncbuf.Buffer{}
		met := &recMetrics{}
		rt, err := New(e, Config{}, Options{Drafter: d, Metrics: met, Log: zerolog.New(logs), SimulateAcceptance: rate})
		require.NoError(t, err)
		var hs []*Handle
		for i := range 4 {
			p := sample.Greedy()
			p.Temperature, p.TopK, p.Seed = temp, 8, uint64(i)+uint64(100*temp) // other chains for the sampled requests
			h, err := rt.Submit(context.Background(), Request{Prompt: prompt(6, i+1, V), MaxTokens: 120, Sampling: p, IgnoreEOS: true})
			require.NoError(t, err)
			hs = append(hs, h)
		}
		var spec speculative.Stats
		nan, forced := 0, 0
		var first []Token
		for i, h := range hs {
			toks, f, err := h.Wait(context.Background())
			require.NoError(t, err)
			require.Equal(t, FinishLength, f.Reason)
			require.Equal(t, rate, f.SimulatedAcceptance)
			spec = spec.Add(f.Spec)
			if i == 0 {
				first = toks
			}
			for _, tk := range toks {
				if math.IsNaN(float64(tk.Logprob)) {
					nan++
					require.Equal(t, drafted, tk.ID, "only a forced draft has no logprob")
				}
				if tk.ID == drafted {
					forced++
				}
			}
		}
		rt.Close()
		if temp == 0 { // every token a row picked is the target's greedy token after the output before it
			plain := newRuntime(t, e, Config{})
			p0, checked := prompt(6, 1, V), 0
			for i, tk := range first {
				if math.IsNaN(float64(tk.Logprob)) {
					continue
				}
				var ctx []int32
				for _, x := range first[:i] {
					ctx = append(ctx, x.ID)
				}
				h, err := plain.Submit(context.Background(), Request{Prompt: append(append([]int32(nil), p0...), ctx...), MaxTokens: 1, Sampling: sample.Greedy(), IgnoreEOS: true})
				require.NoError(t, err)
				toks, _, err := h.Wait(context.Background())
				require.NoError(t, err)
				require.Equal(t, toks[0].ID, tk.ID, "token %d", i)
				checked++
			}
			require.Greater(t, checked, 20)
		}
		tm := d.Time()
		require.LessOrEqual(t, spec.Steps-tm.Spans, 4, "a request's last span, when it ends the request, is not observed")
		require.LessOrEqual(t, tm.Accepted, spec.Accepted)
		n := float64(tm.Accepted + tm.Rejected)
		require.Greater(t, n, 350.0)
		t.Logf("temperature %v: per-draft rate %.4f over %v decisions (setting %v, 4σ %.4f)", temp, tm.ChainRate(), n, rate, 4*math.Sqrt(rate*(1-rate)/n))
		require.InDelta(t, rate, tm.ChainRate(), 4*math.Sqrt(rate*(1-rate)/n), "temperature %v: %v decisions", temp, n)
		require.GreaterOrEqual(t, forced, spec.Accepted, "every accepted draft is emitted as drafted")
		if temp == 0 {
			require.Positive(t, nan, "forced drafts on greedy rows the picks did not choose")
		}
		require.Equal(t, spec.Drafted, met.drafted)
		require.Equal(t, spec.Accepted, met.accepted)
		require.Equal(t, 4, strings.Count(logs.String(), `"spec_simulated_acceptance":0.7`), logs.String())
	}
}

// The same spans decide the same way whatever the batching: the chain is a
// function of the request's seed, prompt and token index.
func TestSimulatedAcceptanceIgnoresBatching(t *testing.T) {
	V := 256
	run := func(n int) [][]int32 {
		e := specEngine(t, 4, 4)
		d, err := speculative.NewScripted("const", 3, constDrafts(7))
		require.NoError(t, err)
		rt, err := New(e, Config{}, Options{Drafter: d, SimulateAcceptance: 0.5})
		require.NoError(t, err)
		defer rt.Close()
		var hs []*Handle
		for i := range n {
			h, err := rt.Submit(context.Background(), Request{Prompt: prompt(5, i+1, V), MaxTokens: 24, Sampling: sample.Greedy(), IgnoreEOS: true})
			require.NoError(t, err)
			hs = append(hs, h)
		}
		var out [][]int32
		for _, h := range hs {
			toks, _, err := h.Wait(context.Background())
			require.NoError(t, err)
			out = append(out, ids(toks))
		}
		return out
	}
	require.Equal(t, run(1)[0], run(3)[0])
}

// Simulated acceptance is a rate in (0, 1] with a drafter, refused
// otherwise.
func TestSimulatedAcceptanceRefused(t *testing.T) {
	e := specEngine(t, 2, 4)
	d, err := speculative.NewScripted("const", 3, constDrafts(7))
	require.NoError(t, err)
	for _, v := range []float64{-0.1, 1.5, math.NaN(), math.Inf(1)} {
		_, err := New(e, Config{}, Options{Drafter: d, SimulateAcceptance: v})
		require.ErrorContains(t, err, "simulated acceptance must be a per-draft rate in (0, 1]", v)
	}
	_, err = New(e, Config{}, Options{SimulateAcceptance: 0.5})
	require.ErrorContains(t, err, "with a drafter")
}
