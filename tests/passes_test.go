package tests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/eval"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/glmflash/glmflash/passes/autotune"
	"github.com/glmflash/glmflash/passes/dsameta"
	"github.com/glmflash/glmflash/passes/hostlen"
	"github.com/glmflash/glmflash/passes/kdafusion"
	"github.com/glmflash/glmflash/passes/mhcfusion"
	"github.com/glmflash/glmflash/plugins/conformance"
	"github.com/stretchr/testify/require"
)

var builtins = []string{kdafusion.Name, mhcfusion.Name, dsameta.Name, hostlen.Name, autotune.Name}

// tuningDir returns a directory holding a tuning table for the tiny model's
// GEMM shapes at every default bucket (measured once per test binary).
func tuningDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	pl, err := pass.NewPipeline([]pass.Request{{Name: autotune.Name, Options: map[string]any{"tune_at_start": true, "table_dir": dir, "reps": 1, "cpu": "test-cpu"}}}, true)
	require.NoError(t, err)
	for _, name := range fixtures {
		ck, _ := openFixture(t, name)
		for _, lg := range []graph.Logits{graph.AllLogits, graph.LastLogits} {
			g, err := graph.Build(ck.Config(), graph.Options{Mode: graph.Prefill, Logits: lg})
			require.NoError(t, err)
			_, err = pl.Run(g, &pass.Env{TP: pass.Topology{Size: 1, Known: true}, HostLengths: true})
			require.NoError(t, err)
		}
	}
	return dir
}

func request(name, tdir string) pass.Request {
	r := pass.Request{Name: name}
	if name == autotune.Name {
		r.Options = map[string]any{"table_dir": tdir, "cpu": "test-cpu"}
	}
	return r
}

// runCases collects every logits row a fixture's cases produce (the
// conformance suite's runner: prefill rows, decode steps fed with the
// reference tokens, extend rows).
func runCases(t *testing.T, ck *model.Checkpoint, e *engine.Engine, ref *eval.Reference) [][]float32 {
	t.Helper()
	return conformance.RunCases(t, &conformance.Fixture{Checkpoint: ck, Reference: ref}, e)
}

func engineWith(t *testing.T, ck *model.Checkpoint, reqs []pass.Request, env *pass.Env) *engine.Engine {
	t.Helper()
	pl, err := pass.NewPipeline(reqs, true)
	require.NoError(t, err)
	if env == nil {
		env = config.Default().PassEnv(ck.Config(), ck)
	}
	e, err := engine.New(ck.Config(), ck, engine.Options{Slots: 2, Passes: pl, PassEnv: env})
	require.NoError(t, err)
	return e
}

// Parity: each pass alone and all together give every fixture case's logits
// within 1e-4 of the pass-off engine, with identical greedy tokens; and the
// passes actually fired.
func TestPassParityOnFixtures(t *testing.T) {
	tdir := tuningDir(t)
	arms := map[string][]pass.Request{}
	for _, n := range builtins {
		arms[n] = []pass.Request{request(n, tdir)}
	}
	var all []pass.Request
	for _, n := range builtins {
		all = append(all, request(n, tdir))
	}
	arms["all"] = all
	for _, name := range fixtures {
		ck, ref := openFixture(t, name)
		base := runCases(t, ck, engineWith(t, ck, nil, nil), ref)
		for arm, reqs := range arms {
			e := engineWith(t, ck, reqs, nil)
			got := runCases(t, ck, e, ref)
			require.Len(t, got, len(base))
			worst := 0.0
			for i := range base {
				require.Len(t, got[i], len(base[i]))
				worst = max(worst, maxDiff(got[i], base[i]))
				V := ck.Config().VocabSize
				for r := 0; r < len(base[i])/V; r++ {
					require.Equal(t, eval.Argmax(base[i][r*V:(r+1)*V]), eval.Argmax(got[i][r*V:(r+1)*V]), "%s %s: greedy token changed", name, arm)
				}
			}
			require.Less(t, worst, 1e-4, "%s %s", name, arm)
			for key, rep := range e.Reports() {
				for _, r := range reqs {
					pr := rep.Find(r.Name)
					require.NotNil(t, pr)
					require.Empty(t, pr.Error, "%s %s %s", name, arm, key)
					require.NotEmpty(t, pr.Fired, "%s: %s fired nowhere in %s", name, r.Name, key)
				}
			}
			t.Logf("%s %-22s max|Δ| vs pass-off %.1e", name, arm, worst)
		}
	}
}

