package gpu

import (
	"fmt"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/core/speculative"
	"github.com/glmflash/glmflash/core/speculative/spectest"
	"github.com/glmflash/glmflash/model"
	"github.com/stretchr/testify/require"
)

// Rollback on the GPU: verify spans of the plain run's tokens with wrong
// drafts injected accept exactly the correct prefix, their rows equal the
// GPU's own plain decoding logits bit for bit, and after every cut-back
// the device state (KDA windows and states from the per-position records,
// latents, indexer pools and pending rows restored from the raw records)
// equals the plain run's at the same length, bit for bit.
func TestCUDASpecRollback(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	wrong := map[int]bool{1: true, 4: true, 5: true, 9: true, 12: true, 13: true}
	for _, steps := range []int{1, 4} {
		e := cudaEngine(t, ck, engine.Options{Slots: 2, Rollback: steps + 1})
		V := ck.Config().VocabSize
		plain := spectest.PlainRun(t, e, seqTokens(9, 3, V), 16)
		run := spectest.RollbackRun(t, e, plain, steps, wrong)
		acc, drafted := 0, 0
		for _, s := range run {
			acc += s.Accepted
			drafted += len(s.Drafts)
		}
		require.Greater(t, acc, 0)
		require.Less(t, acc, drafted)
	}
}

// Store.Copy on the GPU (the fork of an n > 1 request): device copies of
// a slot after its prompt and three decoded tokens hold the source's state
// bit for bit, and both slots decode on exactly as the GPU's plain run,
// with and without rollback records.
func TestCUDAStoreCopy(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	for _, rollback := range []int{0, 2} {
		e := cudaEngine(t, ck, engine.Options{Slots: 3, Rollback: rollback})
		plain := spectest.PlainRun(t, e, seqTokens(13, 3, ck.Config().VocabSize), 10)
		spectest.ForkRun(t, e, plain, 3)
	}
}

