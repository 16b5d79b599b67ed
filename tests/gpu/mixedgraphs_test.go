package gpu

import (
	"fmt"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	cudabe "github.com/glmflash/glmflash/core/backend/cuda"
	"github.com/glmflash/glmflash/core/cache"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/speculative/spectest"
	"github.com/stretchr/testify/require"
)

// mixedRun is what a run of mixedSteps returned: every step's logits and
// samples, every slot's state after the last step (the bystander's too),
// the page pool and the generation program's counters.
type mixedRun struct {
	logits  [][]float32
	samples [][]int32
	states  []*cache.Seq
	pages   backend.PageStats
	stats   backend.DeviceStats
	// first are the counters after the schedule's first two rounds
	first backend.DeviceStats
}

// mixedSchedule are the steps mixedSteps runs: per step, the new tokens
// of each of 4 slots (0: not in the step). Slot 4 is a bystander, prefilled
// once and never in a step again. With graph_max_tokens 8 and buckets 16,
// 32, 64 every step of more than 8 tokens is padded to a bucket: a
// prefill-only step (20 tokens, one sequence: 12 padding rows in one
// padding sequence), mixed steps of decode tokens beside prompt chunks (in
// 2, 4 and 8 sequences after padding, padding spread over 1 to 4 padding
// sequences, one step holding its bucket exactly) and decode-only steps of
// at most 8 tokens (exact graphs).
var mixedSchedule = [][4]int{
	{20, 0, 0, 0},  // prefill: 20 → 32 (S 1 → 2)
	{1, 13, 6, 0},  // mixed: 20 → 32 (S 3 → 4)
	{1, 1, 1, 17},  // mixed: 20 → 32 (S 4 → 8, 4 padding sequences of 3)
	{1, 1, 1, 1},   // decode: exact graph
	{1, 12, 1, 2},  // mixed: 16 → 16 exactly (no padding)
	{1, 1, 1, 1},   // decode
	{1, 30, 1, 1},  // mixed: 33 → 64 (S 4 → 8)
	{1, 1, 1, 1},   // decode
	{1, 1, 1, 1},   // decode again: replays
	{1, 9, 1, 1},   // mixed: 12 → 16 (S 4 → 8, 4 padding rows)
	{1, 13, 1, 17}, // mixed: 32 → 32
}

// mixedSteps runs mixedSchedule three times on a fresh engine of the given CUDA
// options (sampled rows, every pass graphs need) and returns what it saw.
func mixedSteps(t *testing.T, co cudabe.Options) mixedRun {
	t.Helper()
	ck, _ := openFixture(t, fixtures[0])
	V := ck.Config().VocabSize
	pl, err := pass.NewPipeline([]pass.Request{{Name: "kda-projection-fusion"}, {Name: "mhc-post-pre-fusion"}, {Name: "dsa-pooled-metadata"}, {Name: "host-length-reuse"}}, true)
	require.NoError(t, err)
	e := cudaEngine(t, ck, engine.Options{Slots: 5, MaxPositions: 256, Passes: pl, PassEnv: config.Default().PassEnv(ck.Config(), ck), Backend: backend.Options{Device: co}})
	st := e.Store()
	slots := make([]int, 5)
	for i := range slots {
		slots[i], err = st.Alloc()
		require.NoError(t, err)
	}
	key := engine.Key{Mode: graph.Mixed, Logits: graph.LastLogits}
	_, err = e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: slots[4], Tokens: seqTokens(11, 99, V)}}}) // the bystander (eager: 11 tokens, 1 sequence → bucket 16 on the bucketed run)
	require.NoError(t, err)
	var out mixedRun
	prog, err := e.Program(key)
	require.NoError(t, err)
	for step := range 3 * len(mixedSchedule) {
		if step == 2*len(mixedSchedule) {
			out.first = backend.DeviceStatsOf(prog)
		}
		ns := mixedSchedule[step%len(mixedSchedule)]
		b := &backend.Batch{}
		for i, n := range ns {
			if n > 0 {
				b.Seqs = append(b.Seqs, backend.Seq{Slot: slots[i], Tokens: seqTokens(n, 7*step+i, V)})
			}
		}
		b.Sample = make([]backend.SampleSpec, len(b.Seqs))
		for i := range b.Sample {
			b.Sample[i] = backend.SampleSpec{Params: sample.Params{Temperature: 0.9, TopP: 0.95, Seed: 1}, U: float64((step*3+i)%40) / 40, TopLogprobs: 2}
			if i%2 == 1 {
				b.Sample[i].Params = sample.Greedy()
			}
		}
		r, err := e.Run(key, b)
		require.NoError(t, err, "step %d", step)
		require.Len(t, r.Samples, len(b.Seqs), "step %d: one sample per real row", step)
		require.Equal(t, len(b.Seqs), r.Rows, "step %d: the real rows only", step)
		toks := make([]int32, len(r.Samples))
		for i, s := range r.Samples {
			require.NoError(t, s.Err)
			toks[i] = s.Token
		}
		out.logits = append(out.logits, r.Logits)
		out.samples = append(out.samples, toks)
	}
	sr := st.(backend.StateReader)
	for _, s := range slots {
		q, err := sr.ReadState(s)
		require.NoError(t, err)
		out.states = append(out.states, q)
	}
	out.pages = st.(backend.PagedStore).PageStats()
	out.stats = backend.DeviceStatsOf(prog)
	return out
}

