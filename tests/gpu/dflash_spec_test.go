package gpu

import (
	"math"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/cache"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/core/speculative"
	"github.com/glmflash/glmflash/core/speculative/spectest"
	"github.com/glmflash/glmflash/model"
	"github.com/stretchr/testify/require"
)

// dflashDrafter writes a random DFlash drafter (the tiny-dflash preset's
// sizes over the trunk cfg) and opens it.
func dflashDrafter(t *testing.T, cfg *model.Config, seed int64) *model.DFlashCheckpoint {
	return spectest.DFlashDrafter(t, "tiny-dflash", cfg, seed)
}

// constantDFlash is a drafter whose every draft is one token: its layers'
// o_proj and down_proj are zero (a layer adds nothing), so a mask row's
// logits are lm_head(norm(embed(mask))), and the mask token is one whose
// argmax is the wanted token. It hands out float32 only.
type constantDFlash struct {
	dk  *model.DFlashCheckpoint
	cfg model.DFlashConfig
}

func (c *constantDFlash) DFlashConfig() *model.DFlashConfig { return &c.cfg }

func (c *constantDFlash) Float32(name string, shape ...int) ([]float32, error) {
	x, err := c.dk.Float32(name, shape...)
	if err == nil && (strings.HasSuffix(name, "o_proj.weight") || strings.HasSuffix(name, "down_proj.weight")) {
		clear(x)
	}
	return x, err
}

// newConstantDFlash finds the mask token of dk over the trunk ck whose draft
// is want (float64 on the host: the embedding, the drafter's final norm,
// the head), or fails.
func newConstantDFlash(t *testing.T, ck *model.Checkpoint, dk *model.DFlashCheckpoint, want int32) *constantDFlash {
	cfg, dc := ck.Config(), dk.DFlashConfig()
	D, V := dc.HiddenSize, cfg.VocabSize
	embed, err := ck.Float32("model.language_model.embed_tokens.weight", V, D)
	require.NoError(t, err)
	head, err := ck.Float32("lm_head.weight", V, D)
	require.NoError(t, err)
	norm, err := dk.Float32("norm.weight", D)
	require.NoError(t, err)
	for m := 0; m < V; m++ {
		x := embed[m*D : (m+1)*D]
		var ss float64
		for _, v := range x {
			ss += float64(v) * float64(v)
		}
		r := 1 / math.Sqrt(ss/float64(D)+dc.RMSNormEps)
		best, bestV := 0, math.Inf(-1)
		for v := 0; v < V; v++ {
			var s float64
			for i := range x {
				s += float64(head[v*D+i]) * float64(x[i]) * r * float64(norm[i])
			}
			if s > bestV {
				best, bestV = v, s
			}
		}
		if int32(best) == want {
			c := &constantDFlash{dk: dk, cfg: *dc}
			c.cfg.MaskTokenID = m
			return c
		}
	}
	t.Fatalf("no mask token drafts token %d", want)
	return nil
}

// builtinPasses is the default pass pipeline without prefill-autotune (its
// measurements on the emulator mean nothing).
func builtinPasses(t *testing.T) *pass.Pipeline {
	var reqs []pass.Request
	for _, r := range config.Default().Requests() {
		if r.Name != "prefill-autotune" {
			reqs = append(reqs, r)
		}
	}
	pl, err := pass.NewPipeline(reqs, true)
	require.NoError(t, err)
	return pl
}

