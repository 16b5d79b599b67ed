package tests

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/cache"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/core/speculative"
	"github.com/glmflash/glmflash/core/speculative/spectest"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/passes/dsameta"
	"github.com/glmflash/glmflash/passes/gateup"
	"github.com/glmflash/glmflash/passes/hostlen"
	"github.com/glmflash/glmflash/passes/kdafusion"
	"github.com/glmflash/glmflash/passes/mhcfusion"
	"github.com/glmflash/glmflash/passes/sharedoverlap"
	"github.com/stretchr/testify/require"
)

// dflashDrafter writes a random DFlash drafter for the trunk cfg (the
// tiny-dflash preset's sizes over cfg's hidden size and depth) and opens it.
func dflashDrafter(t testing.TB, cfg *model.Config, seed int64) *model.DFlashCheckpoint {
	return presetDrafter(t, "tiny-dflash", cfg, seed)
}

// presetDrafter writes the random drafter of a -dflash preset for cfg.
func presetDrafter(t testing.TB, preset string, cfg *model.Config, seed int64) *model.DFlashCheckpoint {
	return spectest.DFlashDrafter(t, preset, cfg, seed)
}

// naiveDFlash is z-lab's DFlashDraftModel forward (dflash/model.py) for
// one sequence written out directly in float64, independent of the graph
// builder and the kernels: it keeps every context row it was given and
// recomputes every layer's context K/V from them on each call.
type naiveDFlash struct {
	d       *model.DFlashConfig
	w       func(name string, shape ...int) []float64
	embed   []float64 // [V][D]
	head    []float64 // [V][D]
	V       int
	context [][]float64 // every context row so far ([targets·D])
}

func newNaiveDFlash(t testing.TB, ck *model.Checkpoint, dk *model.DFlashCheckpoint) *naiveDFlash {
	get := func(src interface {
		Float32(string, ...int) ([]float32, error)
	}, name string, shape ...int) []float64 {
		x, err := src.Float32(name, shape...)
		require.NoError(t, err, name)
		y := make([]float64, len(x))
		for i, v := range x {
			y[i] = float64(v)
		}
		return y
	}
	cfg := ck.Config()
	return &naiveDFlash{d: dk.DFlashConfig(), V: cfg.VocabSize,
		w:     func(name string, shape ...int) []float64 { return get(dk, name, shape...) },
		embed: get(ck, model.EmbedName, cfg.VocabSize, cfg.HiddenSize), head: get(ck, model.LMHeadName, cfg.VocabSize, cfg.HiddenSize)}
}

func (n *naiveDFlash) rmsnorm(x, w []float64, eps float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	r := 1 / math.Sqrt(ss/float64(len(x))+eps)
	y := make([]float64, len(x))
	for i := range x {
		y[i] = w[i] * x[i] * r
	}
	return y
}

// linear is nn.Linear without bias: y = W·x, W [out][in].
func linear(w, x []float64, out int) []float64 {
	in := len(x)
	y := make([]float64, out)
	for o := 0; o < out; o++ {
		for i := 0; i < in; i++ {
			y[o] += w[o*in+i] * x[i]
		}
	}
	return y
}

// rope is apply_rotary_pos_emb on one head: x·cos + rotate_half(x)·sin,
// with rotate_half(x) = [−x2, x1] and Qwen3RotaryEmbedding's frequencies.
func (n *naiveDFlash) rope(x []float64, pos int) []float64 {
	hd := len(x)
	y := make([]float64, hd)
	for i := 0; i < hd; i++ {
		f := float64(pos) / math.Pow(n.d.RopeTheta, float64(2*(i%(hd/2)))/float64(hd))
		rot := -x[(i+hd/2)%hd]
		if i >= hd/2 {
			rot = x[i-hd/2]
		}
		y[i] = x[i]*math.Cos(f) + rot*math.Sin(f)
	}
	return y
}

