package tests

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/core/speculative"
	"github.com/glmflash/glmflash/core/speculative/spectest"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/stretchr/testify/require"
)

// Rollback exercised for real: a verify span whose drafts are the plain
// run's greedy tokens with wrong ones injected at chosen positions accepts
// exactly the correct prefix, its rows equal plain decoding's logits bit
// for bit, and after the cut-back the slot's KDA windows and states,
// latents and indexer pools and pending rows equal the plain run's at the
// same length, bit for bit, after every step. The wrong positions make
// spans reject at their first draft, in the middle and never, so that
// truncation crosses pool boundaries (pools completed by rejected tokens
// are reopened) on every fixture's kpool.
func TestVerifyRollbackMatchesPlainRun(t *testing.T) {
	wrong := map[int]bool{1: true, 4: true, 5: true, 9: true, 16: true, 18: true, 19: true, 20: true, 27: true}
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			ck, _ := openFixture(t, name)
			for _, steps := range []int{1, 3, 5} {
				e := newEngine(t, ck, engine.Options{Slots: 2, Rollback: steps + 1})
				V := ck.Config().VocabSize
				plain := spectest.PlainRun(t, e, seqTokens(13, 3, V), 32)
				run := spectest.RollbackRun(t, e, plain, steps, wrong)
				acc, drafted := 0, 0
				for _, s := range run {
					acc += s.Accepted
					drafted += len(s.Drafts)
				}
				require.Greater(t, acc, 0)
				require.Less(t, acc, drafted, "some drafts must be rejected")
			}
		})
	}
}

// specRequests is a mix for the scheduler scenarios: prompts longer than
// the prefill chunk (chunked prefill runs beside verify spans), short ones,
// one request that opts out of speculation, and one with a stop id.
func specRequests(V int) []spectest.Request {
	return []spectest.Request{
		{Prompt: seqTokens(45, 1, V), MaxTokens: 24},
		{Prompt: seqTokens(6, 2, V), MaxTokens: 31},
		{Prompt: seqTokens(19, 3, V), MaxTokens: 17, Plain: true},
		{Prompt: seqTokens(70, 4, V), MaxTokens: 20},
		{Prompt: seqTokens(3, 5, V), MaxTokens: 1},
		{Prompt: seqTokens(11, 6, V), MaxTokens: 26},
	}
}

// Greedy identity with the test drafter on the three transformers
// fixtures: speculation on (the truth with wrong drafts at a 60% per-draft
// acceptance rate, 1 and 5 steps) gives every request exactly the tokens of
// plain decoding, in batches that mix verify spans with plain decode
// tokens, a plain request and chunked prefill.
func TestSpecGreedyIdentityOracle(t *testing.T) {
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			ck, _ := openFixture(t, name)
			V := ck.Config().VocabSize
			reqs := specRequests(V)
			cfg := sched.Config{PrefillChunk: 16, MaxBatchTokens: 64}
			plainEng := newEngine(t, ck, engine.Options{Slots: 4})
			plain := spectest.Serve(t, plainEng, cfg, nil, reqs)
			for _, steps := range []int{1, 5} {
				e := newEngine(t, ck, engine.Options{Slots: 4, Rollback: steps + 1})
				d, err := speculative.NewScripted("oracle", steps, speculative.Oracle(spectest.Truth(plain, reqs), speculative.WrongRate(0.6, 7), V))
				require.NoError(t, err)
				got := spectest.Serve(t, e, cfg, d, reqs)
				spectest.RequireSameTokens(t, plain, got, fmt.Sprintf("%d steps", steps))
				var st speculative.Stats
				for i, o := range got {
					if reqs[i].Plain {
						require.Zero(t, o.Final.Spec.Steps, "a plain request is not speculated")
					}
					st = st.Add(o.Final.Spec)
				}
				require.Greater(t, st.Accepted, 0)
				require.Less(t, st.Accepted, st.Drafted)
				t.Logf("%d steps: %d verify steps, %d drafts, %d accepted, acceptance length %.2f", steps, st.Steps, st.Drafted, st.Accepted, st.AcceptanceLength())
			}
		})
	}
}

// mtpPreset writes a random preset with an MTP layer.
func mtpPreset(t *testing.T, name string) *model.Checkpoint {
	t.Helper()
	cfg, err := randckpt.Preset(name)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, randckpt.Write(dir, cfg, randckpt.Options{Seed: 3}))
	ck, err := model.Open(dir)
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	return ck
}