// Greedy identity with speculative dflash on the GPU through the
// scheduler (block 8: verify spans of up to 8 tokens), on the tiny preset
// with chunked prefill and a plain request in the batches: a random drafter
// (its blocks nearly always rejected: the trunk cut back across a block at
// every verify) and one whose every draft is the plain run's most frequent
// token (accepted now and then: partial blocks kept, several context rows
// a draft), without and with the built-in passes, give every request
// exactly plain GPU decoding's tokens; the draft forward replays CUDA
// graphs, and with the passes the block verify does where its plan reads
// host lengths only (else it runs eagerly, reading the executor's lengths,
// as MTP's verify does). The CPU's DFlash run accepts what the GPU's does.
// Pinned at 0.8 per draft (its forwards still run), whole blocks are
// accepted with the same tokens.
func TestCUDASpecGreedyIdentityDFlash(t *testing.T) {
	ck := presetCheckpoint(t, "tiny")
	cfg := ck.Config()
	V := cfg.VocabSize
	reqs := []spectest.Request{
		{Prompt: seqTokens(21, 1, V), MaxTokens: 14},
		{Prompt: seqTokens(5, 2, V), MaxTokens: 12},
		{Prompt: seqTokens(9, 3, V), MaxTokens: 8, Plain: true},
	}
	sc := sched.Config{PrefillChunk: 8, MaxBatchTokens: 32}
	plain := spectest.Serve(t, cudaEngine(t, ck, engine.Options{Slots: 3}), sc, nil, reqs)
	count := map[int32]int{}
	var likely int32
	for _, o := range plain {
		for _, tok := range o.Tokens {
			count[tok]++
			if count[tok] > count[likely] || (count[tok] == count[likely] && tok < likely) {
				likely = tok
			}
		}
	}
	dk := dflashDrafter(t, cfg, 11)
	B := dk.DFlashConfig().BlockSize
	drafters := []struct {
		name  string
		model engine.DraftModel
	}{{"random", dk}, {"constant", newConstantDFlash(t, ck, dk, likely)}}
	for _, dr := range drafters {
		for _, passes := range []bool{false, true} {
			o := engine.Options{Slots: 3, Rollback: B, DFlash: dr.model}
			if passes {
				o.Passes, o.PassEnv = builtinPasses(t), config.Default().PassEnv(cfg, ck)
			}
			e := cudaEngine(t, ck, o)
			d, err := speculative.NewDFlash(e)
			require.NoError(t, err)
			got := spectest.Serve(t, e, sc, d, reqs)
			require.NoError(t, d.Close())
			spectest.RequireSameTokens(t, plain, got, dr.name+" drafter")
			var st speculative.Stats
			for _, x := range got {
				st = st.Add(x.Final.Spec)
			}
			require.Greater(t, st.Drafted, st.Steps, "blocks of several drafts were verified")
			if dr.name == "constant" {
				require.Positive(t, st.Accepted, "the constant drafter's drafts are accepted now and then")
			}
			t.Logf("%s drafter, passes %v: %d verify steps, %d drafts, %d accepted", dr.name, passes, st.Steps, st.Drafted, st.Accepted)
			draft, err := e.Program(speculative.DFlashKey)
			require.NoError(t, err)
			ds := backend.DeviceStatsOf(draft)
			require.Positive(t, ds.GraphReplays, "the draft forward replays CUDA graphs")
			t.Logf("draft forward: %d runs, %d graph captures, %d replays", ds.Runs, ds.GraphCaptures, ds.GraphReplays)
			if passes { // the block verify: host-length-reuse fires on it, so it replays graphs with no length read-back
				verify, err := e.Program(sched.SpecProgram(d))
				require.NoError(t, err)
				vs := backend.DeviceStatsOf(verify)
				require.True(t, verify.Plan().HostLengths, "host-length-reuse applies to block verifies")
				require.Positive(t, vs.GraphReplays, "block verifies replay CUDA graphs (with their target rows)")
				require.Zero(t, vs.LengthSyncs, "block verifies read no lengths back")
				t.Logf("block verify: host lengths %v, %d graph replays, %d length syncs", verify.Plan().HostLengths, vs.GraphReplays, vs.LengthSyncs)
			}
			if dr.name == "constant" && !passes {
				ce := newCPUEngine(t, ck, o)
				cd, err := speculative.NewDFlash(ce)
				require.NoError(t, err)
				cpuGot := spectest.Serve(t, ce, sc, cd, reqs)
				require.NoError(t, cd.Close())
				var cst speculative.Stats
				for _, x := range cpuGot {
					cst = cst.Add(x.Final.Spec)
				}
				require.Equal(t, cst, st, "the CPU's DFlash run verifies and accepts as the GPU's")
			}
		}
	}
	// the random drafter pinned at 0.8 per draft (speculative.Pinned: its
	// forwards run and it observes every commit, its drafts are the truth
	// spoiled at 20 %): blocks accepted in part and whole, context rows of
	// up to a block a draft
	e := cudaEngine(t, ck, engine.Options{Slots: 3, Rollback: B, DFlash: dk})
	inner, err := speculative.NewDFlash(e)
	require.NoError(t, err)
	pd, err := speculative.NewPinned(inner, speculative.PinnedOptions{Truth: spectest.Truth(plain, reqs), Rate: 0.8, Seed: 1, Vocab: V})
	require.NoError(t, err)
	got := spectest.Serve(t, e, sc, pd, reqs)
	require.NoError(t, pd.Close())
	spectest.RequireSameTokens(t, plain, got, "dflash pinned at 0.8")
	var st speculative.Stats
	for _, x := range got {
		st = st.Add(x.Final.Spec)
	}
	require.Greater(t, st.Accepted, st.Steps, "blocks were accepted")
	t.Logf("pinned at 0.8: %d verify steps, %d drafts, %d accepted", st.Steps, st.Drafted, st.Accepted)
	draft, err := e.Program(speculative.DFlashKey)
	require.NoError(t, err)
	require.Positive(t, backend.DeviceStatsOf(draft).GraphReplays, "the pinned drafter's forwards replay CUDA graphs")
}

