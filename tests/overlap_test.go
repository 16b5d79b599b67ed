package tests

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/passes/hostlen"
	"github.com/stretchr/testify/require"
)

// With host-length-reuse on, the scheduler prepares step n+1 on the host
// while step n executes (and uses it when every request continued); the
// tokens are exactly those of the serial scheduler. Without the pass the
// executor's lengths are read, nothing is prepared ahead.
func TestRuntimePreparesNextStepWithHostLengths(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	cfg := ck.Config()
	run := func(reqs []pass.Request) ([][]int32, int64) {
		pl, err := pass.NewPipeline(reqs, true)
		require.NoError(t, err)
		e, err := engine.New(cfg, ck, engine.Options{Slots: 4, Passes: pl})
		require.NoError(t, err)
		rt, err := sched.New(e, sched.Config{MaxBatchTokens: 48, PrefillChunk: 16}, sched.Options{})
		require.NoError(t, err)
		defer rt.Close()
		out := make([][]int32, 6)
		var wg sync.WaitGroup
		for i := range out {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				h, err := rt.Submit(ctx, sched.Request{Prompt: seqTokens(5+13*i, i+1, cfg.VocabSize), MaxTokens: 6 + 3*i, Sampling: sample.Greedy()})
				require.NoError(t, err)
				toks, fin, err := h.Wait(ctx)
				require.NoError(t, err)
				require.Equal(t, sched.FinishLength, fin.Reason)
				for _, tk := range toks {
					out[i] = append(out[i], tk.ID)
				}
			}(i)
		}
		wg.Wait()
		return out, rt.PreparedAhead()
	}
	serial, ahead0 := run(nil)
	require.Zero(t, ahead0, "without host lengths nothing may be prepared ahead")
	overlapped, ahead := run([]pass.Request{{Name: hostlen.Name}})
	require.Positive(t, ahead, "steps should have been prepared while the previous one executed")
	require.Equal(t, serial, overlapped)
}

// A prepared batch whose host positions disagree with the cache fails
// loudly at Execute; Prepare is refused for programs that read executor
// lengths.
func TestPrepareValidatesHostPositions(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	cfg := ck.Config()
	key := engine.Key{Mode: graph.Mixed, Logits: "last"}
	plain, err := engine.New(cfg, ck, engine.Options{Slots: 1})
	require.NoError(t, err)
	s, _ := plain.Store().Alloc()
	_, err = plain.Prepare(key, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: []int32{1}}}}, []int{0})
	require.ErrorContains(t, err, "host-length-reuse")

	pl, err := pass.NewPipeline([]pass.Request{{Name: hostlen.Name}}, true)
	require.NoError(t, err)
	e, err := engine.New(cfg, ck, engine.Options{Slots: 1, Passes: pl})
	require.NoError(t, err)
	s, _ = e.Store().Alloc()
	pr, err := e.Prepare(key, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: []int32{1, 2}}}}, []int{3})
	require.NoError(t, err)
	_, err = e.Execute(key, pr)
	require.ErrorContains(t, err, "host length hint")
	pr, err = e.Prepare(key, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: []int32{1, 2}}}}, []int{0})
	require.NoError(t, err)
	require.Error(t, pr.SetTokens(0, []int32{1}))
	require.Error(t, pr.SetTokens(0, []int32{1, 9999}))
	require.NoError(t, pr.SetTokens(0, []int32{4, 5}))
	_, err = e.Execute(key, pr)
	require.NoError(t, err)
	n, _ := e.Store().Len(s)
	require.Equal(t, 2, n)
}
