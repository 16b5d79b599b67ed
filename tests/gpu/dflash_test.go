package gpu

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/backend/cpu"
	cudabe "github.com/glmflash/glmflash/core/backend/cuda"
	"github.com/glmflash/glmflash/core/cache"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/passes/hostlen"
	"github.com/stretchr/testify/require"
)

// mapWeights is a plan.Weights of named float32 tensors.
type mapWeights map[string][]float32

func (m mapWeights) Float32(name string, shape ...int) ([]float32, error) {
	w, ok := m[name]
	if !ok {
		return nil, fmt.Errorf("no tensor %s", name)
	}
	n := 1
	for _, d := range shape {
		n *= d
	}
	if n != len(w) {
		return nil, fmt.Errorf("tensor %s has %d values, want %v", name, len(w), shape)
	}
	return w, nil
}

// miniDraft is a small DFlash draft graph (two draft layers over a context
// projection and the block's embeddings; the backends' dflash_attn and
// the GEMMs around it) with its random weights.
type miniDraft struct {
	g                       *ir.Graph
	w                       mapWeights
	V, D, W, Hq, Hkv, hd, B int
	layers                  int
}

func newMiniDraft(r *rand.Rand) *miniDraft {
	m := &miniDraft{V: 61, D: 48, W: 72, Hq: 4, Hkv: 2, hd: 64, B: 4, layers: 2, w: mapWeights{}}
	g := ir.New("dflash-mini")
	g.SetDFlash()
	weight := func(name string, scale float64, shape ...int) *ir.Value {
		n := 1
		for _, d := range shape {
			n *= d
		}
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64() * scale)
		}
		m.w[name] = x
		return g.AddWeight(name, shape...)
	}
	tokens := g.AddInput(ir.InputTokens, ir.I32, ir.DimT)
	batch := g.AddInput(ir.InputBatch, ir.Host)
	ctx := g.AddInput(ir.InputContext, ir.F32, ir.DimC, m.W)
	x := g.Op1(ir.OpEmbed, -1, nil, tokens, weight("embed", 1, m.V, m.D))
	hc := g.Op1(ir.OpLinear, -1, nil, ctx, weight("fc", 0.1, m.D, m.W))
	Q, KV := m.Hq*m.hd, m.Hkv*m.hd
	for l := 0; l < m.layers; l++ {
		p := fmt.Sprintf("layers.%d.", l)
		wq, wk, wv := weight(p+"q", 0.2, Q, m.D), weight(p+"k", 0.2, KV, m.D), weight(p+"v", 0.2, KV, m.D)
		o := g.Op1(ir.OpDFlashAttn, l, ir.NewAttrs(ir.AttrHeads.Is(m.Hq), ir.AttrKVHeads.Is(m.Hkv), ir.AttrHeadDim.Is(m.hd), ir.AttrEps.Is(1e-6), ir.AttrRopeTheta.Is(1e6), ir.AttrBlock.Is(m.B)),
			batch, g.Op1(ir.OpLinear, l, nil, x, wq), g.Op1(ir.OpLinear, l, nil, x, wk), g.Op1(ir.OpLinear, l, nil, x, wv),
			g.Op1(ir.OpLinear, l, nil, hc, wk), g.Op1(ir.OpLinear, l, nil, hc, wv), weight(p+"q_norm", 0.3, m.hd), weight(p+"k_norm", 0.3, m.hd))
		x = g.Op1(ir.OpAdd, l, nil, x, g.Op1(ir.OpLinear, l, nil, o, weight(p+"o", 0.1, m.D, Q)))
	}
	g.Outputs[ir.OutputLogits] = g.Op1(ir.OpLinear, -1, nil, x, weight("lm_head", 0.2, m.V, m.D))
	m.g = g
	return m
}

// draftReader is a store that copies a slot's draft K/V rows to the host
// (cache.DraftStore and the CUDA backend's DraftStore).
type draftReader interface {
	ReadDraft(slot int) (*cache.DraftSeq, error)
}

// openCUDABackend opens the CUDA backend with graphs bounded by graphMax
// (−1: none), or skips.
func openCUDABackend(t *testing.T, graphMax int) *cudabe.Backend {
	t.Helper()
	cudaOptions(t, engine.Options{})
	be, err := cudabe.Open(backend.Options{Device: cudabe.Options{GraphMaxTokens: graphMax}})
	require.NoError(t, err)
	t.Cleanup(func() { be.Close() })
	return be
}