// Steps that carry prompt chunks beside decode tokens (and long prefill
// and decode steps) replay bucket graphs: padded to the smallest bucket
// that holds them, they give the eager steps' logits and samples bit for
// bit, every sequence's state (KDA windows and states, latents, indexer
// pools and pending rows) is the eager run's bit for bit, a bystander
// slot's too, and the padding takes no page; every step of more than
// graph_max_tokens tokens is one launch (a replay), captured once per
// bucket shape, and the launches are reported by step kind.
func TestCUDAMixedStepsReplayBucketGraphs(t *testing.T) {
	cudaOptions(t, engine.Options{})
	eager := mixedSteps(t, cudabe.Options{GraphMaxTokens: -1})
	bucketed := mixedSteps(t, cudabe.Options{GraphMaxTokens: 8, GraphBuckets: []int{16, 32, 64}})
	for i := range eager.logits {
		require.Equal(t, eager.logits[i], bucketed.logits[i], "step %d logits", i)
		require.Equal(t, eager.samples[i], bucketed.samples[i], "step %d samples", i)
	}
	for i := range eager.states {
		spectest.RequireStateEqual(t, eager.states[i], bucketed.states[i], fmt.Sprintf("slot %d", i))
	}
	require.Equal(t, eager.pages, bucketed.pages, "padding takes no page")

	es, gs, first := eager.stats, bucketed.stats, bucketed.first
	t.Logf("eager: %d launches in %d runs; bucketed: %d launches, %d replays, %d captures, %d graphs held", es.Launches, es.Runs, gs.Launches, gs.GraphReplays, gs.GraphCaptures, gs.GraphsHeld)
	for k := backend.StepKind(0); k < backend.NumStepKinds; k++ {
		e, g := es.ByKind[k], gs.ByKind[k]
		t.Logf("%-7s steps %2d  eager %6.1f launches/step  bucketed %4.1f launches/step, %d replays, %d tokens + %d padding",
			k, g.Steps, float64(e.Launches)/float64(max(e.Steps, 1)), float64(g.Launches)/float64(max(g.Steps, 1)), g.GraphReplays, g.Tokens, g.PadTokens)
		require.Equal(t, e.Steps, g.Steps, "%s steps", k)
		require.Equal(t, e.Tokens, g.Tokens, "%s tokens", k)
		require.Zero(t, e.GraphReplays)
		require.Zero(t, e.PadTokens)
	}
	dec, mix, pre := gs.ByKind[backend.StepDecode], gs.ByKind[backend.StepMixed], gs.ByKind[backend.StepPrefill]
	require.EqualValues(t, 12, dec.Steps)
	require.EqualValues(t, 18, mix.Steps)
	require.EqualValues(t, 4, pre.Steps, "the bystander's prefill and step 0 of each round")
	for _, k := range []backend.KindStats{dec, mix, pre} {
		require.Equal(t, k.Steps, k.GraphReplays, "every step replays a graph")
		require.Equal(t, k.Steps, k.Launches, "one launch (the replay) per step")
	}
	require.EqualValues(t, 5+3*(12+12+12+31+4), mix.PadTokens+pre.PadTokens, "the padding rows (the bystander's prefill, steps 0, 1, 2, 6 and 9)")
	require.Zero(t, dec.PadTokens, "decode steps of ≤ 8 tokens replay exact graphs")
	// the shapes (tokens × sequences): 16×2 (the bystander), 32×2, 32×4,
	// 32×8, 4×4 (decode, exact), 16×4, 64×8, 16×8 (step 10, 32 tokens in 4
	// sequences, replays 32×4); a larger shape's arena drops the graphs
	// captured before it (their addresses move) in the first round, the
	// second round captures those again, and the third captures nothing
	require.EqualValues(t, 7, gs.GraphsHeld, "one graph per bucket shape of the later rounds (the bystander's was dropped)")
	require.Equal(t, first.GraphCaptures, gs.GraphCaptures, "the third round replays only")
	require.Zero(t, gs.GraphEvictions)
	require.Less(t, gs.Launches, es.Launches/20)
}

// The graphs a program keeps are bounded by max_graphs: past it the least
// recently replayed is destroyed (counted as an eviction) and recaptured
// when its shape returns, and the steps still give the eager run's bits.
func TestCUDABucketGraphsBounded(t *testing.T) {
	cudaOptions(t, engine.Options{})
	eager := mixedSteps(t, cudabe.Options{GraphMaxTokens: -1})
	bounded := mixedSteps(t, cudabe.Options{GraphMaxTokens: 8, GraphBuckets: []int{16, 32, 64}, MaxGraphs: 3})
	for i := range eager.logits {
		require.Equal(t, eager.logits[i], bounded.logits[i], "step %d logits", i)
		require.Equal(t, eager.samples[i], bounded.samples[i], "step %d samples", i)
	}
	for i := range eager.states {
		spectest.RequireStateEqual(t, eager.states[i], bounded.states[i], fmt.Sprintf("slot %d", i))
	}
	gs := bounded.stats
	t.Logf("max_graphs 3: %d captures, %d evictions, %d held, %d replays in %d runs", gs.GraphCaptures, gs.GraphEvictions, gs.GraphsHeld, gs.GraphReplays, gs.Runs)
	require.EqualValues(t, 3, gs.GraphsHeld)
	require.Positive(t, gs.GraphEvictions)
	require.Greater(t, gs.GraphCaptures-bounded.first.GraphCaptures, int64(3), "evicted shapes are captured again in the third round")
	require.Equal(t, gs.Runs, gs.GraphReplays, "every step still replays")
}