// draft runs one draft: newCtx context rows (positions L..L+c−1, L the rows
// given before) and the block tokens (positions L+c..), and returns the
// logits of the block's rows 1..B−1.
func (n *naiveDFlash) draft(newCtx [][]float64, block []int32) [][]float64 {
	d := n.d
	D, hd, Hq, Hkv := d.HiddenSize, d.HeadDim, d.NumAttentionHeads, d.NumKeyValueHeads
	n.context = append(n.context, newCtx...)
	C, B := len(n.context), len(block)
	fc, hn := n.w("fc.weight", D, d.ContextWidth()), n.w("hidden_norm.weight", D)
	ctx := make([][]float64, C)
	for j, row := range n.context {
		ctx[j] = n.rmsnorm(linear(fc, row, D), hn, d.RMSNormEps)
	}
	x := make([][]float64, B)
	for b, tok := range block {
		x[b] = append([]float64(nil), n.embed[int(tok)*D:(int(tok)+1)*D]...)
	}
	for l := 0; l < d.NumHiddenLayers; l++ {
		w := func(rest string, shape ...int) []float64 { return n.w(model.DFlashLayerName(l, rest), shape...) }
		qw, kw, vw, ow := w("self_attn.q_proj.weight", Hq*hd, D), w("self_attn.k_proj.weight", Hkv*hd, D), w("self_attn.v_proj.weight", Hkv*hd, D), w("self_attn.o_proj.weight", D, Hq*hd)
		qn, kn := w("self_attn.q_norm.weight", hd), w("self_attn.k_norm.weight", hd)
		h := make([][]float64, B)
		for b := range x {
			h[b] = n.rmsnorm(x[b], w("input_layernorm.weight", D), d.RMSNormEps)
		}
		// k, v of [context; block] at positions 0..C+B−1 (z-lab concatenates
		// k_ctx and k_noise, norms, then rotates with the full position range)
		type kv struct{ k, v []float64 }
		keys := make([][]kv, Hkv)
		src := append(append([][]float64(nil), ctx...), h...)
		for j, row := range src {
			kr, vr := linear(kw, row, Hkv*hd), linear(vw, row, Hkv*hd)
			for g := 0; g < Hkv; g++ {
				keys[g] = append(keys[g], kv{n.rope(n.rmsnorm(kr[g*hd:(g+1)*hd], kn, d.RMSNormEps), j), vr[g*hd : (g+1)*hd]})
			}
		}
		for b := range x {
			qr := linear(qw, h[b], Hq*hd)
			o := make([]float64, Hq*hd)
			for hh := 0; hh < Hq; hh++ {
				q := n.rope(n.rmsnorm(qr[hh*hd:(hh+1)*hd], qn, d.RMSNormEps), C+b)
				ks := keys[hh/(Hq/Hkv)]
				s := make([]float64, len(ks))
				m := math.Inf(-1)
				for j, e := range ks { // non-causal: every context and block key
					for i := range q {
						s[j] += q[i] * e.k[i]
					}
					s[j] /= math.Sqrt(float64(hd))
					m = math.Max(m, s[j])
				}
				var sum float64
				for j := range s {
					s[j] = math.Exp(s[j] - m)
					sum += s[j]
				}
				for j, e := range ks {
					for i := 0; i < hd; i++ {
						o[hh*hd+i] += s[j] / sum * e.v[i]
					}
				}
			}
			a := linear(ow, o, D)
			for i := range x[b] {
				x[b][i] += a[i]
			}
		}
		I := d.IntermediateSize
		gw, uw, dw := w("mlp.gate_proj.weight", I, D), w("mlp.up_proj.weight", I, D), w("mlp.down_proj.weight", D, I)
		for b := range x {
			h2 := n.rmsnorm(x[b], w("post_attention_layernorm.weight", D), d.RMSNormEps)
			gt, up := linear(gw, h2, I), linear(uw, h2, I)
			act := make([]float64, I)
			for i := range act {
				act[i] = gt[i] / (1 + math.Exp(-gt[i])) * up[i]
			}
			m := linear(dw, act, D)
			for i := range x[b] {
				x[b][i] += m[i]
			}
		}
	}
	out := make([][]float64, 0, B-1)
	for b := 1; b < B; b++ {
		out = append(out, linear(n.head, n.rmsnorm(x[b], n.w("norm.weight", D), d.RMSNormEps), n.V))
	}
	return out
}