// The CUDA draft forward of a DFlash draft graph equals the CPU backend's
// within fp32 rounding over a run of drafts of two sequences — context rows
// 0 to 5 per draft (a sequence's first draft with none, whole batches with
// none), some drafts cut back under a checkpoint — with the draft stores'
// lengths and K/V rows alike after every step, and a slot copied onto
// another drafting as its source in one batch beside it; the same
// drafts from CUDA graphs (captured per count of context rows, replayed
// after) give the eager launches' bits, and the draft store refuses what
// the contract does not allow.
func TestCUDADFlashDraftMatchesCPU(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 2))
	m := newMiniDraft(r)
	pl, err := plan.Compile(m.g, m.w, plan.Options{MaxPositions: 64})
	require.NoError(t, err)
	graphed, eager := openCUDABackend(t, 0), openCUDABackend(t, -1)
	cpuBe := cpu.New(backend.Options{})
	type side struct {
		name string
		prog backend.Program
		st   backend.Store
	}
	const slots, maxPos = 3, 64
	var sides []side
	cpuProg, err := cpuBe.Compile(pl)
	require.NoError(t, err)
	cpuSt, err := cache.NewDraftStore(m.layers, m.Hkv*m.hd, slots)
	require.NoError(t, err)
	sides = append(sides, side{"cpu", cpuProg, cpuSt})
	for _, c := range []struct {
		name string
		be   *cudabe.Backend
	}{{"cuda-graphs", graphed}, {"cuda-eager", eager}} {
		prog, err := c.be.Compile(pl)
		require.NoError(t, err)
		t.Cleanup(func() { prog.(*cudabe.Program).Close() })
		st, err := c.be.NewDraftStore(m.layers, m.Hkv*m.hd, backend.StoreOptions{Slots: slots, MaxPositions: maxPos})
		require.NoError(t, err)
		t.Cleanup(func() { st.(*cudabe.DraftStore).Close() })
		sides = append(sides, side{c.name, prog, st})
	}
	for _, s := range sides {
		for i := 0; i < 2; i++ {
			sl, err := s.st.Alloc()
			require.NoError(t, err)
			require.Equal(t, i, sl)
		}
	}
	ctxPlan := [][2]int{{0, 5}, {1, 2}, {4, 2}, {1, 1}, {3, 2}, {1, 2}, {0, 0}, {1, 1}, {4, 2}, {0, 0}}
	for step, cs := range ctxPlan {
		b := &backend.Batch{}
		for s, c := range cs {
			ctx := make([]float32, c*m.W)
			for i := range ctx {
				ctx[i] = float32(r.NormFloat64())
			}
			toks := make([]int32, m.B)
			for i := range toks {
				toks[i] = int32(r.IntN(m.V))
			}
			b.Seqs = append(b.Seqs, backend.Seq{Slot: s, Tokens: toks, Context: ctx})
		}
		cut := step%3 == 2 // run under a checkpoint and cut slot 0 back to one new row
		var logits [][]float32
		for _, sd := range sides {
			if cut {
				require.NoError(t, sd.st.Checkpoint(0))
			}
			res, err := sd.prog.Run(b, sd.st)
			require.NoError(t, err, "%s step %d", sd.name, step)
			logits = append(logits, res.Logits)
			if cut {
				n, err := sd.st.Len(0)
				require.NoError(t, err)
				require.NoError(t, sd.st.Truncate(0, n-cs[0]+1))
			}
		}
		require.Less(t, maxDiff(logits[0], logits[1]), 2e-4, "step %d: CUDA and CPU logits", step)
		require.Equal(t, logits[1], logits[2], "step %d: graph replay and eager launches", step)
		for sl := 0; sl < 2; sl++ {
			want, err := sides[0].st.(draftReader).ReadDraft(sl)
			require.NoError(t, err)
			for _, sd := range sides[1:] {
				got, err := sd.st.(draftReader).ReadDraft(sl)
				require.NoError(t, err)
				require.Equal(t, want.Len, got.Len, "%s step %d slot %d", sd.name, step, sl)
				for l := range want.K {
					require.Less(t, maxDiff(want.K[l], got.K[l]), 1e-5, "%s step %d slot %d layer %d K", sd.name, step, sl, l)
					require.Less(t, maxDiff(want.V[l], got.V[l]), 1e-5, "%s step %d slot %d layer %d V", sd.name, step, sl, l)
				}
			}
		}
	}
	// slot 1 forked into slot 2 (Copy): both draft alike in one batch
	ctx := make([]float32, 2*m.W)
	for i := range ctx {
		ctx[i] = float32(r.NormFloat64())
	}
	b := &backend.Batch{Seqs: []backend.Seq{{Slot: 1, Tokens: []int32{1, 2, 3, 4}, Context: ctx}, {Slot: 2, Tokens: []int32{1, 2, 3, 4}, Context: ctx}}}
	for _, sd := range sides {
		sl, err := sd.st.Alloc()
		require.NoError(t, err)
		require.Equal(t, 2, sl)
		require.NoError(t, sd.st.Copy(1, 2))
		res, err := sd.prog.Run(b, sd.st)
		require.NoError(t, err, sd.name)
		n := m.B * m.V
		require.Less(t, maxDiff(res.Logits[:n], res.Logits[n:]), 1e-6, "%s: a copied slot drafts as its source", sd.name)
	}
	ds := sides[1].prog.(backend.DeviceCounter).DeviceStats()
	require.Positive(t, ds.GraphCaptures, "the draft forward is captured")
	require.Positive(t, ds.GraphReplays, "and replayed")
	require.Zero(t, sides[2].prog.(backend.DeviceCounter).DeviceStats().GraphReplays)
	t.Logf("graphed draft program: %d captures, %d replays", ds.GraphCaptures, ds.GraphReplays)
	// what the draft store and program refuse
	st := sides[2].st
	_, err = sides[2].prog.Run(&backend.Batch{Seqs: []backend.Seq{{Slot: 0, Tokens: []int32{1, 2, 3}}}}, st)
	require.ErrorContains(t, err, "3 block rows, the block is 4")
	require.ErrorContains(t, st.Truncate(0, 0), "no open checkpoint")
	require.NoError(t, st.Checkpoint(0))
	require.ErrorContains(t, st.Copy(0, 1), "open checkpoint")
	n, err := st.Len(0)
	require.NoError(t, err)
	require.ErrorContains(t, st.Truncate(0, n+1), "can be cut back to")
	require.NoError(t, st.Truncate(0, n))
	long := make([]float32, (maxPos-n+1)*m.W)
	_, err = sides[2].prog.Run(&backend.Batch{Seqs: []backend.Seq{{Slot: 0, Tokens: []int32{1, 2, 3, 4}, Context: long}}}, st)
	require.Error(t, err, "context rows past the draft store's positions")
	trunkSt, err := eager.NewStore(randckptConfig(t), []int{0}, backend.StoreOptions{Slots: 1, MaxPositions: 8})
	require.NoError(t, err)
	_, err = trunkSt.Alloc()
	require.NoError(t, err)
	_, err = sides[2].prog.Run(&backend.Batch{Seqs: []backend.Seq{{Slot: 0, Tokens: []int32{1, 2, 3, 4}}}}, trunkSt)
	require.ErrorContains(t, err, "draft store")
}