func explain(t *testing.T, cfg *model.Config, mode graph.Mode, reqs []pass.Request, env *pass.Env) (*ir.Graph, *pass.Report, string) {
	t.Helper()
	g, err := graph.Build(cfg, graph.Options{Mode: mode, Logits: graph.LastLogits})
	require.NoError(t, err)
	before := g.Text()
	pl, err := pass.NewPipeline(reqs, true)
	require.NoError(t, err)
	if env == nil {
		env = &pass.Env{Model: cfg, TP: pass.Topology{Size: 1, Known: true}, HostLengths: true}
	}
	rep, err := pl.Run(g, env)
	require.NoError(t, err)
	return g, rep, before
}

// Fired-site counts are exactly what each fixture's model implies.
func TestFiredSiteCounts(t *testing.T) {
	tdir := tuningDir(t)
	for _, name := range fixtures {
		ck, _ := openFixture(t, name)
		cfg := ck.Config()
		kda, dsa := 0, 0
		for l := 0; l < cfg.NumHiddenLayers; l++ {
			if cfg.IsKDA(l) {
				kda++
			} else {
				dsa++
			}
		}
		L := cfg.NumHiddenLayers
		_, rep, _ := explain(t, cfg, graph.Decode, []pass.Request{request(kdafusion.Name, ""), request(mhcfusion.Name, ""), request(dsameta.Name, ""), request(hostlen.Name, ""), request(autotune.Name, tdir)}, nil)
		require.Len(t, rep.Find(kdafusion.Name).Fired, kda, name)
		require.Len(t, rep.Find(mhcfusion.Name).Fired, 2*L-1, name) // every post but the terminal one
		require.Len(t, rep.Find(mhcfusion.Name).Skipped, 1, name)
		require.Len(t, rep.Find(dsameta.Name).Fired, dsa, name)
		require.Len(t, rep.Find(hostlen.Name).Fired, 2*kda+1, name) // kda_conv + kda_attn per KDA layer + the hoisted metadata
		// autotune alone: every distinct GEMM shape of the graph × 4 buckets
		g, rep, _ := explain(t, cfg, graph.Decode, []pass.Request{request(autotune.Name, tdir)}, nil)
		shapes := map[[2]int]bool{}
		for _, n := range g.Nodes {
			if n.Op == ir.OpLinear {
				shapes[[2]int{n.Inputs[1].Shape[0], n.Inputs[0].Shape[1]}] = true
			}
		}
		require.Len(t, rep.Find(autotune.Name).Fired, 4*len(shapes), name)
	}
}

// fixedTable writes a tuning table with the same parameters for every GEMM
// shape of cfg's graphs (deterministic, unlike a measured one).
func fixedTable(t *testing.T, cfg *model.Config) string {
	t.Helper()
	dir := t.TempDir()
	g, err := graph.Build(cfg, graph.Options{Mode: graph.Decode, Logits: graph.LastLogits})
	require.NoError(t, err)
	tb := &autotune.Table{CPU: "test-cpu"}
	for _, n := range g.Nodes {
		if n.Op == ir.OpLinear {
			for i, b := range []int{1, 8, 64, 512} {
				tb.Put(autotune.Entry{Op: "gemm", DType: "bf16", N: n.Inputs[1].Shape[0], K: n.Inputs[0].Shape[1], Bucket: b, ColGrain: 4 << i, RowBlock: 16 << i})
			}
		}
	}
	require.NoError(t, tb.Save(dir))
	return dir
}

// Golden IR text of each rewrite on the tiny model's decode graph.
func TestPassGoldenIR(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	tdir := fixedTable(t, ck.Config())
	for _, n := range builtins {
		g, _, _ := explain(t, ck.Config(), graph.Decode, []pass.Request{request(n, tdir)}, nil)
		path := filepath.Join("testdata", "golden", n+".decode.golden")
		if os.Getenv("GLMFLASH_UPDATE_GOLDEN") != "" {
			require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
			require.NoError(t, os.WriteFile(path, []byte(g.Text()), 0o644))
		}
		want, err := os.ReadFile(path)
		require.NoError(t, err, "run with GLMFLASH_UPDATE_GOLDEN=1 to create %s", path)
		require.Equal(t, string(want), g.Text(), n)
	}
}

type fakeWeights map[string]safetensors.DType

func (f fakeWeights) DType(name string) (safetensors.DType, bool) {
	dt, ok := f[name]
	return dt, ok
}