// The draft program computes z-lab's DFlashDraftModel: on the tiny-a
// fixture's trunk with a random drafter, two sequences drafting three
// times each (context rows of 5, 0 and 3 new positions, batched together)
// give the logits of an independent float64 implementation of
// dflash/model.py (context K/V recomputed from every row given so far),
// and the draft store holds exactly the context positions given.
func TestDFlashForwardMatchesNaiveZLab(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	cfg := ck.Config()
	dk := dflashDrafter(t, cfg, 7)
	d := dk.DFlashConfig()
	var reqs []pass.Request
	for _, name := range []string{gateup.Name, kdafusion.Name, mhcfusion.Name, dsameta.Name, hostlen.Name, sharedoverlap.Name} {
		reqs = append(reqs, pass.Request{Name: name})
	}
	pl, err := pass.NewPipeline(reqs, true)
	require.NoError(t, err)
	var e *engine.Engine
	var st backend.Store
	var slots []int
	for _, withPasses := range []bool{true, false} { // the plain engine's store is checked below
		o := engine.Options{Slots: 2, DFlash: dk}
		if withPasses {
			o.Passes, o.PassEnv = pl, config.Default().PassEnv(cfg, ck)
		}
		e = newEngine(t, ck, o)
		st, err = e.DraftStore()
		require.NoError(t, err)
		r := rand.New(rand.NewPCG(1, 2))
		W, B := d.ContextWidth(), d.BlockSize
		naive := []*naiveDFlash{newNaiveDFlash(t, ck, dk), newNaiveDFlash(t, ck, dk)}
		slots = make([]int, 2)
		for i := range slots {
			slots[i], err = st.Alloc()
			require.NoError(t, err)
		}
		for step, cs := range [][2]int{{5, 2}, {0, 1}, {3, 4}} {
			b := &backend.Batch{}
			var wants [][][]float64
			for i, c := range cs {
				rows := make([]float32, c*W)
				newCtx := make([][]float64, c)
				for j := range newCtx {
					newCtx[j] = make([]float64, W)
					for k := range newCtx[j] {
						v := float32(r.NormFloat64())
						rows[j*W+k], newCtx[j][k] = v, float64(v)
					}
				}
				block := make([]int32, B)
				block[0] = int32(r.IntN(cfg.VocabSize))
				for j := 1; j < B; j++ {
					block[j] = int32(d.MaskTokenID)
				}
				b.Seqs = append(b.Seqs, backend.Seq{Slot: slots[i], Tokens: block, Context: rows, LogitRows: B - 1})
				wants = append(wants, naive[i].draft(newCtx, block))
			}
			res, err := e.Run(speculative.DFlashKey, b)
			require.NoError(t, err)
			require.Equal(t, 2*(B-1), res.Rows)
			for i := range cs {
				for j, want := range wants[i] {
					got := res.Row(i*(B-1) + j)
					for v := range want {
						require.InDelta(t, want[v], float64(got[v]), 2e-3*(1+math.Abs(want[v])), "passes %v, step %d sequence %d draft row %d logit %d", withPasses, step, i, j, v)
					}
				}
				n, err := st.Len(slots[i])
				require.NoError(t, err)
				require.Equal(t, len(naive[i].context), n, "the draft store holds the context positions given, never the block's")
			}
		}
		if withPasses {
			rep := e.Report(speculative.DFlashKey).Find(gateup.Name)
			require.Len(t, rep.Fired, d.NumHiddenLayers, "every draft layer's gate and up projections were fused")
		}
	}
	W, B := d.ContextWidth(), d.BlockSize
	// a batch that does not hold whole blocks, or context rows of another
	// width, is refused and changes nothing
	before, _ := st.Len(slots[0])
	_, err = e.Run(speculative.DFlashKey, &backend.Batch{Seqs: []backend.Seq{{Slot: slots[0], Tokens: make([]int32, B-1), Context: make([]float32, W), LogitRows: B - 2}}})
	require.ErrorContains(t, err, fmt.Sprintf("has %d block rows, the block is %d", B-1, B))
	after, _ := st.Len(slots[0])
	require.Equal(t, before, after)
	ds := st.(*cache.DraftStore)
	q, err := ds.ReadDraft(slots[0])
	require.NoError(t, err)
	require.Len(t, q.K[0], before*d.KVWidth(), "the failed run's appended rows were rewound")
	_, err = e.Run(speculative.DFlashKey, &backend.Batch{Seqs: []backend.Seq{{Slot: slots[0], Tokens: make([]int32, B), Context: make([]float32, W+1), LogitRows: B - 1}}})
	require.ErrorContains(t, err, "are not whole rows of")
}

