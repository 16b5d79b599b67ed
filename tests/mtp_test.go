package tests

import (
	le "encoding/binary"
	"encoding/json"
	"fmt"
	"github.com/glmflash/glmflash/kernels/gemm"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/eval"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/glmflash/glmflash/passes/dsameta"
	"github.com/glmflash/glmflash/passes/hostlen"
	"github.com/glmflash/glmflash/passes/kdafusion"
	"github.com/glmflash/glmflash/passes/mhcfusion"
	"github.com/stretchr/testify/require"
)

// mtpFixture is the transformers reference of the MTP layer that
// tools/mtp_reference.py writes (on the GPU machine).
const mtpFixture = "glm5next-tiny-mtp"

// mtpCheckpoint writes the tiny-mtp preset (the tiny-a sizes plus an MTP
// layer) with random weights.
func mtpCheckpoint(t *testing.T, fp8 bool) *model.Checkpoint {
	t.Helper()
	cfg, err := randckpt.Preset("tiny-mtp")
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, randckpt.Write(dir, cfg, randckpt.Options{Seed: 5, FP8: fp8}))
	ck, err := model.Open(dir)
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	require.NoError(t, ck.ValidateMTP())
	return ck
}

func newEngine(t *testing.T, ck *model.Checkpoint, o engine.Options) *engine.Engine {
	t.Helper()
	e, err := engine.New(ck.Config(), ck, o)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	return e
}

func mtpPrompt(n, seed, vocab int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(1 + (seed*7919+i*104729+i*i*31)%(vocab-1))
	}
	return p
}

type synthCase struct{ n, split, steps, seed int }

// writeSynthMTPReference writes an MTP reference in the fixture format
// (eval.MTPFormat) whose MTP rows come from the float64 implementation of
// §7 (f64MTP) and whose trunk rows (the prompt's logits and final hidden)
// come from the CPU engine: the trunk has its own transformers parity
// tests, and a float64 trunk is out of scope here. It returns the path and
// the smallest top-k gap the reference crossed.
func writeSynthMTPReference(t *testing.T, ck *model.Checkpoint, cases []synthCase) (string, float64) {
	t.Helper()
	cfg := ck.Config()
	V, D := cfg.VocabSize, cfg.HiddenSize
	e := newEngine(t, ck, engine.Options{Slots: 1})
	var tensors []safetensors.WriteTensor
	f32 := func(name string, rows int, v []float32) {
		b := make([]byte, 4*len(v))
		require.NoError(t, safetensors.FromFloat32(safetensors.F32, v, b))
		tensors = append(tensors, safetensors.WriteTensor{Name: name, DType: safetensors.F32, Shape: []int{rows, len(v) / rows}, Data: b})
	}
	i64 := func(name string, v []int32) {
		b := make([]byte, 8*len(v))
		for i, x := range v {
			le.LittleEndian.PutUint64(b[8*i:], uint64(int64(x)))
		}
		tensors = append(tensors, safetensors.WriteTensor{Name: name, DType: safetensors.I64, Shape: []int{len(v)}, Data: b})
	}
	type jcase struct {
		Name string `json:"name"`
	}
	var jcases []jcase
	minGap := math.Inf(1)
	for ci, sc := range cases {
		name := fmt.Sprintf("mtp.%d", ci)
		jcases = append(jcases, jcase{name})
		toks := mtpPrompt(sc.n, sc.seed, V)
		slot, err := e.Store().Alloc()
		require.NoError(t, err)
		out, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.AllLogits, FinalHidden: true}, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: toks}}})
		require.NoError(t, err)
		require.NoError(t, e.Store().Free(slot))
		th := out.Hidden[ir.OutputFinalHidden]
		require.Len(t, th, sc.n*D)
		mtpToks := append(append([]int32(nil), toks[1:]...), int32(eval.Argmax(out.Logits[(sc.n-1)*V:])))
		ref := newF64MTP(t, ck)
		var ml, mh, dl, dh []float64
		var draft []int32
		for i := 0; i < sc.n; i++ {
			l, h := ref.Step(mtpToks[i], to64(th[i*D:(i+1)*D]))
			ml, mh = append(ml, l...), append(mh, h...)
		}
		prevL, prevH := ml[(sc.n-1)*V:], mh[(sc.n-1)*D:]
		for k := 0; k < sc.steps; k++ {
			tok := ref.Argmax(prevL)
			draft = append(draft, tok)
			l, h := ref.Step(tok, prevH)
			dl, dh = append(dl, l...), append(dh, h...)
			prevL, prevH = l, h
		}
		for r := 0; r < sc.n; r++ {
			ref.Argmax(ml[r*V : (r+1)*V]) // the greedy margin of every compared row
		}
		minGap = math.Min(minGap, ref.MinGap)
		i64(name+".input_ids", toks)
		f32(name+".trunk_logits", sc.n, out.Logits)
		f32(name+".trunk_hidden", sc.n, th)
		i64(name+".mtp_input_ids", mtpToks)
		i64(name+".split", []int32{int32(sc.split)})
		f32(name+".mtp_logits", sc.n, to32(ml))
		f32(name+".mtp_hidden", sc.n, to32(mh))
		i64(name+".draft_tokens", draft)
		f32(name+".draft_logits", sc.steps, to32(dl))
		f32(name+".draft_hidden", sc.steps, to32(dh))
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "reference.safetensors")
	require.NoError(t, safetensors.Write(path, tensors, nil))
	js, err := json.Marshal(map[string]any{"format": eval.MTPFormat, "produced_by": "tests/mtp_test.go (float64 §7; trunk rows from the CPU engine)", "cases": jcases})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "reference.json"), js, 0o644))
	return path, minGap
}