// Greedy identity with the MTP drafter: on the transformers MTP fixture's
// checkpoint and on the random tiny-mtp and small-mtp presets, 5-1-6 and
// 1-1-2 (and index sharing on and off), every request gets exactly the
// tokens of plain decoding in mixed batches with chunked prefill and a plain
// request. Random weights accept few MTP drafts; the counts are logged.
func TestSpecGreedyIdentityMTP(t *testing.T) {
	cks := map[string]func(t *testing.T) *model.Checkpoint{
		"fixture-tiny-mtp": func(t *testing.T) *model.Checkpoint {
			ck, err := model.Open(filepath.Join(fixtureDir(mtpFixture), "checkpoint"))
			require.NoError(t, err)
			t.Cleanup(func() { ck.Close() })
			return ck
		},
		"tiny-mtp":  func(t *testing.T) *model.Checkpoint { return mtpPreset(t, "tiny-mtp") },
		"small-mtp": func(t *testing.T) *model.Checkpoint { return mtpPreset(t, "small-mtp") },
	}
	names := []string{"fixture-tiny-mtp", "tiny-mtp", "small-mtp"}
	if raceEnabled {
		// the race detector makes small-mtp slow (tens of seconds); the same
		// scheduler code runs on the tiny models here, and small-mtp runs in
		// the plain (non-race) pass of make test
		names = names[:2]
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			ck := cks[name](t)
			V := ck.Config().VocabSize
			reqs := specRequests(V)
			cfg := sched.Config{PrefillChunk: 16, MaxBatchTokens: 64}
			plain := spectest.Serve(t, newEngine(t, ck, engine.Options{Slots: 4}), cfg, nil, reqs)
			for _, o := range []speculative.MTPOptions{{Steps: 5, IndexShare: true}, {Steps: 5}, {Steps: 1}} {
				e := newEngine(t, ck, engine.Options{Slots: 4, Rollback: o.Steps + 1})
				d, err := speculative.NewMTP(e, o)
				require.NoError(t, err)
				got := spectest.Serve(t, e, cfg, d, reqs)
				require.NoError(t, d.Close())
				spectest.RequireSameTokens(t, plain, got, fmt.Sprintf("%+v", o))
				var st speculative.Stats
				for _, x := range got {
					st = st.Add(x.Final.Spec)
				}
				require.Greater(t, st.Steps, 0)
				t.Logf("%+v: %d verify steps, %d drafts, %d accepted (acceptance length %.2f)", o, st.Steps, st.Drafted, st.Accepted, st.AcceptanceLength())
			}
		})
	}
}

// The MTP drafter rolls its own state back exactly: a sequence that drafts
// (MTP draft steps under a checkpoint, cut back before the next draft
// extend) and one that is only told the same committed tokens hold equal
// MTP caches (latents, indexer pools and pending rows) and give the same
// first draft after every observation, with index sharing on and off, over
// accepted runs of every length (pool boundaries crossed both ways).
func TestMTPDrafterRollsBackExactly(t *testing.T) {
	ck := mtpPreset(t, "tiny-mtp")
	cfg := ck.Config()
	V, D := cfg.VocabSize, cfg.HiddenSize
	for _, share := range []bool{false, true} {
		e := newEngine(t, ck, engine.Options{Slots: 4, Rollback: 6})
		// the trunk's rows for a prompt and a continuation (any tokens do:
		// the drafter only needs consistent observations)
		toks := seqTokens(60, 8, V)
		slot, err := e.Store().Alloc()
		require.NoError(t, err)
		res, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits, FinalHidden: true}, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: toks}}})
		require.NoError(t, err)
		require.NoError(t, e.Store().Free(slot))
		hid := res.Hidden[ir.OutputFinalHidden]
		d, err := speculative.NewMTP(e, speculative.MTPOptions{Steps: 5, IndexShare: share})
		require.NoError(t, err)
		require.NoError(t, d.Start("spec", toks[:9]))
		require.NoError(t, d.Start("ref", toks[:9]))
		mst, err := e.MTPStore()
		require.NoError(t, err)
		sr := mst.(backend.StateReader)
		obs := func(id string, pos0, n int, verify bool) speculative.Observation {
			return speculative.Observation{Seq: id, Pos0: pos0, Tokens: toks[pos0 : pos0+n], Next: toks[pos0+n], Hidden: hid[pos0*D : (pos0+n)*D], Verify: verify}
		}
		pos := 0
		for i, n := range []int{9, 1, 3, 6, 2, 4, 5, 1, 6, 6, 2, 3} {
			if i > 0 {
				props := []speculative.Proposal{{Seq: "spec", Max: 5}}
				require.NoError(t, d.Propose(props))
				require.Len(t, props[0].Drafts, 5)
			}
			require.NoError(t, d.Observe([]speculative.Observation{obs("spec", pos, n, i > 0), obs("ref", pos, n, i > 0)}))
			pos += n
			a, _ := d.Slot("spec")
			b, _ := d.Slot("ref")
			sa, err := sr.ReadState(a)
			require.NoError(t, err)
			sb, err := sr.ReadState(b)
			require.NoError(t, err)
			require.Equal(t, pos, sa.Len)
			spectest.RequireStateEqual(t, sb, sa, fmt.Sprintf("share %v, after observing %d tokens", share, pos))
			pa, pb := []speculative.Proposal{{Seq: "spec", Max: 1}}, []speculative.Proposal{{Seq: "ref", Max: 1}}
			require.NoError(t, d.Propose(pa))
			require.NoError(t, d.Propose(pb))
			require.Equal(t, pb[0].Drafts, pa[0].Drafts, "first drafts after %d tokens", pos)
		}
		require.NoError(t, d.Close())
	}
}