// Greedy identity on the GPU through the scheduler: the test drafter (the
// truth with wrong drafts at a 60% rate) and the MTP drafter (5 steps,
// index sharing on) give every request exactly the tokens of plain GPU
// decoding, with a plain request and chunked prefill in the same batches;
// and the GPU's speculative tokens equal the CPU's.
func TestCUDASpecGreedyIdentity(t *testing.T) {
	ck := presetCheckpoint(t, "tiny-mtp")
	V := ck.Config().VocabSize
	reqs := []spectest.Request{
		{Prompt: seqTokens(21, 1, V), MaxTokens: 10},
		{Prompt: seqTokens(5, 2, V), MaxTokens: 12},
		{Prompt: seqTokens(9, 3, V), MaxTokens: 8, Plain: true},
	}
	cfg := sched.Config{PrefillChunk: 8, MaxBatchTokens: 32}
	plain := spectest.Serve(t, cudaEngine(t, ck, engine.Options{Slots: 3}), cfg, nil, reqs)
	cpuPlain := spectest.Serve(t, newCPUEngine(t, ck, engine.Options{Slots: 3}), cfg, nil, reqs)
	spectest.RequireSameTokens(t, cpuPlain, plain, "GPU against CPU, plain")

	e := cudaEngine(t, ck, engine.Options{Slots: 3, Rollback: 6})
	oracle, err := speculative.NewScripted("oracle", 5, speculative.Oracle(spectest.Truth(plain, reqs), speculative.WrongRate(0.6, 7), V))
	require.NoError(t, err)
	got := spectest.Serve(t, e, cfg, oracle, reqs)
	spectest.RequireSameTokens(t, plain, got, "oracle drafter")
	var st speculative.Stats
	for _, o := range got {
		st = st.Add(o.Final.Spec)
	}
	require.Greater(t, st.Accepted, 0)
	require.Less(t, st.Accepted, st.Drafted)

	mtp, err := speculative.NewMTP(e, speculative.MTPOptions{Steps: 5, IndexShare: true})
	require.NoError(t, err)
	got = spectest.Serve(t, e, cfg, mtp, reqs)
	require.NoError(t, mtp.Close())
	spectest.RequireSameTokens(t, plain, got, "MTP drafter")
	st = speculative.Stats{}
	for _, o := range got {
		st = st.Add(o.Final.Spec)
	}
	require.Greater(t, st.Steps, 0)
	t.Logf("MTP on the GPU: %d verify steps, %d drafts, %d accepted", st.Steps, st.Drafted, st.Accepted)

	// with the built-in passes: host-length reuse makes the MTP draft steps
	// (and plain decode steps) CUDA graphs that read the checkpoint and
	// shared-selection arrays from fixed addresses; verify batches read
	// the host lengths too (the scheduler builds them after acceptance), so
	// they need no length read-back and replay graphs where they fit
	var reqsP []pass.Request
	for _, r := range config.Default().Requests() {
		if r.Name != "prefill-autotune" {
			reqsP = append(reqsP, r)
		}
	}
	pl, err := pass.NewPipeline(reqsP, true)
	require.NoError(t, err)
	eg := cudaEngine(t, ck, engine.Options{Slots: 3, Rollback: 6, Passes: pl, PassEnv: config.Default().PassEnv(ck.Config(), ck)})
	mtp, err = speculative.NewMTP(eg, speculative.MTPOptions{Steps: 5, IndexShare: true})
	require.NoError(t, err)
	got = spectest.Serve(t, eg, cfg, mtp, reqs)
	require.NoError(t, mtp.Close())
	spectest.RequireSameTokens(t, plain, got, "MTP drafter, passes and CUDA graphs")
	draftStep, err := eg.Program(engine.Key{MTP: true, Mode: graph.Decode, Logits: graph.LastLogits, IndexShare: 4})
	require.NoError(t, err)
	require.Positive(t, backend.DeviceStatsOf(draftStep).GraphReplays, "the draft steps replay CUDA graphs")
	verify, err := eg.Program(sched.SpecProgram(mtp))
	require.NoError(t, err)
	require.True(t, verify.Plan().HostLengths, "host-length-reuse fires on the verify graph")
	require.Zero(t, backend.DeviceStatsOf(verify).LengthSyncs, "verify batches read the host lengths: no length read-back")
	require.Positive(t, backend.DeviceStatsOf(verify).GraphReplays, "verify batches replay CUDA graphs")
}

// The GPU's MTP drafter drafts what the CPU's does after every observation
// (draft steps rolled back, index sharing on), on the same committed
// tokens and hidden rows.
func TestCUDAMTPDrafterMatchesCPU(t *testing.T) {
	ck := presetCheckpoint(t, "tiny-mtp")
	cfg := ck.Config()
	V, D := cfg.VocabSize, cfg.HiddenSize
	toks := seqTokens(40, 8, V)
	hid := make([]float32, len(toks)*D)
	for i := range hid {
		hid[i] = float32((i*37)%101)/50 - 1
	}
	run := func(e *engine.Engine) [][]int32 {
		d, err := speculative.NewMTP(e, speculative.MTPOptions{Steps: 4, IndexShare: true})
		require.NoError(t, err)
		defer d.Close()
		require.NoError(t, d.Start("s", toks[:7]))
		var out [][]int32
		pos := 0
		for i, n := range []int{7, 1, 4, 2, 5, 3} {
			require.NoError(t, d.Observe([]speculative.Observation{{Seq: "s", Pos0: pos, Tokens: toks[pos : pos+n], Next: toks[pos+n], Hidden: hid[pos*D : (pos+n)*D], Verify: i > 0}}))
			pos += n
			p := []speculative.Proposal{{Seq: "s", Max: 4}}
			require.NoError(t, d.Propose(p))
			out = append(out, p[0].Drafts)
		}
		return out
	}
	gpu := run(cudaEngine(t, ck, engine.Options{Slots: 1, Rollback: 5}))
	cpu := run(newCPUEngine(t, ck, engine.Options{Slots: 1, Rollback: 5}))
	require.Equal(t, cpu, gpu, fmt.Sprintf("drafts per step (CPU %v)", cpu))
	// host-length reuse on: the draft steps replay CUDA graphs
	pl, err := pass.NewPipeline([]pass.Request{{Name: "dsa-pooled-metadata"}, {Name: "host-length-reuse"}}, true)
	require.NoError(t, err)
	eg := cudaEngine(t, ck, engine.Options{Slots: 1, Rollback: 5, Passes: pl, PassEnv: config.Default().PassEnv(ck.Config(), ck)})
	require.Equal(t, cpu, run(eg), "drafts with CUDA graphs")
	p, err := eg.Program(engine.Key{MTP: true, Mode: graph.Decode, Logits: graph.LastLogits, IndexShare: 3})
	require.NoError(t, err)
	require.Positive(t, backend.DeviceStatsOf(p).GraphReplays)
}

