package kdafusion_test

import (
	"testing"

	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/glmflash/glmflash/passes/kdafusion"
	"github.com/stretchr/testify/require"
)

var req = []pass.Request{{Name: kdafusion.Name}}

// The rewrite of the tiny model's decode graph, as IR text.
func TestGoldenIR(t *testing.T) {
	f := passtest.TinyA(t)
	g, _, _ := passtest.Explain(t, f.Checkpoint.Config(), graph.Decode, req, nil)
	passtest.Golden(t, "testdata/tiny-a.decode.golden", g.StableText())
}

// Every KDA layer of every fixture fuses in the full form; the statistics
// count what was removed.
func TestFiresOncePerKDALayer(t *testing.T) {
	for _, dir := range passtest.Fixtures(t) {
		cfg := passtest.OpenFixture(t, dir).Checkpoint.Config()
		kda := 0
		for l := 0; l < cfg.NumHiddenLayers; l++ {
			if cfg.IsKDA(l) {
				kda++
			}
		}
		_, rep, _ := passtest.Explain(t, cfg, graph.Decode, req, nil)
		pr := rep.Find(kdafusion.Name)
		require.Len(t, pr.Fired, kda, dir)
		require.Equal(t, []pass.Statistic{
			{Name: "full_layers", Value: int64(kda), Doc: "layers fused in the full qkvbfg form"},
			{Name: "bfg_layers", Value: 0, Doc: "layers fused in the partial bfg form"},
			{Name: "gemms_removed", Value: int64(6 * kda), Doc: "GEMM nodes removed, net of the split and batched GEMMs added"},
		}, pr.Stats, dir)
	}
}

type weights map[string]safetensors.DType

func (w weights) DType(name string) (safetensors.DType, bool) {
	dt, ok := w[name]
	return dt, ok
}

// Ineligible layers are reported with their reason and left unchanged.
func TestIneligibleSitesAreReported(t *testing.T) {
	cfg := passtest.TinyA(t).Checkpoint.Config()
	env := func(mut func(e *pass.Env)) *pass.Env {
		e := pass.NewEnv(cfg, nil)
		mut(e)
		return e
	}
	skippedAll := func(rep *pass.Report, reason string) {
		pr := rep.Find(kdafusion.Name)
		require.Empty(t, pr.Fired)
		require.NotEmpty(t, pr.Skipped)
		for _, s := range pr.Skipped {
			require.Contains(t, s.Reason, reason)
		}
	}
	// heads not divisible by a simulated attention-TP size
	g, rep, before := passtest.Explain(t, cfg, graph.Decode, req, env(func(e *pass.Env) { e.TP = pass.Topology{Size: 3, Known: true} }))
	skippedAll(rep, "4 KDA heads not divisible by attention-TP size 3")
	require.Equal(t, before, g.Text())
	// TP metadata missing
	g, rep, before = passtest.Explain(t, cfg, graph.Decode, req, env(func(e *pass.Env) { e.TP = pass.Topology{} }))
	skippedAll(rep, "attention-TP rank/size metadata missing")
	require.Equal(t, before, g.Text())
	// a LoRA adapter on k_proj
	g, rep, before = passtest.Explain(t, cfg, graph.Decode, req, env(func(e *pass.Env) { e.LoRA = []pass.LoRATarget{{Adapter: "demo", Module: "k_proj"}} }))
	skippedAll(rep, `LoRA adapter "demo" targets k_proj`)
	require.Equal(t, before, g.Text())
	// q_proj FP8 while the rest is BF16: the bfg form at that layer only
	q0 := "model.language_model.layers.0.self_attn.q_proj.weight"
	_, rep, _ = passtest.Explain(t, cfg, graph.Decode, req, env(func(e *pass.Env) { e.Weights = weights{q0: safetensors.F8E4M3} }))
	pr := rep.Find(kdafusion.Name)
	require.Len(t, pr.Fired, 6)
	require.Equal(t, "partial bfg form: q_proj is FP8 but k_proj is BF16", pr.Fired[0].Note)
	require.Equal(t, "full qkvbfg form", pr.Fired[1].Note)
	require.Equal(t, int64(1), pr.Stats[1].Value, "one bfg layer")
	// option form=full refuses the bfg form
	_, rep, _ = passtest.Explain(t, cfg, graph.Decode, []pass.Request{{Name: kdafusion.Name, Options: map[string]any{"form": "full"}}},
		env(func(e *pass.Env) { e.Weights = weights{q0: safetensors.F8E4M3} }))
	pr = rep.Find(kdafusion.Name)
	require.Len(t, pr.Fired, 5)
	require.Contains(t, pr.Skipped[0].Reason, "only the bfg form applies")
	// f_b FP8: nothing fuses at that layer
	_, rep, _ = passtest.Explain(t, cfg, graph.Decode, req, env(func(e *pass.Env) {
		e.Weights = weights{"model.language_model.layers.1.self_attn.f_b_proj.weight": safetensors.F8E4M3}
	}))
	pr = rep.Find(kdafusion.Name)
	require.Len(t, pr.Fired, 5)
	require.Equal(t, "layer 1", pr.Skipped[0].Where)
	require.Contains(t, pr.Skipped[0].Reason, "f_b_proj is FP8")
	// the native FP8 layout keeps every KDA projection BF16: eligible
	_, rep, _ = passtest.Explain(t, cfg, graph.Decode, req, env(func(e *pass.Env) {
		e.Weights = weights{"model.language_model.layers.3.self_attn.q_a_proj.weight": safetensors.F8E4M3}
	}))
	require.Len(t, rep.Find(kdafusion.Name).Fired, 6)
}

// The conformance suite: pure eligibility, determinism, verifier-clean
// output, no change when ineligible, parity with transformers' fixture.
func TestConformance(t *testing.T) {
	passtest.Run(t, passtest.TinyA(t), passtest.Subject{Name: kdafusion.Name,
		Ineligible: passtest.Ineligibility{Env: func(e *pass.Env) { e.TP = pass.Topology{} }}})
}