// Ineligible inputs leave the graph unchanged and report the reason.
func TestIneligibleSitesAreReported(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	cfg := ck.Config()
	env := func(mut func(e *pass.Env)) *pass.Env {
		e := &pass.Env{Model: cfg, TP: pass.Topology{Size: 1, Known: true}, HostLengths: true, CaptureHidden: map[int]bool{}}
		mut(e)
		return e
	}
	kda := []pass.Request{{Name: kdafusion.Name}}
	skippedAll := func(rep *pass.Report, p, reason string) {
		pr := rep.Find(p)
		require.Empty(t, pr.Fired)
		require.NotEmpty(t, pr.Skipped)
		for _, s := range pr.Skipped {
			require.Contains(t, s.Reason, reason)
		}
	}
	// heads not divisible by a simulated attention-TP size
	g, rep, before := explain(t, cfg, graph.Decode, kda, env(func(e *pass.Env) { e.TP = pass.Topology{Size: 3, Known: true} }))
	skippedAll(rep, kdafusion.Name, "4 KDA heads not divisible by attention-TP size 3")
	require.Equal(t, before, g.Text())
	// TP metadata missing
	g, rep, before = explain(t, cfg, graph.Decode, kda, env(func(e *pass.Env) { e.TP = pass.Topology{} }))
	skippedAll(rep, kdafusion.Name, "attention-TP rank/size metadata missing")
	require.Equal(t, before, g.Text())
	// a LoRA adapter on k_proj
	g, rep, before = explain(t, cfg, graph.Decode, kda, env(func(e *pass.Env) { e.LoRA = []pass.LoRATarget{{Adapter: "demo", Module: "k_proj"}} }))
	skippedAll(rep, kdafusion.Name, `LoRA adapter "demo" targets k_proj`)
	require.Equal(t, before, g.Text())
	// q_proj FP8 while the rest is BF16: the bfg form at that layer only
	q0 := "model.language_model.layers.0.self_attn.q_proj.weight"
	_, rep, _ = explain(t, cfg, graph.Decode, kda, env(func(e *pass.Env) { e.Weights = fakeWeights{q0: safetensors.F8E4M3} }))
	pr := rep.Find(kdafusion.Name)
	require.Len(t, pr.Fired, 6)
	require.Equal(t, "partial bfg form: q_proj is FP8 but k_proj is BF16", pr.Fired[0].Note)
	require.Equal(t, "full qkvbfg form", pr.Fired[1].Note)
	// f_b FP8: nothing fuses at that layer
	_, rep, _ = explain(t, cfg, graph.Decode, kda, env(func(e *pass.Env) {
		e.Weights = fakeWeights{"model.language_model.layers.1.self_attn.f_b_proj.weight": safetensors.F8E4M3}
	}))
	pr = rep.Find(kdafusion.Name)
	require.Len(t, pr.Fired, 5)
	require.Equal(t, "layer 1", pr.Skipped[0].Where)
	require.Contains(t, pr.Skipped[0].Reason, "f_b_proj is FP8")
	// the native FP8 layout keeps every KDA projection BF16: eligible
	_, rep, _ = explain(t, cfg, graph.Decode, kda, env(func(e *pass.Env) {
		e.Weights = fakeWeights{"model.language_model.layers.3.self_attn.q_a_proj.weight": safetensors.F8E4M3}
	}))
	require.Len(t, rep.Find(kdafusion.Name).Fired, 6)

	// mHC: hidden capture after layer 2 blocks the 2 → 3 boundary; terminal layer
	mhc := []pass.Request{{Name: mhcfusion.Name}}
	_, rep, _ = explain(t, cfg, graph.Decode, mhc, env(func(e *pass.Env) { e.CaptureHidden = map[int]bool{2: true} }))
	pr = rep.Find(mhcfusion.Name)
	require.Len(t, pr.Skipped, 2)
	require.Equal(t, "layer 2 ffn → layer 3 attn", pr.Skipped[0].Where)
	require.Contains(t, pr.Skipped[0].Reason, "hidden-state capture requested after layer 2")
	require.Contains(t, pr.Skipped[1].Reason, "terminal layer")
	_, rep, _ = explain(t, cfg, graph.Decode, []pass.Request{{Name: mhcfusion.Name, Options: map[string]any{"cross_layer": false}}}, nil)
	require.Len(t, rep.Find(mhcfusion.Name).Fired, cfg.NumHiddenLayers)

	// DSA metadata: kpool 1 has nothing to pool
	c1 := cfg.Clone()
	c1.IndexKPool = 1
	g, rep, before = explain(t, c1, graph.Decode, []pass.Request{{Name: dsameta.Name}}, nil)
	skippedAll(rep, dsameta.Name, "kpool 1 ≤ 1")
	require.Equal(t, before, g.Text())

	// host lengths absent, or produced by the computation
	g, rep, before = explain(t, cfg, graph.Decode, []pass.Request{{Name: hostlen.Name}}, env(func(e *pass.Env) { e.HostLengths = false }))
	skippedAll(rep, hostlen.Name, "host batch metadata is absent")
	require.Equal(t, before, g.Text())

	// a bucket with no tuning entry while tuning at start is off
	empty := t.TempDir()
	g, rep, before = explain(t, cfg, graph.Decode, []pass.Request{{Name: autotune.Name, Options: map[string]any{"table_dir": empty}}}, nil)
	pr = rep.Find(autotune.Name)
	require.Empty(t, pr.Fired)
	require.Contains(t, pr.Skipped[len(pr.Skipped)-1].Reason, "no tuning entry for this bucket and tune_at_start is off")
	require.Equal(t, before, g.Text())
	_, err := os.Stat(filepath.Join(empty, "x"))
	require.True(t, os.IsNotExist(err))
}