// The trunk's capture for the drafter comes out of the pass itself: a
// verify-mode program with TargetHidden gives the same logits as without
// (bit for bit), and its target_hidden rows are the stream means after the
// drafter's target layers — the hidden.L captures averaged over streams.
func TestDFlashTargetHiddenCapture(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	cfg := ck.Config()
	dk := dflashDrafter(t, cfg, 7)
	ids := dk.DFlashConfig().TargetLayerIDs
	e := newEngine(t, ck, engine.Options{Slots: 1, DFlash: dk})
	toks := seqTokens(13, 4, cfg.VocabSize)
	run := func(key engine.Key) *backend.Result {
		slot, err := e.Store().Alloc()
		require.NoError(t, err)
		defer func() { require.NoError(t, e.Store().Free(slot)) }()
		res, err := e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: toks, LogitRows: len(toks)}}})
		require.NoError(t, err)
		return res
	}
	with := run(engine.Key{Mode: graph.Verify, Logits: graph.SpanLogits, TargetHidden: true})
	plain := run(engine.Key{Mode: graph.Verify, Logits: graph.SpanLogits, CaptureHidden: true})
	require.Equal(t, plain.Logits, with.Logits)
	got := with.Hidden[ir.OutputTargetHidden]
	D, H := cfg.HiddenSize, cfg.HCMult
	require.Len(t, got, len(toks)*len(ids)*D)
	for i, l := range ids {
		streams := plain.Hidden[ir.HiddenOutput(l)]
		for tk := range toks {
			for c := 0; c < D; c++ {
				var s float64
				for h := 0; h < H; h++ {
					s += float64(streams[(tk*H+h)*D+c])
				}
				require.InDelta(t, s/float64(H), float64(got[(tk*len(ids)+i)*D+c]), 1e-5, "token %d layer %d column %d", tk, l, c)
			}
		}
	}
	// the passes keep the capture: the same rows (within fp32 rounding of
	// the fused kernels) and logits
	var reqs []pass.Request
	for _, name := range []string{gateup.Name, kdafusion.Name, mhcfusion.Name, dsameta.Name, hostlen.Name, sharedoverlap.Name} {
		reqs = append(reqs, pass.Request{Name: name})
	}
	pl, err := pass.NewPipeline(reqs, true)
	require.NoError(t, err)
	pe := newEngine(t, ck, engine.Options{Slots: 1, DFlash: dk, Passes: pl, PassEnv: config.Default().PassEnv(cfg, ck)})
	slot, err := pe.Store().Alloc()
	require.NoError(t, err)
	key := engine.Key{Mode: graph.Verify, Logits: graph.SpanLogits, TargetHidden: true}
	pres, err := pe.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: toks, LogitRows: len(toks)}}})
	require.NoError(t, err)
	require.NotEmpty(t, pe.Report(key).Find(mhcfusion.Name).Fired, "mHC boundaries fuse beside the capture")
	pgot := pres.Hidden[ir.OutputTargetHidden]
	require.Len(t, pgot, len(got))
	for i := range got {
		require.InDelta(t, got[i], pgot[i], 1e-4*(1+math.Abs(float64(got[i]))), "target_hidden value %d with the passes", i)
	}
	for i := range with.Logits {
		require.InDelta(t, with.Logits[i], pres.Logits[i], 1e-4*(1+math.Abs(float64(with.Logits[i]))), "logit %d with the passes", i)
	}
	_, err = newEngine(t, ck, engine.Options{Slots: 1}).Program(key)
	require.ErrorContains(t, err, "needs a DFlash drafter")
}