// The GPU's DFlash drafter drafts what the CPU's does after every
// observation (accepted runs of 1 to 8 tokens, its context rows the CPU
// trunk's target-layer rows, observed in one batch or several), and its
// draft store then holds the CPU's lengths and K/V rows within fp32
// rounding: only committed positions.
func TestCUDADFlashDrafterMatchesCPU(t *testing.T) {
	ck := presetCheckpoint(t, "tiny")
	cfg := ck.Config()
	dk := dflashDrafter(t, cfg, 9)
	dc := dk.DFlashConfig()
	W, B := dc.ContextWidth(), dc.BlockSize
	toks := seqTokens(48, 8, cfg.VocabSize)
	ref := newCPUEngine(t, ck, engine.Options{Slots: 1, DFlash: dk})
	slot, err := ref.Store().Alloc()
	require.NoError(t, err)
	res, err := ref.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits, TargetHidden: true}, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: toks}}})
	require.NoError(t, err)
	ctx := res.Hidden[ir.OutputTargetHidden]
	require.Len(t, ctx, len(toks)*W)
	type state struct {
		drafts [][]int32
		draft  *cache.DraftSeq
	}
	run := func(e *engine.Engine) state {
		d, err := speculative.NewDFlash(e)
		require.NoError(t, err)
		defer d.Close()
		require.NoError(t, d.Start("s", toks[:7]))
		var out state
		pos := 0
		for i, n := range []int{7, 1, 4, 8, 2, 5, 3, 1, 6} {
			ob := speculative.Observation{Seq: "s", Pos0: pos, Tokens: toks[pos : pos+n], Next: toks[pos+n], Context: ctx[pos*W : (pos+n)*W], Verify: i > 0}
			require.NoError(t, d.Observe([]speculative.Observation{ob}))
			pos += n
			p := []speculative.Proposal{{Seq: "s", Max: B - 1}}
			require.NoError(t, d.Propose(p))
			out.drafts = append(out.drafts, p[0].Drafts)
		}
		ds, err := e.DraftStore()
		require.NoError(t, err)
		sl, ok := d.Slot("s")
		require.True(t, ok)
		out.draft, err = ds.(draftReader).ReadDraft(sl)
		require.NoError(t, err)
		return out
	}
	gpu := run(cudaEngine(t, ck, engine.Options{Slots: 1, Rollback: B, DFlash: dk}))
	cpu := run(newCPUEngine(t, ck, engine.Options{Slots: 1, Rollback: B, DFlash: dk}))
	require.Equal(t, cpu.drafts, gpu.drafts, "drafts per observation")
	require.Equal(t, cpu.draft.Len, gpu.draft.Len)
	for l := range cpu.draft.K {
		require.Less(t, maxDiff(cpu.draft.K[l], gpu.draft.K[l]), 2e-4, "layer %d K", l)
		require.Less(t, maxDiff(cpu.draft.V[l], gpu.draft.V[l]), 2e-4, "layer %d V", l)
	}
}

// Verify spans of a whole DFlash block (7 drafts) roll the GPU's trunk back
// exactly: rejected at the first draft, in the middle and never, the KDA
// windows and states, latents and indexer pools equal plain GPU decoding's
// bit for bit (spectest.RollbackRun at the block's span).
func TestCUDADFlashBlockVerifyRollsBack(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	e := cudaEngine(t, ck, engine.Options{Slots: 2, Rollback: 8})
	plain := spectest.PlainRun(t, e, seqTokens(23, 6, ck.Config().VocabSize), 30)
	wrong := map[int]bool{1: true, 12: true, 15: true, 27: true}
	steps := spectest.RollbackRun(t, e, plain, 7, wrong)
	rejected, full := 0, 0
	for _, s := range steps {
		if s.Accepted < len(s.Drafts) {
			rejected++
		} else {
			full++
		}
	}
	require.Greater(t, rejected, 1)
	require.Positive(t, full, "a block accepted whole")
}