// index_share_for_mtp_iteration: draft steps that reuse step 0's indexer
// selection (plus the positions drafted since) compute exactly what steps
// that run the indexer compute wherever the indexer would keep every pool
// (contexts up to index_topk + kpool − 1 positions: sparse selection equals
// dense), and differ from it once selection is sparse (the reuse is real).
func TestMTPIndexShare(t *testing.T) {
	ck := mtpPreset(t, "tiny-mtp")
	cfg := ck.Config()
	V, D := cfg.VocabSize, cfg.HiddenSize
	e := newEngine(t, ck, engine.Options{Slots: 2})
	mst, err := e.MTPStore()
	require.NoError(t, err)
	const steps = 5
	dense := cfg.IndexTopK + cfg.IndexKPool - 1 // the last position whose selection is every position
	differed := false
	for _, n := range []int{4, 9, 13, 30, 41} {
		toks := seqTokens(n+steps, n, V)
		hid := make([]float32, (n+steps)*D)
		for i := range hid {
			hid[i] = float32(math.Sin(float64(i)*0.37 + float64(n)))
		}
		var rows [2][][]float32
		for si, share := range []int{0, steps - 1} {
			slot, err := mst.Alloc()
			require.NoError(t, err)
			_, err = e.Run(engine.Key{MTP: true, Mode: graph.Extend, Logits: graph.LastLogits, IndexShare: share},
				&backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: toks[:n], Hidden: hid[:n*D]}}})
			require.NoError(t, err)
			for k := 0; k < steps-1; k++ {
				p := n + k
				res, err := e.Run(engine.Key{MTP: true, Mode: graph.Decode, Logits: graph.LastLogits, IndexShare: share},
					&backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: toks[p : p+1], Hidden: hid[p*D : (p+1)*D]}}})
				require.NoError(t, err)
				rows[si] = append(rows[si], res.Row(0))
			}
			require.NoError(t, mst.Free(slot))
		}
		for k := range rows[0] {
			p := n + k
			same := slices.Equal(rows[0][k], rows[1][k])
			if n-1 <= dense && p <= dense {
				require.True(t, same, "context %d, draft step %d at position %d: sharing must not change a dense selection", n, k+1, p)
			}
			differed = differed || !same
		}
	}
	require.True(t, differed, "on sparse contexts the shared selection must differ from a recomputed one somewhere")
}