// synthCases: a prompt inside one indexer selection (9 tokens: every pool
// is kept) and one past it (41 tokens, 10 pools for a top-k of 4: sparse),
// each then drafting 4 steps.
var synthCases = []synthCase{{n: 9, split: 4, steps: 4, seed: 1}, {n: 41, split: 23, steps: 4, seed: 2}}

// The MTP graph on the CPU backend matches an independent float64
// implementation of architecture §7 within 1e-4 with identical greedy
// tokens, through the same runner the transformers fixture uses: the MTP
// prefill on given trunk hidden rows in two calls, draft steps on given
// tokens and rows, and the engine's own chain (its trunk's final hidden, its
// greedy tokens, its MTP hidden recycled), in the BF16 and FP8 layouts.
func TestMTPMatchesFloat64Reference(t *testing.T) {
	for _, fp8 := range []bool{false, true} {
		t.Run(map[bool]string{false: "bf16", true: "fp8"}[fp8], func(t *testing.T) {
			ck := mtpCheckpoint(t, fp8)
			path, gap := writeSynthMTPReference(t, ck, synthCases)
			t.Logf("smallest top-k gap in the float64 reference: %.2e", gap)
			require.Greater(t, gap, 1e-4, "the reference crosses a near-tie: pick other prompts")
			ref, err := eval.LoadMTP(path)
			require.NoError(t, err)
			require.Len(t, ref.Cases, len(synthCases))
			e := newEngine(t, ck, engine.Options{Slots: 2})
			res, err := eval.RunMTP(e, ref)
			require.NoError(t, err)
			for _, r := range res {
				t.Logf("%s: mtp logits %.1e hidden %.1e, draft logits %.1e hidden %.1e, chain logits %.1e hidden %.1e, mismatches %d",
					r.Name, r.MTPLogits, r.MTPHidden, r.DraftLogits, r.DraftHidden, r.ChainLogits, r.ChainHidden, r.Mismatches)
				require.True(t, r.Pass(1e-4), "%s: %+v", r.Name, r)
				// fp32 against float64: small, never exactly zero (the rows really were computed twice)
				require.Positive(t, r.MTPLogits)
				require.Positive(t, r.DraftLogits)
			}
		})
	}
}

