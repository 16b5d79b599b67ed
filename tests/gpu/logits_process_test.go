package gpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	cudabe "github.com/glmflash/glmflash/core/backend/cuda"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/stretchr/testify/require"
)

// processedSpecs are step's sampling specs over n rows of a vocabulary of
// V ids: rows cycle through no processing, edits (a repetition penalty on
// a few tokens, a +100 logit bias, bans), an allow mask (about half the
// vocabulary, the bias's token banned on some rows) and both, greedy on
// even rows and sampled on odd ones. Step 1 (the first decode step, the
// one a graph is captured on) processes nothing.
func processedSpecs(r *rand.Rand, step, n, V int) []backend.SampleSpec {
	specs := make([]backend.SampleSpec, n)
	for i := range specs {
		s := &specs[i]
		s.Params, s.TopLogprobs = sample.Greedy(), 2
		if i%2 == 1 {
			s.Params, s.U = sample.Params{Temperature: 0.9, TopP: 0.95, MinP: 0.01}, r.Float64()
		}
		if step == 1 {
			continue
		}
		kind := (i + step) % 4
		bias := int32(r.IntN(V))
		if kind&1 == 1 {
			seen := map[int32]bool{bias: true}
			s.Edits = append(s.Edits, sample.Edit{Token: bias, Penalty: 1, Add: 100})
			for len(s.Edits) < 12 {
				t := int32(r.IntN(V))
				if seen[t] {
					continue
				}
				seen[t] = true
				e := sample.Edit{Token: t, Penalty: 1.3}
				if len(s.Edits)%3 == 0 {
					e = sample.Edit{Token: t, Penalty: 1, Add: float32(math.Inf(-1))}
				}
				s.Edits = append(s.Edits, e)
			}
			sortEdits(s.Edits)
		}
		if kind&2 == 2 {
			s.Allow = make([]uint32, sample.AllowWords(V))
			for w := range s.Allow {
				s.Allow[w] = r.Uint32()
			}
			if i%3 == 0 { // the biased token banned by the mask
				s.Allow[bias>>5] &^= 1 << (uint32(bias) & 31)
			}
		}
	}
	return specs
}

func sortEdits(e []sample.Edit) {
	for i := 1; i < len(e); i++ {
		for j := i; j > 0 && e[j].Token < e[j-1].Token; j-- {
			e[j], e[j-1] = e[j-1], e[j]
		}
	}
}

// SampleSpec.Edits and Allow are applied on the device, eagerly and inside
// captured graphs (the decode graph captured on a step without
// processing, replayed on the steps with it): every row's pick and
// log-probabilities are the host sampler's (backend.SampleHost) on the
// step's raw logits, with edits, masks, both and none, greedy and
// sampled; Result.Logits stay raw (the same steps without processing give
// them bit for bit); a masked token is never picked.
func TestCUDALogitsProcessing(t *testing.T) {
	cudaOptions(t, engine.Options{})
	ck, _ := openFixture(t, fixtures[0])
	V := ck.Config().VocabSize
	const seqs, steps = 4, 6
	type run struct {
		logits [][]float32
		stats  backend.DeviceStats
	}
	do := func(graphMax int, process bool) run {
		pl, err := pass.NewPipeline([]pass.Request{{Name: "kda-projection-fusion"}, {Name: "dsa-pooled-metadata"}, {Name: "host-length-reuse"}}, true)
		require.NoError(t, err)
		e := cudaEngine(t, ck, engine.Options{Slots: seqs, Passes: pl, PassEnv: config.Default().PassEnv(ck.Config(), ck), Backend: backend.Options{Device: cudabe.Options{GraphMaxTokens: graphMax}}})
		var slots []int
		for i := 0; i < seqs; i++ {
			s, err := e.Store().Alloc()
			require.NoError(t, err)
			slots = append(slots, s)
		}
		key := engine.Key{Mode: graph.Mixed, Logits: graph.LastLogits}
		r := rand.New(rand.NewPCG(7, 8))
		var out run
		for step := 0; step < steps; step++ {
			b := &backend.Batch{}
			for i, s := range slots {
				n := 1
				if step == 0 {
					n = 4 + i
				}
				b.Seqs = append(b.Seqs, backend.Seq{Slot: s, Tokens: seqTokens(n, step*5+i, V)})
			}
			b.Sample = processedSpecs(r, step, seqs, V)
			if !process {
				for i := range b.Sample {
					b.Sample[i].Edits, b.Sample[i].Allow = nil, nil
				}
			}
			res, err := e.Run(key, b)
			require.NoError(t, err)
			want := backend.SampleHost(res.Logits, V, b.Sample)
			for i, w := range want {
				got := res.Samples[i]
				require.NoError(t, w.Err)
				require.NoError(t, got.Err)
				require.Equal(t, w.Token, got.Token, "step %d row %d (%+v)", step, i, b.Sample[i].Params)
				require.True(t, sample.Allowed(b.Sample[i].Allow, got.Token), "step %d row %d picked masked token %d", step, i, got.Token)
				require.InDelta(t, w.Logprob, got.Logprob, 1e-5, "step %d row %d", step, i)
				require.Len(t, got.Top, len(w.Top))
				for j := range w.Top {
					require.Equal(t, w.Top[j].ID, got.Top[j].ID, "step %d row %d alt %d", step, i, j)
					require.InDelta(t, w.Top[j].Logprob, got.Top[j].Logprob, 1e-5)
				}
			}
			out.logits = append(out.logits, res.Logits)
		}
		p, err := e.Program(key)
		require.NoError(t, err)
		out.stats = backend.DeviceStatsOf(p)
		return out
	}
	eager, graphed, raw := do(-1, true), do(0, true), do(0, false)
	for i := range eager.logits {
		require.Equal(t, raw.logits[i], graphed.logits[i], "step %d: the logits the caller reads are raw", i)
		require.Equal(t, eager.logits[i], graphed.logits[i], "step %d", i)
	}
	t.Logf("graphed with processing: %d replays, %d captures in %d runs; without: %d replays, %d captures", graphed.stats.GraphReplays, graphed.stats.GraphCaptures, graphed.stats.Runs, raw.stats.GraphReplays, raw.stats.GraphCaptures)
	require.Zero(t, eager.stats.GraphReplays)
	for _, r := range []run{graphed, raw} { // the prefill step's shape and the decode steps'
		require.EqualValues(t, steps, r.stats.GraphReplays, "every step replays (a capture is replayed once captured)")
		require.EqualValues(t, 2, r.stats.GraphCaptures, "one capture per shape: the decode graph captured on step 1, without processing, serves the steps with it")
	}
}