// randckptConfig is the tiny preset's model configuration.
func randckptConfig(t *testing.T) *model.Config {
	cfg, err := randckpt.Preset("tiny")
	require.NoError(t, err)
	return cfg
}

// The trunk's capture of target-layer hidden rows on CUDA: a graph whose
// target_hidden output concatenates the rows of three layers (concat_cols,
// nine inputs) equals the CPU's within fp32 rounding, from CUDA graphs
// (captured, then replayed), its repeated inputs copied bit for bit; and
// the real trunk graph's capture (graph.Options.TargetLayers) likewise.
func TestCUDATargetHiddenCapture(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 3))
	const V, D = 53, 40
	w := mapWeights{}
	g := ir.New("target-hidden")
	weight := func(name string, shape ...int) *ir.Value {
		x := make([]float32, shape[0]*shape[1])
		for i := range x {
			x[i] = float32(r.NormFloat64() * 0.2)
		}
		w[name] = x
		return g.AddWeight(name, shape...)
	}
	tokens := g.AddInput(ir.InputTokens, ir.I32, ir.DimT)
	g.AddInput(ir.InputBatch, ir.Host)
	x := g.Op1(ir.OpEmbed, -1, nil, tokens, weight("embed", V, D))
	var rows []*ir.Value
	for l := 0; l < 10; l++ { // ten "layers": the capture reads three of them
		x = g.Op1(ir.OpAdd, l, nil, x, g.Op1(ir.OpLinear, l, nil, x, weight(fmt.Sprintf("l%d", l), D, D)))
		if l == 1 || l == 4 || l == 8 {
			rows = append(rows, x)
		}
	}
	// nine inputs: two launches of the CUDA kernel (8 inputs each)
	cat := append(append(append([]*ir.Value(nil), rows...), rows...), rows...)
	g.Outputs[ir.OutputTargetHidden] = g.Op1(ir.OpConcatCols, -1, nil, cat...)
	g.Outputs[ir.OutputLogits] = g.Op1(ir.OpLinear, -1, nil, x, weight("lm_head", V, D))
	pl, err := plan.Compile(g, w, plan.Options{MaxPositions: 64})
	require.NoError(t, err)
	cfg := randckptConfig(t)
	be := openCUDABackend(t, 0)
	prog, err := be.Compile(pl)
	require.NoError(t, err)
	t.Cleanup(func() { prog.(*cudabe.Program).Close() })
	st, err := be.NewStore(cfg, []int{0}, backend.StoreOptions{Slots: 2, MaxPositions: 64})
	require.NoError(t, err)
	cpuBe := cpu.New(backend.Options{})
	cpuProg, err := cpuBe.Compile(pl)
	require.NoError(t, err)
	cpuSt, err := cpuBe.NewStore(cfg, []int{0}, backend.StoreOptions{Slots: 2, MaxPositions: 64})
	require.NoError(t, err)
	for _, s := range []backend.Store{st, cpuSt} {
		for i := 0; i < 2; i++ {
			_, err := s.Alloc()
			require.NoError(t, err)
		}
	}
	for step, n := range []int{5, 3, 5, 3, 5} { // verify-like spans of 5 and 3 rows, twice each shape
		b := &backend.Batch{Seqs: []backend.Seq{{Slot: 0, Tokens: seqTokens(n, step, V)}, {Slot: 1, Tokens: seqTokens(2, step+7, V)}}}
		got, err := prog.Run(b, st)
		require.NoError(t, err)
		want, err := cpuProg.Run(b, cpuSt)
		require.NoError(t, err)
		require.Less(t, maxDiff(got.Logits, want.Logits), 2e-4, "step %d logits", step)
		h, wh := got.Hidden[ir.OutputTargetHidden], want.Hidden[ir.OutputTargetHidden]
		require.Len(t, h, (n+2)*9*D)
		require.Less(t, maxDiff(h, wh), 2e-4, "step %d target_hidden", step)
		for i := 0; i < (n+2)*3; i++ { // the repeated inputs are copies: bit-equal thirds
			row := h[i/3*9*D+i%3*3*D : i/3*9*D+i%3*3*D+3*D]
			require.Equal(t, h[i/3*9*D:i/3*9*D+3*D], row, "step %d row %d", step, i/3)
		}
	}
	ds := prog.(backend.DeviceCounter).DeviceStats()
	require.Equal(t, int64(2), ds.GraphCaptures, "one graph a shape")
	require.Equal(t, int64(5), ds.GraphReplays, "every batch replays its shape's graph (captured on the first)")

	// the trunk's own capture (graph.Options.TargetLayers: the stream mean
	// after each target layer) on the tiny preset, in an extend graph whose
	// lengths host-length-reuse made host lengths: a prompt, then spans of
	// a block's 8 tokens, from CUDA graphs
	ck := presetCheckpoint(t, "tiny")
	cfg = ck.Config()
	tg, err := graph.Build(cfg, graph.Options{Mode: graph.Extend, Logits: graph.SpanLogits, TargetLayers: []int{3, 1}})
	require.NoError(t, err)
	hl := &hostlen.Pass{}
	_, err = hl.Apply(tg, hl.Eligible(tg, pass.NewAnalyses(tg), pass.NewEnv(cfg, nil)))
	require.NoError(t, err)
	tp, err := plan.Compile(tg, ck, plan.Options{MaxPositions: 64})
	require.NoError(t, err)
	require.True(t, tp.HostLengths)
	progs := make([]backend.Program, 2)
	stores := make([]backend.Store, 2)
	for i, be := range []backend.Backend{cpuBe, be} {
		progs[i], err = be.Compile(tp)
		require.NoError(t, err)
		stores[i], err = be.NewStore(cfg, cfg.TrunkLayers(), backend.StoreOptions{Slots: 1, MaxPositions: 64})
		require.NoError(t, err)
		_, err = stores[i].Alloc()
		require.NoError(t, err)
	}
	for step, n := range []int{9, 8, 8, 8} {
		b := &backend.Batch{Seqs: []backend.Seq{{Slot: 0, Tokens: seqTokens(n, step+2, cfg.VocabSize), LogitRows: n}}}
		want, err := progs[0].Run(b, stores[0])
		require.NoError(t, err)
		got, err := progs[1].Run(b, stores[1])
		require.NoError(t, err)
		h := got.Hidden[ir.OutputTargetHidden]
		require.Len(t, h, n*2*cfg.HiddenSize)
		require.Less(t, maxDiff(h, want.Hidden[ir.OutputTargetHidden]), 2e-4, "trunk step %d target rows", step)
		require.Less(t, maxDiff(got.Logits, want.Logits), 2e-4, "trunk step %d logits", step)
	}
	ds = progs[1].(backend.DeviceCounter).DeviceStats()
	require.Equal(t, int64(2), ds.GraphCaptures)
	require.Equal(t, int64(4), ds.GraphReplays)
}

