package tests

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/eval"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model"
	"github.com/stretchr/testify/require"
)

// tpEngine is engineWith on tp tensor-parallel ranks.
func tpEngine(t *testing.T, ck *model.Checkpoint, reqs []pass.Request, tp int) *engine.Engine {
	t.Helper()
	pl, err := pass.NewPipeline(reqs, true)
	require.NoError(t, err)
	env := config.Default().PassEnv(ck.Config(), ck)
	e, err := engine.New(ck.Config(), ck, engine.Options{Slots: 2, Passes: pl, PassEnv: env, TP: tp})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	require.Equal(t, tp, e.TP())
	return e
}

// TestTensorParallelParity: on the fixtures whose heads, intermediate
// sizes and vocabulary divide by 2 and 4, the sharded engine (ranks as
// goroutines meeting at an in-process all-reduce) matches transformers
// within the parity tolerance with identical greedy tokens, at TP 1, 2
// and 4, with the passes off and with every pass (the same bound TP 1 is
// held to; the sharded sums differ from TP 1's in rounding only).
func TestTensorParallelParity(t *testing.T) {
	tdir := tuningDir(t)
	arms := map[string][]pass.Request{"off": nil, "every": everyPass(tdir)}
	for _, name := range []string{"glm5next-tiny-a", "glm5next-tiny-c"} {
		for _, arm := range []string{"off", "every"} {
			t.Run(name+"/"+arm, func(t *testing.T) {
				ck, ref := openFixture(t, name)
				var fired1 map[string]map[string]int // TP 1's fired sites by program and pass
				for _, tp := range []int{1, 2, 4} {
					e := tpEngine(t, ck, arms[arm], tp)
					res, err := eval.RunAll(e, ref)
					require.NoError(t, err)
					require.Len(t, res, len(ref.Cases))
					for _, r := range res {
						t.Logf("tp%d %-10s rows=%3d max|Δ|=%.2e greedy=%v", tp, r.Name, r.Rows, r.MaxAbsDiff, r.GreedyMatch)
						require.Less(t, r.MaxAbsDiff, 1e-4, "tp %d %s", tp, r.Name)
						require.True(t, r.GreedyMatch, "tp %d %s: %d greedy mismatches", tp, r.Name, r.Mismatches)
					}
					// every pass fires at as many sites at each TP (the
					// sharded graph keeps each pass's eligibility)
					fired := map[string]map[string]int{}
					for key, rep := range e.Reports() {
						fired[key.String()] = map[string]int{}
						for _, p := range rep.Passes {
							n := len(p.Fired)
							if p.Name == "prefill-autotune" && n > 0 {
								n = 1 // its sites are the distinct GEMM shapes, which sharding changes
							}
							fired[key.String()][p.Name] = n
						}
					}
					if fired1 == nil {
						fired1 = fired
					}
					require.Equal(t, fired1, fired, "tp %d: the passes fired elsewhere than at TP 1", tp)
					if tp == 1 {
						_, ok := e.Collectives()
						require.False(t, ok)
						continue
					}
					st, ok := e.Collectives()
					require.True(t, ok)
					require.Positive(t, st.AllReduces, "tp %d ran no all-reduce", tp)
					require.Positive(t, st.AllGathers, "tp %d gathered no logits", tp)
					require.Positive(t, st.Bytes)
				}
			})
		}
	}
}

// Models whose sharded dimensions do not divide by the ranks are refused
// with the key and the dimension named.
func TestTensorParallelRefusals(t *testing.T) {
	ck, _ := openFixture(t, "glm5next-tiny-b") // 3 KDA/MLA heads, vocabulary 200
	for tp, want := range map[int]string{2: "linear_attn_config.num_heads (KDA heads), 3", 3: "vocab_size (embedding and lm_head), 200"} {
		_, err := engine.New(ck.Config(), ck, engine.Options{Slots: 2, TP: tp})
		require.ErrorContains(t, err, fmt.Sprintf("parallel.tp_size %d does not divide the model's %s", tp, want))
	}
	ck, _ = openFixture(t, "glm5next-tiny-a")
	_, err := engine.New(ck.Config(), ck, engine.Options{Slots: 2, TP: 2, Device: "cuda"})
	require.ErrorContains(t, err, "parallel.tp_size 2 is implemented on the cpu backend only")
}

// TestTensorParallelMTPParity: the MTP fixture (the tiny-a trunk and an MTP
// layer) at TP 2 and 4 — trunk, MTP draft steps and their hidden rows —
// matches transformers as TP 1 does, with the passes off and with every
// pass.
func TestTensorParallelMTPParity(t *testing.T) {
	dir := fixtureDir(mtpFixture)
	ck, err := model.Open(filepath.Join(dir, "checkpoint"))
	require.NoError(t, err)
	defer ck.Close()
	ref, err := eval.LoadMTP(filepath.Join(dir, "reference.safetensors"))
	require.NoError(t, err)
	for _, arm := range []string{"off", "every"} {
		reqs := map[string][]pass.Request{"off": nil, "every": everyPass(tuningDir(t))}[arm]
		for _, tp := range []int{2, 4} {
			e := tpEngine(t, ck, reqs, tp)
			res, err := eval.RunMTP(e, ref)
			require.NoError(t, err)
			require.Len(t, res, len(ref.Cases))
			for _, r := range res {
				t.Logf("tp%d %s %s: trunk logits %.1e; mtp logits %.1e hidden %.1e; chain logits %.1e; mismatches %d", tp, arm, r.Name, r.TrunkLogits, r.MTPLogits, r.MTPHidden, r.ChainLogits, r.Mismatches)
				require.True(t, r.Pass(1e-4), "tp %d passes %s %s: %+v", tp, arm, r.Name, r)
			}
		}
	}
}