// One ragged MTP batch (two sequences of different lengths in one call,
// then one draft step for both) gives each sequence the rows it gets alone;
// and the built-in passes run on the MTP graph (the DSA metadata is hoisted,
// host lengths are reused) without changing its results.
func TestMTPBatchesAndPasses(t *testing.T) {
	ck := mtpCheckpoint(t, false)
	path, gap := writeSynthMTPReference(t, ck, synthCases)
	require.Greater(t, gap, 1e-4)
	ref, err := eval.LoadMTP(path)
	require.NoError(t, err)
	V, D := ref.Vocab, ref.Hidden

	pl, err := pass.NewPipeline([]pass.Request{{Name: kdafusion.Name}, {Name: mhcfusion.Name}, {Name: dsameta.Name}, {Name: hostlen.Name}}, true)
	require.NoError(t, err)
	for _, withPasses := range []bool{false, true} {
		o := engine.Options{Slots: 4}
		if withPasses {
			o.Passes, o.PassEnv = pl, config.Default().PassEnv(ck.Config(), ck)
		}
		e := newEngine(t, ck, o)
		mst, err := e.MTPStore()
		require.NoError(t, err)
		var slots []int
		b := &backend.Batch{}
		for _, c := range ref.Cases {
			s, err := mst.Alloc()
			require.NoError(t, err)
			slots = append(slots, s)
			b.Seqs = append(b.Seqs, backend.Seq{Slot: s, Tokens: c.MTPTokens, Hidden: c.TrunkHidden})
		}
		out, err := e.Run(engine.Key{Mode: graph.Mixed, Logits: graph.AllLogits, MTP: true}, b)
		require.NoError(t, err)
		row := 0
		for _, c := range ref.Cases {
			n := len(c.Tokens)
			require.Less(t, maxDiff(out.Logits[row*V:(row+n)*V], c.MTPLogits), 1e-4)
			require.Less(t, maxDiff(out.Hidden[ir.OutputFinalHidden][row*D:(row+n)*D], c.MTPHidden), 1e-4)
			row += n
		}
		b = &backend.Batch{}
		for i, c := range ref.Cases {
			n := len(c.Tokens)
			b.Seqs = append(b.Seqs, backend.Seq{Slot: slots[i], Tokens: c.DraftTokens[:1], Hidden: c.MTPHidden[(n-1)*D:]})
		}
		out, err = e.Run(engine.Key{Mode: graph.Decode, Logits: graph.LastLogits, MTP: true}, b)
		require.NoError(t, err)
		for i, c := range ref.Cases {
			require.Less(t, maxDiff(out.Logits[i*V:(i+1)*V], c.DraftLogits[:V]), 1e-4)
			n, err := mst.Len(slots[i])
			require.NoError(t, err)
			require.Equal(t, len(c.Tokens)+1, n, "the MTP store counts its own positions")
		}
		res, err := eval.RunMTP(e, ref)
		require.NoError(t, err)
		for _, r := range res {
			require.True(t, r.Pass(1e-4), "passes %v: %+v", withPasses, r)
		}
		if withPasses {
			rep := e.Report(engine.Key{Mode: graph.Mixed, Logits: graph.AllLogits, MTP: true})
			require.NotNil(t, rep)
			require.Equal(t, "mtp:mixed/all", rep.Program)
			for _, p := range rep.Passes {
				require.Empty(t, p.Error, p.Name)
			}
			require.Len(t, rep.Find(dsameta.Name).Fired, 1)
			require.NotEmpty(t, rep.Find(hostlen.Name).Fired)
			require.Empty(t, rep.Find(mhcfusion.Name).Fired, "no mHC in the MTP layer")
			require.Empty(t, rep.Find(kdafusion.Name).Fired, "no KDA in the MTP layer")
			require.True(t, e.HostLengths(engine.Key{Mode: graph.Decode, Logits: graph.LastLogits, MTP: true}))
		}
	}
}