// The drafter's state after rejected blocks is what it would be had it only
// seen the committed tokens: a sequence that drafts between observations of
// every length (accepted runs of 1..B tokens) and one told the same
// committed tokens without drafting hold equal draft K/V bit for bit and
// give the same drafts; the store holds only committed positions.
func TestDFlashDrafterStateFollowsCommits(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	cfg := ck.Config()
	dk := dflashDrafter(t, cfg, 9)
	dc := dk.DFlashConfig()
	W := dc.ContextWidth()
	e := newEngine(t, ck, engine.Options{Slots: 4, DFlash: dk})
	toks := seqTokens(70, 8, cfg.VocabSize)
	slot, err := e.Store().Alloc()
	require.NoError(t, err)
	res, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits, TargetHidden: true}, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: toks}}})
	require.NoError(t, err)
	require.NoError(t, e.Store().Free(slot))
	ctx := res.Hidden[ir.OutputTargetHidden]
	d, err := speculative.NewDFlash(e)
	require.NoError(t, err)
	require.Equal(t, dc.BlockSize-1, d.MaxDrafts())
	require.Equal(t, speculative.Needs{TargetHidden: true}, d.Needs())
	require.NoError(t, d.Start("spec", toks[:9]))
	require.NoError(t, d.Start("ref", toks[:9]))
	ds, err := e.DraftStore()
	require.NoError(t, err)
	obs := func(id string, pos0, n int) speculative.Observation {
		return speculative.Observation{Seq: id, Pos0: pos0, Tokens: toks[pos0 : pos0+n], Next: toks[pos0+n], Context: ctx[pos0*W : (pos0+n)*W], Verify: pos0 > 0}
	}
	pos := 0
	var refPending []speculative.Observation
	for i, n := range []int{9, 1, 3, 8, 2, 4, 5, 1, 7, 6, 2, 3} {
		if i > 0 { // spec drafts a block (rejected or not: only n tokens commit)
			props := []speculative.Proposal{{Seq: "spec", Max: 16}}
			require.NoError(t, d.Propose(props))
			require.Len(t, props[0].Drafts, dc.BlockSize-1)
			require.Nil(t, props[0].Q, "top-1 drafts")
		}
		require.NoError(t, d.Observe([]speculative.Observation{obs("spec", pos, n)}))
		refPending = append(refPending, obs("ref", pos, n))
		pos += n
		observed, stored, err := d.Committed("spec")
		require.NoError(t, err)
		require.Equal(t, pos, observed)
		require.LessOrEqual(t, stored, pos, "the store holds committed positions only")
		// ref is told the same tokens (in one observation every third
		// step) and drafts only to compare
		if i%3 == 2 || i == 11 {
			require.NoError(t, d.Observe(refPending))
			refPending = nil
			pa, pb := []speculative.Proposal{{Seq: "spec", Max: 3}}, []speculative.Proposal{{Seq: "ref", Max: 3}}
			require.NoError(t, d.Propose(pa))
			require.NoError(t, d.Propose(pb))
			require.Equal(t, pb[0].Drafts, pa[0].Drafts, "drafts after %d tokens", pos)
			require.Len(t, pa[0].Drafts, 3)
			a, _ := d.Slot("spec")
			b, _ := d.Slot("ref")
			sa, err := ds.(*cache.DraftStore).ReadDraft(a)
			require.NoError(t, err)
			sb, err := ds.(*cache.DraftStore).ReadDraft(b)
			require.NoError(t, err)
			require.Equal(t, pos, sa.Len, "after a draft the store holds every committed position")
			require.Equal(t, sb.Len, sa.Len)
			for l := range sa.K {
				require.Equal(t, sb.K[l], sa.K[l], "layer %d K after %d tokens", l, pos)
				require.Equal(t, sb.V[l], sa.V[l], "layer %d V after %d tokens", l, pos)
			}
		}
	}
	// an observation out of order, or without the context rows, is refused
	require.ErrorContains(t, d.Observe([]speculative.Observation{obs("spec", pos-1, 1)}), "the drafter holds")
	require.ErrorContains(t, d.Observe([]speculative.Observation{{Seq: "ref", Pos0: pos, Tokens: toks[pos : pos+1], Next: 1}}), "context values")
	require.NoError(t, d.Close())
	require.Zero(t, ds.InUse())
}