// Speculative sampling through the scheduler reproduces the target
// distribution: 3000 seeded requests (600 under -race) on the tiny fixture (temperature 0.8,
// top-k 6) sample their first token plainly and their second from a verify
// span with one draft, drawn from a drafter distribution q or fixed
// (q one-hot). The joint distribution of the two tokens matches the
// target's, p(t1)·p(t2|t1) from plain forward passes (chi-square,
// significance 1e-3; seeds fixed, so the test is deterministic).
func TestSpecSamplingMatchesTarget(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	V := ck.Config().VocabSize
	params := sample.Params{Temperature: 0.8, TopK: 6, TopP: 1}
	prompt := seqTokens(5, 11, V)
	e := newEngine(t, ck, engine.Options{Slots: 8, Rollback: 2})
	// the target: p(t1), then p(t2 | t1) for every t1 it can draw
	last := func(toks []int32) []float32 {
		slot, err := e.Store().Alloc()
		require.NoError(t, err)
		defer func() { require.NoError(t, e.Store().Free(slot)) }()
		res, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: toks}}})
		require.NoError(t, err)
		return res.Row(0)
	}
	want := map[[2]int32]float64{}
	ids1, p1 := sample.Dist(last(prompt), params)
	var likely []int32 // the target's likely second tokens after its likeliest first one
	for i, a := range ids1 {
		ids2, p2 := sample.Dist(last(append(slices.Clone(prompt), int32(a))), params)
		for j, b := range ids2 {
			want[[2]int32{int32(a), int32(b)}] = p1[i] * p2[j]
			if i == 0 && j < 3 {
				likely = append(likely, int32(b))
			}
		}
	}
	q := speculative.Dist{IDs: append(likely, int32(V-1)), Probs: []float64{0.4, 0.3, 0.2, 0.1}}
	for _, deterministic := range []bool{false, true} {
		script := func(h speculative.History, max int) ([]int32, []speculative.Dist) {
			if deterministic {
				return []int32{likely[0]}, nil
			}
			hh := fnv.New64a()
			hh.Write([]byte(h.Seq))
			r := rand.New(rand.NewPCG(hh.Sum64(), uint64(len(h.Generated))))
			u := r.Float64()
			for i, p := range q.Probs {
				if u -= p; u < 0 || i == len(q.Probs)-1 {
					return []int32{q.IDs[i]}, []speculative.Dist{q}
				}
			}
			return nil, nil
		}
		d, err := speculative.NewScripted("sampled", 1, script)
		require.NoError(t, err)
		n := 3000
		if raceEnabled {
			n = 600
		}
		reqs := make([]spectest.Request, n)
		for i := range reqs {
			p := params
			p.Seed = uint64(i + 1)
			reqs[i] = spectest.Request{ID: fmt.Sprintf("r%d", i), Prompt: prompt, MaxTokens: 2 + 1, Sampling: p}
		}
		outs := spectest.Serve(t, e, sched.Config{MaxQueue: n}, d, reqs)
		counts := map[[2]int32]int{}
		var st speculative.Stats
		for _, o := range outs {
			require.Len(t, o.Tokens, 3)
			counts[[2]int32{o.Tokens[0], o.Tokens[1]}]++
			st = st.Add(o.Final.Spec)
		}
		require.Equal(t, n, st.Drafted, "every request verified one draft for its second token")
		require.Greater(t, st.Accepted, n/10)
		require.Less(t, st.Accepted, st.Drafted)
		x, df := pairChiSquare(t, counts, want, n)
		pv := chiSquarePValue(x, df)
		t.Logf("deterministic drafts %v: %d accepted of %d, χ²=%.1f with %d degrees of freedom, p=%.3f", deterministic, st.Accepted, st.Drafted, x, df, pv)
		require.Greater(t, pv, 1e-3)
	}
}

// pairChiSquare is Pearson's χ² statistic of n observed token pairs
// against the target's distribution want, and its degrees of freedom;
// cells expected fewer than 5 times are pooled into one. A pair outside
// want's support fails the test.
func pairChiSquare(t *testing.T, counts map[[2]int32]int, want map[[2]int32]float64, n int) (float64, int) {
	t.Helper()
	x, df := 0.0, -1
	var poolE float64
	var poolO int
	for k, p := range want {
		e := p * float64(n)
		if e < 5 {
			poolE += e
			poolO += counts[k]
			continue
		}
		d := float64(counts[k]) - e
		x += d * d / e
		df++
	}
	for k := range counts {
		_, ok := want[k]
		require.True(t, ok, "pair %v is outside the target's support", k)
	}
	if poolE > 0 {
		d := float64(poolO) - poolE
		x += d * d / poolE
		df++
	}
	return x, df
}

// chiSquarePValue is P(X ≥ x) for X chi-square with k degrees of freedom
// (Wilson–Hilferty).
func chiSquarePValue(x float64, k int) float64 {
	kf := float64(k)
	z := (math.Cbrt(x/kf) - (1 - 2/(9*kf))) / math.Sqrt(2/(9*kf))
	return 0.5 * math.Erfc(z/math.Sqrt2)
}

// The configuration and the drafters bound num_steps alike.
func TestSpecStepBoundsAgree(t *testing.T) {
	require.Equal(t, speculative.MaxSteps, config.MaxSpecSteps)
}

// Store.Copy on the CPU (the fork of an n > 1 request): on every fixture,
// a slot copied after the prompt and a few decoded tokens (a pool pending
// and complete ones) holds its source's state bit for bit, and both decode
// on exactly as the plain run does.
func TestStoreCopyMatchesPlainRun(t *testing.T) {
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			ck, _ := openFixture(t, name)
			for _, rollback := range []int{0, 2} {
				e := newEngine(t, ck, engine.Options{Slots: 3, Rollback: rollback})
				plain := spectest.PlainRun(t, e, seqTokens(13, 3, ck.Config().VocabSize), 12)
				spectest.ForkRun(t, e, plain, 3)
			}
		})
	}
}