// What the MTP path refuses, and says why.
func TestMTPErrors(t *testing.T) {
	// a model without an MTP layer
	plain, _ := openFixture(t, "glm5next-tiny-a")
	e := newEngine(t, plain, engine.Options{Slots: 1})
	_, err := e.MTPStore()
	require.ErrorContains(t, err, "no MTP layer (num_nextn_predict_layers is 0)")
	_, err = e.Run(engine.Key{Mode: graph.Decode, Logits: graph.LastLogits, MTP: true}, &backend.Batch{Seqs: []backend.Seq{{Slot: 0, Tokens: []int32{1}}}})
	require.ErrorContains(t, err, "no MTP layer")

	// a config that declares the layer, without its tensors
	cfg, err := randckpt.Preset("tiny-mtp")
	require.NoError(t, err)
	noMTP := cfg.Clone()
	noMTP.NumNextNPredictLayers = 0
	dir := t.TempDir()
	require.NoError(t, randckpt.Write(dir, noMTP, randckpt.Options{Seed: 5}))
	b, err := cfg.MarshalHF()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, model.ConfigFile), b, 0o644))
	ck, err := model.Open(dir)
	require.NoError(t, err)
	defer ck.Close()
	e = newEngine(t, ck, engine.Options{Slots: 1})
	_, err = e.Program(engine.Key{Mode: graph.Decode, Logits: graph.LastLogits, MTP: true})
	require.ErrorContains(t, err, "MTP layer 8: tensor model.language_model.layers.8.enorm.weight: missing")

	// hidden rows: the MTP program needs one per token, the trunk's takes none
	ck = mtpCheckpoint(t, false)
	e = newEngine(t, ck, engine.Options{Slots: 1})
	D := ck.Config().HiddenSize
	mst, err := e.MTPStore()
	require.NoError(t, err)
	ms, err := mst.Alloc()
	require.NoError(t, err)
	ts, err := e.Store().Alloc()
	require.NoError(t, err)
	mkey := engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits, MTP: true}
	_, err = e.Run(mkey, &backend.Batch{Seqs: []backend.Seq{{Slot: ms, Tokens: []int32{1, 2}, Hidden: make([]float32, D)}}})
	require.ErrorContains(t, err, fmt.Sprintf("2 tokens need 2×%d hidden values, got %d", D, D))
	_, err = e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: ts, Tokens: []int32{1}, Hidden: make([]float32, D)}}})
	require.ErrorContains(t, err, "has hidden rows, but the program takes no hidden input")

	// a program on the other part's store names the missing layer state
	mprog, err := e.Program(mkey)
	require.NoError(t, err)
	_, err = mprog.Run(&backend.Batch{Seqs: []backend.Seq{{Slot: ts, Tokens: []int32{1}, Hidden: make([]float32, D)}}}, e.Store())
	require.ErrorContains(t, err, "layer 8")
	tprog, err := e.Program(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits})
	require.NoError(t, err)
	_, err = tprog.Run(&backend.Batch{Seqs: []backend.Seq{{Slot: ms, Tokens: []int32{1}}}}, mst)
	require.ErrorContains(t, err, "no KDA state for layer 0")
	for _, st := range []backend.Store{e.Store(), mst} {
		n, err := st.Len(map[bool]int{true: ts, false: ms}[st == e.Store()])
		require.NoError(t, err)
		require.Zero(t, n, "a refused batch advances nothing")
	}

	// options that do not apply to the MTP graph
	_, err = e.Program(engine.Key{Mode: graph.Decode, Logits: graph.LastLogits, MTP: true, CaptureHidden: true})
	require.ErrorContains(t, err, "takes no hidden-capture options")
}

// A prepared MTP batch takes its hidden rows late (SetHidden), as decode
// batches take their tokens (SetTokens): the same rows as a direct run.
func TestMTPPreparedSetHidden(t *testing.T) {
	ck := mtpCheckpoint(t, false)
	D := ck.Config().HiddenSize
	run := func(prepared bool) []float32 {
		e := newEngine(t, ck, engine.Options{Slots: 1})
		mst, err := e.MTPStore()
		require.NoError(t, err)
		s, err := mst.Alloc()
		require.NoError(t, err)
		h := make([]float32, 2*D)
		for i := range h {
			h[i] = float32(math.Sin(float64(i)))
		}
		key := engine.Key{Mode: graph.Prefill, Logits: graph.AllLogits, MTP: true}
		b := &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: []int32{3, 4}, Hidden: h}}}
		if !prepared {
			out, err := e.Run(key, b)
			require.NoError(t, err)
			return out.Logits
		}
		b.Seqs[0].Hidden = make([]float32, 2*D)
		pr, err := e.Prepare(key, b, []int{0})
		if err != nil { // programs that read executor lengths cannot prepare: use the backend directly
			prog, perr := e.Program(key)
			require.NoError(t, perr)
			pr, err = backend.Prepare(prog, b, mst, []int{0})
		}
		require.NoError(t, err)
		require.ErrorContains(t, pr.SetHidden(0, h[:D]), "prepared with 2 hidden rows")
		require.ErrorContains(t, pr.SetHidden(1, h), "no sequence 1")
		require.NoError(t, pr.SetHidden(0, h))
		out, err := e.Execute(key, pr)
		require.NoError(t, err)
		return out.Logits
	}
	require.Equal(t, run(false), run(true))
}