// dflashEngine is an engine on ck with a random drafter, rolling back a
// block.
func dflashEngine(t *testing.T, ck *model.Checkpoint, dk *model.DFlashCheckpoint, slots int) *engine.Engine {
	return newEngine(t, ck, engine.Options{Slots: slots, Rollback: dk.DFlashConfig().BlockSize, DFlash: dk})
}

// Greedy identity with the DFlash drafter (block 8: verify spans of up to
// 8 tokens): on the three transformers fixtures and the tiny-dflash and
// small-dflash presets,
// in mixed batches with chunked prefill and a plain request, every request
// gets exactly plain decoding's tokens. A random drafter's blocks are
// nearly always rejected, so every verify cuts the trunk's KDA states and
// indexer pools back across a block; pinned at 0.8 per draft (its drafts
// replaced by the truth spoiled at 20 %) blocks are accepted in part and
// whole, and the drafter observes runs of up to 8 tokens. The counts are
// logged.
func TestSpecGreedyIdentityDFlash(t *testing.T) {
	type src struct {
		name string
		open func(t *testing.T) *model.Checkpoint
	}
	drafterOf := func(name string) string { // a preset's own drafter, tiny-dflash's for a fixture
		if randckpt.IsDFlashPreset(name) {
			return name
		}
		return "tiny-dflash"
	}
	var srcs []src
	for _, f := range fixtures {
		srcs = append(srcs, src{f, func(t *testing.T) *model.Checkpoint { ck, _ := openFixture(t, f); return ck }})
	}
	srcs = append(srcs, src{"tiny-dflash", func(t *testing.T) *model.Checkpoint { return mtpPreset(t, "tiny-dflash") }})
	if !raceEnabled { // as small-mtp: the race pass runs the same code on the tiny models
		srcs = append(srcs, src{"small-dflash", func(t *testing.T) *model.Checkpoint { return mtpPreset(t, "small-dflash") }})
	}
	for _, s := range srcs {
		t.Run(s.name, func(t *testing.T) {
			ck := s.open(t)
			V := ck.Config().VocabSize
			reqs := specRequests(V)
			cfg := sched.Config{PrefillChunk: 16, MaxBatchTokens: 64}
			plain := spectest.Serve(t, newEngine(t, ck, engine.Options{Slots: 4}), cfg, nil, reqs)
			dk := presetDrafter(t, drafterOf(s.name), ck.Config(), 11)
			e := dflashEngine(t, ck, dk, 4)
			d, err := speculative.NewDFlash(e)
			require.NoError(t, err)
			got := spectest.Serve(t, e, cfg, d, reqs)
			require.NoError(t, d.Close())
			spectest.RequireSameTokens(t, plain, got, "dflash")
			var st speculative.Stats
			for _, x := range got {
				st = st.Add(x.Final.Spec)
			}
			require.Greater(t, st.Steps, 0)
			require.Greater(t, st.Drafted, st.Steps, "blocks of several drafts were verified")
			for i, x := range got { // the drafter never dropped out: every token after the first came from a verify step
				if !reqs[i].Plain && len(x.Tokens) > 1 { // the last token decodes plainly (no room for drafts)
					require.GreaterOrEqual(t, x.Final.Spec.Steps+x.Final.Spec.Accepted, len(x.Tokens)-2, "request %d", i)
				}
			}
			t.Logf("dflash block %d: %d verify steps, %d drafts, %d accepted (acceptance length %.2f)", dk.DFlashConfig().BlockSize, st.Steps, st.Drafted, st.Accepted, st.AcceptanceLength())

			// the drafter pinned at 0.8 per draft (speculative.Pinned: its
			// forwards run and it observes every commit, its drafts are the
			// truth spoiled at 20 %): blocks accepted in part and whole
			inner, err := speculative.NewDFlash(e)
			require.NoError(t, err)
			pd, err := speculative.NewPinned(inner, speculative.PinnedOptions{Truth: spectest.Truth(plain, reqs), Rate: 0.8, Seed: 1, Vocab: V})
			require.NoError(t, err)
			got = spectest.Serve(t, e, cfg, pd, reqs)
			require.NoError(t, pd.Close())
			spectest.RequireSameTokens(t, plain, got, "dflash pinned at 0.8")
			st = speculative.Stats{}
			for _, x := range got {
				st = st.Add(x.Final.Spec)
			}
			require.Greater(t, st.Accepted, st.Steps, "blocks were accepted")
			t.Logf("dflash pinned at 0.8: %d verify steps, %d drafts, %d accepted (acceptance length %.2f)", st.Steps, st.Drafted, st.Accepted, st.AcceptanceLength())
		})
	}
}