// With host-length-reuse on, no node reads the executor's lengths: a
// poisoned executor copy changes nothing. Without it, the poisoned copy is
// detected and the run fails loudly.
func TestHostLengthReuseNeverReadsExecutorLengths(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	cfg := ck.Config()
	toks := seqTokens(30, 3, cfg.VocabSize)
	run := func(reqs []pass.Request) (*backend.Result, backend.Program, error) {
		pl, err := pass.NewPipeline(reqs, true)
		require.NoError(t, err)
		e, err := engine.New(cfg, ck, engine.Options{Slots: 1, Passes: pl, Backend: backend.Options{PoisonDeviceLengths: true}})
		require.NoError(t, err)
		s, _ := e.Store().Alloc()
		key := engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}
		p, err := e.Program(key)
		require.NoError(t, err)
		r, err := e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: toks}}})
		return r, p, err
	}
	res, prog, err := run([]pass.Request{{Name: hostlen.Name}})
	require.NoError(t, err)
	require.Zero(t, prog.Stats().DeviceLengthReads)
	for _, n := range prog.Plan().Graph.Nodes {
		require.NotEqual(t, ir.OpSeqLengths, n.Op)
	}
	clean := engineWith(t, ck, nil, nil)
	s, _ := clean.Store().Alloc()
	want, err := clean.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: toks}}})
	require.NoError(t, err)
	require.Equal(t, want.Logits, res.Logits)

	_, _, err = run(nil)
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "device length"), err.Error())
}

// The mHC fusion's token cap declines (runs unfused) above the cap with the
// same results.
func TestMHCFusionTokenCap(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	e := engineWith(t, ck, []pass.Request{{Name: mhcfusion.Name, Options: map[string]any{"max_tokens": 8}}}, nil)
	base := engineWith(t, ck, nil, nil)
	for _, n := range []int{5, 40} {
		toks := seqTokens(n, 1, ck.Config().VocabSize)
		key := engine.Key{Mode: graph.Prefill, Logits: graph.AllLogits}
		a, _ := e.Store().Alloc()
		ra, err := e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: a, Tokens: toks}}})
		require.NoError(t, err)
		b, _ := base.Store().Alloc()
		rb, err := base.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: b, Tokens: toks}}})
		require.NoError(t, err)
		require.Equal(t, rb.Logits, ra.Logits, "n=%d", n)
		e.Store().Free(a)
		base.Store().Free(b)
	}
	p, err := e.Program(engine.Key{Mode: graph.Prefill, Logits: graph.AllLogits})
	require.NoError(t, err)
	require.EqualValues(t, 15, p.Stats().FusedMHCRuns) // the 5-token batch fused all 15 boundaries; the 40-token one declined
}

// A tuning table persisted by one start is loaded by the next, and gives the
// same graph (deterministic given a table).
func TestAutotuneTablePersistsAndReloads(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	dir := t.TempDir()
	req := []pass.Request{{Name: autotune.Name, Options: map[string]any{"tune_at_start": true, "table_dir": dir, "buckets": []int{1, 64}, "reps": 1, "cpu": "unit"}}}
	g1, rep1, _ := explain(t, ck.Config(), graph.Prefill, req, nil)
	require.NotEmpty(t, rep1.Find(autotune.Name).Fired)
	files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	require.Len(t, files, 1)
	req[0].Options["tune_at_start"] = false
	g2, rep2, _ := explain(t, ck.Config(), graph.Prefill, req, nil)
	require.Equal(t, len(rep1.Find(autotune.Name).Fired), len(rep2.Find(autotune.Name).Fired))
	require.Equal(t, g1.Text(), g2.Text())
	// a malformed table is an error in the report, not a crash
	require.NoError(t, os.WriteFile(files[0], []byte("{not json"), 0o644))
	_, rep3, _ := explain(t, ck.Config(), graph.Prefill, req, nil)
	require.Contains(t, rep3.Find(autotune.Name).Skipped[0].Reason, "tuning table")
}