// The trunk's final_hidden output is transformers' last hidden state:
// the fixture's streams after the last layer, averaged and normalized
// (float64 here), within 1e-4; and lm_head applied to it gives the logits.
func TestTrunkFinalHiddenMatchesTransformers(t *testing.T) {
	ck, ref := openFixture(t, "glm5next-tiny-a")
	cfg := ck.Config()
	D, H, V, L := cfg.HiddenSize, cfg.HCMult, cfg.VocabSize, cfg.NumHiddenLayers
	e := newEngine(t, ck, engine.Options{Slots: 1})
	norm, err := ck.Float32(model.FinalNormName)
	require.NoError(t, err)
	head, err := ck.Float32(model.LMHeadName)
	require.NoError(t, err)
	checked := 0
	for _, c := range ref.Cases {
		streams, ok := c.Hidden[L-1]
		if c.Kind != "prefill" || !ok {
			continue
		}
		n := len(c.Tokens)
		for _, lg := range []graph.Logits{graph.AllLogits, graph.LastLogits} {
			s, err := e.Store().Alloc()
			require.NoError(t, err)
			out, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: lg, FinalHidden: true}, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: c.Tokens}}})
			require.NoError(t, err)
			require.NoError(t, e.Store().Free(s))
			fh := out.Hidden[ir.OutputFinalHidden]
			require.Len(t, fh, n*D, "one row per token whatever the logits selection")
			d, dl := 0.0, 0.0
			for r := 0; r < n; r++ {
				mean := make([]float64, D)
				for h := 0; h < H; h++ {
					for i := 0; i < D; i++ {
						mean[i] += float64(streams[(r*H+h)*D+i]) / float64(H)
					}
				}
				want := rmsnorm64(mean, to64(norm), cfg.RMSNormEps)
				for i := range want {
					d = math.Max(d, math.Abs(want[i]-float64(fh[r*D+i])))
				}
				if lg == graph.AllLogits || r == n-1 {
					lrow := out.Logits[:V]
					if lg == graph.AllLogits {
						lrow = out.Logits[r*V : (r+1)*V]
					}
					for v, x := range matvec(to64(head), to64(fh[r*D:(r+1)*D])) {
						dl = math.Max(dl, math.Abs(x-float64(lrow[v])))
					}
				}
			}
			t.Logf("%s %s: final hidden max|Δ| %.1e vs transformers; logits vs lm_head·final_hidden %.1e", c.Name, lg, d, dl)
			require.Less(t, d, 1e-4)
			require.Less(t, dl, 1e-5)
			checked++
		}
	}
	require.Equal(t, 6, checked)
}

// The MTP layer against transformers: the fixture tools/mtp_reference.py
// writes on the GPU machine (PyTorch, float32; trunk by transformers, the
// MTP layer with transformers' own DSA attention and MoE modules), made on
// the H200 and committed in testdata/glm5next-tiny-mtp (produced.log is
// the script's output).
func TestMTPTransformersParity(t *testing.T) {
	dir := fixtureDir(mtpFixture)
	ck, err := model.Open(filepath.Join(dir, "checkpoint"))
	require.NoError(t, err)
	defer ck.Close()
	require.NoError(t, ck.Validate())
	require.NoError(t, ck.ValidateMTP())
	ref, err := eval.LoadMTP(filepath.Join(dir, "reference.safetensors"))
	require.NoError(t, err)
	// with the passes off and with every built-in pass on
	for arm, reqs := range map[string][]pass.Request{"off": nil, "every": everyPass(tuningDir(t))} {
		e := engineWith(t, ck, reqs)
		res, err := eval.RunMTP(e, ref)
		require.NoError(t, err)
		require.Len(t, res, len(ref.Cases))
		for _, r := range res {
			t.Logf("%s %s: trunk logits %.1e hidden %.1e; mtp logits %.1e hidden %.1e; draft logits %.1e hidden %.1e; chain logits %.1e hidden %.1e; mismatches %d",
				arm, r.Name, r.TrunkLogits, r.TrunkHidden, r.MTPLogits, r.MTPHidden, r.DraftLogits, r.DraftHidden, r.ChainLogits, r.ChainHidden, r.Mismatches)
			require.True(t, r.Pass(1e-4), "passes %s, kernels %s, %s: %+v", arm, gemm.Impl(), r.Name, r)
		}
	}
}