func newCPUEngine(t *testing.T, ck *model.Checkpoint, o engine.Options) *engine.Engine {
	t.Helper()
	e, err := engine.New(ck.Config(), ck, o)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	return e
}

// Speculative sampling on the GPU (the target's logits rows come back for
// the acceptance rule): a request's tokens depend only on its seed and its
// drafts, not on what it is batched with, and a plain request beside it is
// untouched.
func TestCUDASpecSampling(t *testing.T) {
	ck := presetCheckpoint(t, "tiny-mtp")
	V := ck.Config().VocabSize
	p := sample.Params{Temperature: 0.02, TopP: 0.9, TopK: 20, Seed: 11} // near greedy: the greedy drafts are often accepted
	reqs := []spectest.Request{
		{ID: "a", Prompt: seqTokens(7, 1, V), MaxTokens: 10, Sampling: p},
		{ID: "b", Prompt: seqTokens(12, 2, V), MaxTokens: 9, Sampling: sample.Params{Temperature: 0.05, TopP: 1, MinP: 0.05, Seed: 3}},
		{ID: "c", Prompt: seqTokens(5, 3, V), MaxTokens: 8, Sampling: p, Plain: true},
	}
	// drafts: the most likely continuation under the plain greedy run (a
	// fixed script, so drafts are reproducible)
	greedyReqs := make([]spectest.Request, len(reqs))
	for i, r := range reqs {
		greedyReqs[i] = spectest.Request{Prompt: r.Prompt, MaxTokens: r.MaxTokens}
	}
	cfg := sched.Config{PrefillChunk: 8}
	e := cudaEngine(t, ck, engine.Options{Slots: 3, Rollback: 4})
	truth := spectest.Truth(spectest.Serve(t, e, cfg, nil, greedyReqs), greedyReqs)
	draft := func() speculative.Drafter {
		d, err := speculative.NewScripted("script", 3, func(h speculative.History, max int) ([]int32, []speculative.Dist) {
			g := truth(h.Prompt)
			n := len(h.Generated)
			if n >= len(g) {
				return nil, nil
			}
			return g[n:min(n+max, len(g))], nil
		})
		require.NoError(t, err)
		return d
	}
	together := spectest.Serve(t, e, cfg, draft(), reqs)
	var st speculative.Stats
	for i, r := range reqs {
		alone := spectest.Serve(t, e, cfg, draft(), []spectest.Request{r})
		require.Equal(t, alone[0].Tokens, together[i].Tokens, "request %s alone and batched", r.ID)
		st = st.Add(together[i].Final.Spec)
	}
	require.Positive(t, st.Steps)
	require.Positive(t, st.Accepted, "some drafts are accepted")
	require.Less(t, st.Accepted, st.Drafted, "and some rejected")
	require.Zero(t, together[2].Final.Spec.Steps)
	plainC := spectest.Serve(t, e, cfg, nil, reqs[2:])
	require.Equal(t, plainC[0].Tokens, together[2].Tokens, "the plain request samples as without speculation")
	t.Logf("sampled on the GPU: %d verify steps, %d drafts, %d accepted", st.Steps, st.Drafted, st.Accepted)
}
