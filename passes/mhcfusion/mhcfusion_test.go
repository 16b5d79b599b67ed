package mhcfusion_test

import (
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/passes/mhcfusion"
	"github.com/stretchr/testify/require"
)

var req = []pass.Request{{Name: mhcfusion.Name}}

// The rewrite of the tiny model's decode graph, as IR text.
func TestGoldenIR(t *testing.T) {
	f := passtest.TinyA(t)
	g, _, _ := passtest.Explain(t, f.Checkpoint.Config(), graph.Decode, req, nil)
	passtest.Golden(t, "testdata/tiny-a.decode.golden", g.StableText())
}

// Every mHC post but the terminal one fuses with the next pre, with its
// RMSNorm.
func TestFiresAtEveryBoundaryButTheLast(t *testing.T) {
	for _, dir := range passtest.Fixtures(t) {
		cfg := passtest.OpenFixture(t, dir).Checkpoint.Config()
		L := int64(cfg.NumHiddenLayers)
		_, rep, _ := passtest.Explain(t, cfg, graph.Decode, req, nil)
		pr := rep.Find(mhcfusion.Name)
		require.Len(t, pr.Fired, int(2*L-1), dir)
		require.Len(t, pr.Skipped, 1, dir)
		require.Contains(t, pr.Skipped[0].Reason, "terminal layer")
		require.Equal(t, []int64{L, L - 1, 2*L - 1}, []int64{pr.Stats[0].Value, pr.Stats[1].Value, pr.Stats[2].Value}, dir)
	}
}

// Hidden-state capture blocks the boundary after the captured layer; the
// options switch boundary kinds off.
func TestIneligibleSitesAreReported(t *testing.T) {
	cfg := passtest.TinyA(t).Checkpoint.Config()
	env := pass.NewEnv(cfg, nil)
	env.CaptureHidden = map[int]bool{2: true}
	_, rep, _ := passtest.Explain(t, cfg, graph.Decode, req, env)
	pr := rep.Find(mhcfusion.Name)
	require.Len(t, pr.Skipped, 2)
	require.Equal(t, "layer 2 ffn → layer 3 attn", pr.Skipped[0].Where)
	require.Contains(t, pr.Skipped[0].Reason, "hidden-state capture requested after layer 2")
	require.Contains(t, pr.Skipped[1].Reason, "terminal layer")

	_, rep, _ = passtest.Explain(t, cfg, graph.Decode, []pass.Request{{Name: mhcfusion.Name, Options: map[string]any{"cross_layer": false}}}, nil)
	require.Len(t, rep.Find(mhcfusion.Name).Fired, cfg.NumHiddenLayers)
	g, rep, before := passtest.Explain(t, cfg, graph.Decode, []pass.Request{{Name: mhcfusion.Name, Options: map[string]any{"cross_layer": false, "intra_layer": false}}}, nil)
	require.Empty(t, rep.Find(mhcfusion.Name).Fired)
	require.Equal(t, before, g.Text())

	_, err := pass.NewPipeline([]pass.Request{{Name: mhcfusion.Name, Options: map[string]any{"max_tokens": -1}}}, true)
	require.ErrorContains(t, err, "option max_tokens must be ≥ 0, got -1")
}

// The token cap declines (runs unfused) above the cap with the same
// results.
func TestTokenCap(t *testing.T) {
	f := passtest.TinyA(t)
	cfg := f.Checkpoint.Config()
	newEngine := func(reqs []pass.Request) *engine.Engine {
		pl, err := pass.NewPipeline(reqs, true)
		require.NoError(t, err)
		e, err := engine.New(cfg, f.Checkpoint, engine.Options{Slots: 1, Passes: pl, PassEnv: pass.NewEnv(cfg, f.Checkpoint)})
		require.NoError(t, err)
		t.Cleanup(func() { e.Close() })
		return e
	}
	e := newEngine([]pass.Request{{Name: mhcfusion.Name, Options: map[string]any{"max_tokens": 8}}})
	base := newEngine(nil)
	key := engine.Key{Mode: graph.Prefill, Logits: graph.AllLogits}
	for _, n := range []int{5, 40} {
		toks := make([]int32, n)
		for i := range toks {
			toks[i] = int32((131 + i*17 + i*i*7) % cfg.VocabSize)
		}
		run := func(e *engine.Engine) []float32 {
			s, err := e.Store().Alloc()
			require.NoError(t, err)
			defer e.Store().Free(s)
			r, err := e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: toks}}})
			require.NoError(t, err)
			return r.Logits
		}
		require.Equal(t, run(base), run(e), "n=%d", n)
	}
	p, err := e.Program(key)
	require.NoError(t, err)
	require.EqualValues(t, 15, p.Stats().FusedMHCRuns) // the 5-token batch fused all 15 boundaries; the 40-token one declined
}

// The conformance suite.
func TestConformance(t *testing.T) {
	passtest.Run(t, passtest.TinyA(t), passtest.Subject{Name: mhcfusion.Name,
		Ineligible: passtest.Ineligibility{Options: map[string]any{"intra_layer": false, "cross_layer": false}}})
}
