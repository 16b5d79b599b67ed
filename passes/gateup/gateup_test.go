package gateup_test

import (
	"testing"

	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/glmflash/glmflash/passes/gateup"
	"github.com/stretchr/testify/require"
)

var req = []pass.Request{{Name: gateup.Name}}

// The rewrite of the tiny model's decode graph, as IR text.
func TestGoldenIR(t *testing.T) {
	f := passtest.TinyA(t)
	g, _, _ := passtest.Explain(t, f.Checkpoint.Config(), graph.Decode, req, nil)
	passtest.Golden(t, "testdata/tiny-a.decode.golden", g.StableText())
}

// Every SwiGLU MLP fuses: one per layer (its dense MLP or its MoE layer's
// shared expert); with shared_experts=false, the dense layers only.
func TestFiresOncePerMLP(t *testing.T) {
	for _, dir := range passtest.Fixtures(t) {
		cfg := passtest.OpenFixture(t, dir).Checkpoint.Config()
		dense := 0
		for l := 0; l < cfg.NumHiddenLayers; l++ {
			if !cfg.IsMoE(l) {
				dense++
			}
		}
		g, rep, _ := passtest.Explain(t, cfg, graph.Decode, req, nil)
		pr := rep.Find(gateup.Name)
		require.Len(t, pr.Fired, cfg.NumHiddenLayers, dir)
		require.Equal(t, int64(cfg.NumHiddenLayers), pr.Stats[0].Value)
		for _, n := range g.Nodes {
			require.NotEqual(t, ir.OpSwiGLU, n.Op, "every swiglu was replaced")
		}
		_, rep, _ = passtest.Explain(t, cfg, graph.Decode, []pass.Request{{Name: gateup.Name, Options: map[string]any{"shared_experts": false}}}, nil)
		pr = rep.Find(gateup.Name)
		require.Len(t, pr.Fired, dense, dir)
		require.Len(t, pr.Skipped, cfg.NumHiddenLayers-dense, dir)
		for _, s := range pr.Skipped {
			require.Contains(t, s.Reason, "option shared_experts=false")
		}
	}
}

type weights map[string]safetensors.DType

func (w weights) DType(name string) (safetensors.DType, bool) {
	dt, ok := w[name]
	return dt, ok
}

// Projections stored differently, or targeted by a LoRA adapter, stay as
// they are.
func TestIneligibleSitesAreReported(t *testing.T) {
	cfg := passtest.TinyA(t).Checkpoint.Config()
	env := pass.NewEnv(cfg, weights{"model.language_model.layers.0.mlp.up_proj.weight": safetensors.F8E4M3})
	_, rep, _ := passtest.Explain(t, cfg, graph.Decode, req, env)
	pr := rep.Find(gateup.Name)
	require.Len(t, pr.Skipped, 1)
	require.Equal(t, "layer 0 mlp", pr.Skipped[0].Where)
	require.Equal(t, "gate_proj is BF16 but up_proj is F8_E4M3", pr.Skipped[0].Reason)

	env = pass.NewEnv(cfg, nil)
	env.LoRA = []pass.LoRATarget{{Adapter: "a", Module: "up_proj"}}
	g, rep, before := passtest.Explain(t, cfg, graph.Decode, req, env)
	require.Empty(t, rep.Find(gateup.Name).Fired)
	require.Equal(t, before, g.Text())
}

// The conformance suite: parity with the pass-off engine on the fixture
// proves the CPU binding of swiglu_packed too.
func TestConformance(t *testing.T) {
	passtest.Run(t, passtest.TinyA(t), passtest.Subject{Name: gateup.Name,
		Ineligible: passtest.Ineligibility{Env: func(e *pass.Env) { e.LoRA = []pass.LoRATarget{{Adapter: "a", Module: "gate_proj"}} }}})
}