// dflashWeights reads a DFlash draft graph's tensors: the drafter's (the
// graph.DFlashPrefix names, unprefixed in its checkpoint) and the trunk's
// embedding and head.
type dflashWeights struct {
	trunk, draft plan.Weights
}

func (w dflashWeights) Float32(name string, shape ...int) ([]float32, error) {
	if rest, ok := strings.CutPrefix(name, graph.DFlashPrefix); ok {
		return w.draft.Float32(rest, shape...)
	}
	return w.trunk.Float32(name, shape...)
}

// dflashSide is one backend's trunk verify program with its target-layer
// capture, the draft program and their stores.
type dflashSide struct {
	name         string
	trunk, draft backend.Program
	st, dst      backend.Store
}

func argmax(row []float32) int32 {
	best := 0
	for i, v := range row {
		if v > row[best] {
			best = i
		}
	}
	return int32(best)
}

// The real DFlash graphs on CUDA against the CPU backend, step by step, on
// the tiny preset and its random tiny-dflash drafter (z-lab's format): the
// trunk's verify graph with the drafter's target layers captured
// (target_hidden, from CUDA graphs once a shape repeats) and the draft
// forward (graph.BuildDFlash: fc and hidden_norm over the context rows, two
// draft layers of dflash_attn and SwiGLU, the trunk's head on each block's
// last B−1 rows). A prompt, then rounds of draft → verify → accept the
// greedy prefix → cut the trunk back under its checkpoint → next context
// rows: the CUDA logits, target rows and draft logits lie within fp32
// rounding of the CPU's, its greedy drafts and accepted lengths are the
// CPU's, and its draft store holds the CPU's lengths and K/V rows. Both
// backends are fed the CPU's tokens and context rows, so every step
// compares one forward.
func TestCUDADFlashForwardMatchesCPU(t *testing.T) {
	cuBe := openCUDABackend(t, 0)
	ck := presetCheckpoint(t, "tiny")
	cfg := ck.Config()
	d, err := randckpt.DFlashPreset("tiny-dflash", cfg)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, randckpt.WriteDFlash(dir, d, randckpt.Options{Seed: 5}))
	dck, err := model.OpenDFlash(dir, model.OpenOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { dck.Close() })
	B := d.BlockSize
	tg, err := graph.Build(cfg, graph.Options{Mode: graph.Verify, Logits: graph.SpanLogits, TargetLayers: d.TargetLayerIDs})
	require.NoError(t, err)
	dg, err := graph.BuildDFlash(cfg, d, graph.Options{})
	require.NoError(t, err)
	const maxPos = 96
	tp, err := plan.Compile(tg, ck, plan.Options{MaxPositions: maxPos})
	require.NoError(t, err)
	dp, err := plan.Compile(dg, dflashWeights{ck, dck}, plan.Options{MaxPositions: maxPos})
	require.NoError(t, err)
	layers := cfg.TrunkLayers()
	so := backend.StoreOptions{Slots: 1, MaxPositions: maxPos, Rollback: B}
	var sides []*dflashSide
	cpuBe := cpu.New(backend.Options{})
	for _, be := range []interface {
		backend.Backend
		backend.DraftStorer
	}{cpuBe, cuBe} {
		s := &dflashSide{name: be.Name()}
		s.trunk, err = be.Compile(tp)
		require.NoError(t, err)
		s.draft, err = be.Compile(dp)
		require.NoError(t, err)
		s.st, err = be.NewStore(cfg, layers, so)
		require.NoError(t, err)
		s.dst, err = be.NewDraftStore(d.NumHiddenLayers, d.KVWidth(), so)
		require.NoError(t, err)
		for _, st := range []backend.Store{s.st, s.dst} {
			_, err := st.Alloc()
			require.NoError(t, err)
		}
		sides = append(sides, s)
	}
	V := cfg.VocabSize
	W := d.ContextWidth()
	prompt := seqTokens(13, 4, V)
	// the prompt: logits of its last row, the target rows of all
	var ctx []float32
	var pending int32
	for i, s := range sides {
		res, err := s.trunk.Run(&backend.Batch{Seqs: []backend.Seq{{Slot: 0, Tokens: prompt}}}, s.st)
		require.NoError(t, err, s.name)
		h := res.Hidden[ir.OutputTargetHidden]
		require.Len(t, h, len(prompt)*W)
		if i == 0 {
			ctx, pending = h, argmax(res.Logits)
			continue
		}
		require.Less(t, maxDiff(h, ctx), 2e-4, "prompt target rows")
		require.Equal(t, pending, argmax(res.Logits))
	}
	accepted := 0
	for round := 0; round < 6; round++ {
		block := make([]int32, B)
		block[0] = pending
		for i := 1; i < B; i++ {
			block[i] = int32(d.MaskTokenID)
		}
		var drafts []int32
		var cpuLogits []float32
		for i, s := range sides {
			res, err := s.draft.Run(&backend.Batch{Seqs: []backend.Seq{{Slot: 0, Tokens: block, Context: ctx, LogitRows: B - 1}}}, s.dst)
			require.NoError(t, err, "%s round %d draft", s.name, round)
			require.Len(t, res.Logits, (B-1)*V)
			got := make([]int32, B-1)
			for r := range got {
				got[r] = argmax(res.Logits[r*V : (r+1)*V])
			}
			if i == 0 {
				drafts, cpuLogits = got, res.Logits
				continue
			}
			require.Less(t, maxDiff(res.Logits, cpuLogits), 2e-4, "round %d draft logits", round)
			require.Equal(t, drafts, got, "round %d greedy drafts", round)
		}
		span := append([]int32{pending}, drafts...)
		var acc int
		var next []float32
		for i, s := range sides {
			require.NoError(t, s.st.Checkpoint(0))
			res, err := s.trunk.Run(&backend.Batch{Seqs: []backend.Seq{{Slot: 0, Tokens: span, LogitRows: B}}}, s.st)
			require.NoError(t, err, "%s round %d verify", s.name, round)
			a := 0
			for a < B-1 && argmax(res.Logits[a*V:(a+1)*V]) == span[a+1] {
				a++
			}
			h := res.Hidden[ir.OutputTargetHidden][:(a+1)*W]
			if i == 0 {
				acc, next = a, h
				pending = argmax(res.Logits[a*V : (a+1)*V])
			} else {
				require.Equal(t, acc, a, "round %d accepted drafts", round)
				require.Less(t, maxDiff(h, next), 2e-4, "round %d target rows", round)
			}
			n, err := s.st.Len(0)
			require.NoError(t, err)
			require.NoError(t, s.st.Truncate(0, n-B+a+1))
		}
		ctx = next
		accepted += acc
		want, err := sides[0].dst.(draftReader).ReadDraft(0)
		require.NoError(t, err)
		got, err := sides[1].dst.(draftReader).ReadDraft(0)
		require.NoError(t, err)
		require.Equal(t, want.Len, got.Len)
		for l := range want.K {
			require.Less(t, maxDiff(want.K[l], got.K[l]), 2e-4, "round %d layer %d draft K", round, l)
			require.Less(t, maxDiff(want.V[l], got.V[l]), 2e-4, "round %d layer %d draft V", round, l)
		}
	}
	t.Logf("%d drafts accepted in 6 rounds of %d (random drafter)", accepted, B-1)
	ds := sides[1].draft.(backend.DeviceCounter).DeviceStats()
	require.Positive(t, ds.GraphReplays, "the CUDA draft forward runs from graphs")
	// the verify graph reads the executor's lengths (host-length-reuse
	// leaves verify graphs alone), so it runs eagerly here: its capture of
	// target rows from graphs is TestCUDATargetHiddenCapture's
	require.False(t, tp.HostLengths)
}