// Verify spans of a whole DFlash block roll the trunk back exactly: on
// every fixture, spans of 7 drafts (block 8) rejected at their first
// draft, in the middle and never leave the KDA windows and states, latents
// and indexer pools equal to plain decoding's, bit for bit
// (spectest.RollbackRun at the block's span).
func TestDFlashBlockVerifyRollsBack(t *testing.T) {
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			ck, _ := openFixture(t, name)
			e := newEngine(t, ck, engine.Options{Slots: 2, Rollback: 8})
			plain := spectest.PlainRun(t, e, seqTokens(23, 6, ck.Config().VocabSize), 30)
			wrong := map[int]bool{1: true, 12: true, 15: true, 27: true}
			steps := spectest.RollbackRun(t, e, plain, 7, wrong)
			rejected := 0
			for _, s := range steps {
				if s.Accepted < len(s.Drafts) {
					rejected++
				}
			}
			require.Greater(t, rejected, 1)
		})
	}
}

// constantDrafter is a drafter whose every draft is one token: its layers'
// o_proj and down_proj are zero (each layer adds nothing), so a mask row's
// logits are lm_head(norm(embed(mask))); the mask token is chosen so that
// this argmax is want. It hands out float32 only (no stored bytes).
type constantDrafter struct {
	dk  *model.DFlashCheckpoint
	cfg model.DFlashConfig
}

func (c *constantDrafter) DFlashConfig() *model.DFlashConfig { return &c.cfg }

func (c *constantDrafter) Float32(name string, shape ...int) ([]float32, error) {
	x, err := c.dk.Float32(name, shape...)
	if err == nil && (strings.HasSuffix(name, "o_proj.weight") || strings.HasSuffix(name, "down_proj.weight")) {
		clear(x)
	}
	return x, err
}

func argmax64(x []float64) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}

func newConstantDrafter(t *testing.T, ck *model.Checkpoint, dk *model.DFlashCheckpoint, want int32) *constantDrafter {
	n := newNaiveDFlash(t, ck, dk)
	D, V := dk.DFlashConfig().HiddenSize, ck.Config().VocabSize
	norm := n.w("norm.weight", D)
	for m := 0; m < V; m++ {
		y := n.rmsnorm(n.embed[m*D:(m+1)*D], norm, dk.DFlashConfig().RMSNormEps)
		if argmax64(linear(n.head, y, V)) == want {
			c := &constantDrafter{dk: dk, cfg: *dk.DFlashConfig()}
			c.cfg.MaskTokenID = m
			return c
		}
	}
	t.Fatalf("no mask token of the vocabulary drafts token %d", want)
	return nil
}

// Sampled requests keep the target's distribution with the DFlash drafter:
// requests at temperature 0.8 (top-k 6) draw their first token plainly and
// the next from a verify span of the drafter's block (deterministic
// drafts: q one-hot); the joint distribution of the first two tokens
// matches p(t1)·p(t2|t1) from plain forward passes (chi-square,
// significance 1e-3; seeds fixed). Two drafters: a random one (its drafts
// nearly always rejected: the residual distribution decides) and one whose
// drafts are the target's likely second token (accepted often: the
// acceptance decides).
func TestSpecSamplingMatchesTargetDFlash(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	V := ck.Config().VocabSize
	params := sample.Params{Temperature: 0.8, TopK: 6, TopP: 1}
	prompt := seqTokens(5, 11, V)
	dk := dflashDrafter(t, ck.Config(), 13)
	pe := newEngine(t, ck, engine.Options{Slots: 1})
	last := func(toks []int32) []float32 {
		slot, err := pe.Store().Alloc()
		require.NoError(t, err)
		defer func() { require.NoError(t, pe.Store().Free(slot)) }()
		res, err := pe.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: toks}}})
		require.NoError(t, err)
		return res.Row(0)
	}
	want := map[[2]int32]float64{}
	ids1, p1 := sample.Dist(last(prompt), params)
	var likely int32
	for i, a := range ids1 {
		ids2, p2 := sample.Dist(last(append(append([]int32(nil), prompt...), int32(a))), params)
		for j, b := range ids2 {
			want[[2]int32{int32(a), int32(b)}] = p1[i] * p2[j]
			if i == 0 && j == 0 {
				likely = int32(b)
			}
		}
	}
	for _, drafter := range []struct {
		name  string
		model engine.DraftModel
	}{{"random", dk}, {"likely", newConstantDrafter(t, ck, dk, likely)}} {
		t.Run(drafter.name, func(t *testing.T) {
			e := newEngine(t, ck, engine.Options{Slots: 8, Rollback: dk.DFlashConfig().BlockSize, DFlash: drafter.model})
			d, err := speculative.NewDFlash(e)
			require.NoError(t, err)
			defer d.Close()
			n := 2000
			if raceEnabled {
				n = 400
			}
			reqs := make([]spectest.Request, n)
			for i := range reqs {
				p := params
				p.Seed = uint64(i + 1)
				reqs[i] = spectest.Request{ID: fmt.Sprintf("r%d", i), Prompt: prompt, MaxTokens: 3, Sampling: p}
			}
			outs := spectest.Serve(t, e, sched.Config{MaxQueue: n}, d, reqs)
			counts := map[[2]int32]int{}
			var st speculative.Stats
			for _, o := range outs {
				require.Len(t, o.Tokens, 3)
				counts[[2]int32{o.Tokens[0], o.Tokens[1]}]++
				st = st.Add(o.Final.Spec)
			}
			require.GreaterOrEqual(t, st.Steps, n, "every request verified drafts after its first token")
			if drafter.name == "likely" {
				require.Greater(t, st.Accepted, n/20, "the likely drafter's drafts are accepted")
			}
			x, df := pairChiSquare(t, counts, want, n)
			pv := chiSquarePValue(x, df)
			t.Logf("%s drafter: %d verify steps, %d drafted, %d accepted; χ²=%.1f with %d degrees of freedom, p=%.3f", drafter.name, st.Steps, st.Drafted, st.Accepted, x, df, pv)
			require.Greater(t, pv, 1e-3)
		})
	}
}

// The refusals: a drafter that does not fit the trunk is refused by the
// engine naming the key; the drafter needs an engine with a drafter; the
// configuration's -dflash preset suffix is randckpt's.
func TestDFlashRefusals(t *testing.T) {
	ck, _ := openFixture(t, fixtures[1]) // tiny-b: hidden 48, 6 layers
	other, _ := openFixture(t, fixtures[0])
	dk := dflashDrafter(t, other.Config(), 3) // made for tiny-a: hidden 64
	_, err := engine.New(ck.Config(), ck, engine.Options{Slots: 1, DFlash: dk})
	require.ErrorContains(t, err, "hidden_size 64 is not the target's 48")
	e := newEngine(t, ck, engine.Options{Slots: 1})
	_, err = speculative.NewDFlash(e)
	require.ErrorContains(t, err, "needs a DFlash drafter (speculative.draft_model)")
	_, err = e.DraftStore()
	require.ErrorContains(t, err, "no DFlash drafter")
	require.Equal(t, randckpt.DFlashSuffix, config.DFlashPresetSuffix)
}
