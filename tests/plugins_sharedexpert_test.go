package tests

import (
	"fmt"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/glmflash/glmflash/plugins/examples/sharedexpert/fusion"
	"github.com/glmflash/glmflash/plugins/host"
	"github.com/glmflash/glmflash/plugins/protocol"
	"github.com/glmflash/glmflash/plugins/sdk"
	pb "github.com/glmflash/glmflash/proto/glmflash/plugin/v1"
	"github.com/hashicorp/go-plugin"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// explainWith runs one pass (resolved by r) over cfg's decode graph.
func explainWith(t *testing.T, r pass.Resolver, name string, opts map[string]any, env *pass.Env, mode graph.Mode) (*ir.Graph, *pass.Report, string) {
	t.Helper()
	ck, _ := openFixture(t, fixtures[0])
	cfg := ck.Config()
	if env == nil {
		env = &pass.Env{Model: cfg, TP: pass.Topology{Size: 1, Known: true}, HostLengths: true}
	}
	if env.Model != nil {
		cfg = env.Model
	}
	g, err := graph.Build(cfg, graph.Options{Mode: mode, Logits: graph.LastLogits})
	require.NoError(t, err)
	before := g.Text()
	pl, err := pass.NewPipelineWith([]pass.Request{{Name: name, Options: opts}}, true, r)
	require.NoError(t, err)
	rep, err := pl.Run(g, env)
	require.NoError(t, err)
	return g, rep, before
}

// The example pass's rewrite and each of its ineligibility reasons.
func TestSharedExpertFusionEligibility(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	cfg := ck.Config()
	base := func(mut func(e *pass.Env)) *pass.Env {
		e := &pass.Env{Model: cfg, TP: pass.Topology{Size: 1, Known: true}, HostLengths: true}
		mut(e)
		return e
	}
	// the rewrite: per MoE layer the shared expert's 3 linears, swiglu and
	// add disappear; one moe_append_expert and derived [E+1,…] weights appear
	g, rep, _ := explainWith(t, inProcessFusion, fusion.Name, nil, nil, graph.Decode)
	pr := rep.Find(fusion.Name)
	require.Len(t, pr.Fired, 5)
	require.Equal(t, "layer 3", pr.Fired[0].Where)
	require.Equal(t, "shared expert appended as expert 8", pr.Fired[0].Note)
	text := g.Text()
	for _, want := range []string{"l3.moe.idx+shared : i32[T,3], ", " : f32[T,3] = moe_append_expert @L3(", ") {expert=8}\n",
		"l3.mlp.experts+shared.down_proj : f32[9,64,32] = concat_rows @L3("} {
		require.True(t, strings.Contains(text, want), want)
	}
	require.Equal(t, 0, strings.Count(text, " = add @"))
	require.Equal(t, 0, strings.Count(text, "shared_experts.gate_proj : "), "the shared expert's linears are gone")
	require.Equal(t, 5, strings.Count(text, " = moe_experts @"))

	// layers option
	_, rep, _ = explainWith(t, inProcessFusion, fusion.Name, map[string]any{"layers": []any{4, 6}}, nil, graph.Decode)
	pr = rep.Find(fusion.Name)
	require.Len(t, pr.Fired, 2)
	require.Equal(t, "layer 3 is not in option layers", pr.Skipped[0].Reason)

	// LoRA on the shared expert, in its several spellings; a LoRA target
	// elsewhere does not matter
	for _, m := range []string{"shared_experts", "mlp.shared_experts", "shared_experts.up_proj", "down_proj"} {
		g, rep, before := explainWith(t, inProcessFusion, fusion.Name, nil, base(func(e *pass.Env) {
			e.LoRA = []pass.LoRATarget{{Adapter: "ad", Module: m}}
		}), graph.Decode)
		pr := rep.Find(fusion.Name)
		require.Empty(t, pr.Fired, m)
		require.Len(t, pr.Skipped, 5)
		require.Contains(t, pr.Skipped[0].Reason, `LoRA adapter "ad" targets shared_experts`, m)
		require.Equal(t, before, g.Text())
	}
	_, rep, _ = explainWith(t, inProcessFusion, fusion.Name, nil, base(func(e *pass.Env) {
		e.LoRA = []pass.LoRATarget{{Adapter: "ad", Module: "shared_experts", Layers: []int{5}}, {Adapter: "q", Module: "q_proj"}}
	}), graph.Decode)
	pr = rep.Find(fusion.Name)
	require.Len(t, pr.Fired, 4)
	require.Equal(t, "layer 5", pr.Skipped[0].Where)

	// the shared expert quantized differently from the routed experts
	sharedDown := "model.language_model.layers.4.mlp.shared_experts.down_proj.weight"
	_, rep, _ = explainWith(t, inProcessFusion, fusion.Name, nil, base(func(e *pass.Env) {
		e.Weights = fakeWeights{sharedDown: safetensors.F8E4M3}
	}), graph.Decode)
	pr = rep.Find(fusion.Name)
	require.Len(t, pr.Fired, 4)
	require.Equal(t, "layer 4", pr.Skipped[0].Where)
	require.Equal(t, "shared_experts.down_proj is FP8 but the routed experts are BF16", pr.Skipped[0].Reason)
	// …and all of them FP8 (the native FP8 layout): eligible
	all := fakeWeights{}
	for l := 3; l < cfg.NumHiddenLayers; l++ {
		for _, p := range []string{"gate_proj", "up_proj", "down_proj"} {
			all[fmt.Sprintf("model.language_model.layers.%d.mlp.shared_experts.%s.weight", l, p)] = safetensors.F8E4M3
			for e := 0; e < cfg.NRoutedExperts; e++ {
				all[fmt.Sprintf("model.language_model.layers.%d.mlp.experts.%d.%s.weight", l, e, p)] = safetensors.F8E4M3
			}
		}
	}
	_, rep, _ = explainWith(t, inProcessFusion, fusion.Name, nil, base(func(e *pass.Env) { e.Weights = all }), graph.Decode)
	require.Len(t, rep.Find(fusion.Name).Fired, 5)

	// a shared expert wider than a routed one (the fixture c's two shared experts)
	c2 := cfg.Clone()
	c2.NSharedExperts = 2
	_, rep, _ = explainWith(t, inProcessFusion, fusion.Name, nil, &pass.Env{Model: c2, TP: pass.Topology{Size: 1, Known: true}}, graph.Decode)
	pr = rep.Find(fusion.Name)
	require.Empty(t, pr.Fired)
	require.Equal(t, "shared expert width 64 (n_shared_experts 2 × moe_intermediate_size 32) differs from a routed expert's 32", pr.Skipped[0].Reason)

	// no shared expert at all
	c0 := cfg.Clone()
	c0.NSharedExperts = 0
	_, rep, _ = explainWith(t, inProcessFusion, fusion.Name, nil, &pass.Env{Model: c0, TP: pass.Topology{Size: 1, Known: true}}, graph.Decode)
	require.Contains(t, rep.Find(fusion.Name).Skipped[0].Reason, "n_shared_experts = 0")

	// already fused: a second application finds nothing to do
	g, _, _ = explainWith(t, inProcessFusion, fusion.Name, nil, nil, graph.Prefill)
	pl, err := pass.NewPipelineWith([]pass.Request{{Name: fusion.Name}}, true, inProcessFusion)
	require.NoError(t, err)
	rep, err = pl.Run(g, &pass.Env{Model: cfg})
	require.NoError(t, err)
	require.Empty(t, rep.Find(fusion.Name).Fired)
}

// moe_experts adds a token's contributions in ascending expert order and
// the appended shared expert has the largest id: the fused layer adds the
// same terms in the same order as the unfused routed-sum-then-add. Checked
// on every fixture case to 1e-6 (with today's kernels: bit for bit; a
// shared expert computed by a different GEMM kernel than the dense linear
// may round differently).
func TestSharedExpertFusionMatchesUnfused(t *testing.T) {
	for _, name := range fixtures[:2] {
		ck, ref := openFixture(t, name)
		f := &passtest.Fixture{Checkpoint: ck, Reference: ref}
		base := passtest.RunCases(t, f, nil)
		pl, err := pass.NewPipelineWith([]pass.Request{{Name: fusion.Name}}, true, inProcessFusion)
		require.NoError(t, err)
		e, err := engine.New(ck.Config(), ck, engine.Options{Slots: 2, Passes: pl, PassEnv: config.Default().PassEnv(ck.Config(), ck)})
		require.NoError(t, err)
		got := passtest.RunCases(t, f, e)
		worst, err := passtest.Compare(base, got, ck.Config().VocabSize)
		require.NoError(t, err, name)
		require.LessOrEqual(t, worst, 1e-6, name)
		bitwise := true
		for i := range base {
			bitwise = bitwise && maxDiff(base[i], got[i]) == 0
		}
		t.Logf("%s: max|Δ| %.1e, bit-identical: %v", name, worst, bitwise)
		require.NotEmpty(t, e.Report(engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}).Find(fusion.Name).Fired)
	}
}

// The pass over go-plugin's in-memory gRPC connection (no subprocess):
// the host adapter and the SDK server give the same graph as the pass run
// in process, in every mode.
func TestPluginInProcessGRPC(t *testing.T) {
	client, server := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{
		protocol.PluginName: &protocol.GRPCPass{Impl: sdk.NewServer(fusion.Description, fusion.New())},
	})
	defer client.Close()
	defer server.Stop()
	raw, err := client.Dispense(protocol.PluginName)
	require.NoError(t, err)
	p, err := host.Connect(raw.(pb.PassPluginClient), host.Options{Log: zerolog.Nop()})
	require.NoError(t, err)
	require.Equal(t, fusion.Name, p.Name)
	want, err := pass.DescriptionOf(fusion.Description, fusion.New())
	require.NoError(t, err)
	require.Equal(t, want, p.Desc)
	remote := resolver{fusion.Name: p.Registration()}
	for _, mode := range []graph.Mode{graph.Prefill, graph.Decode, graph.Extend, graph.Mixed} {
		for _, opts := range []map[string]any{nil, {"layers": []any{3, 7}}} {
			gl, repl, _ := explainWith(t, inProcessFusion, fusion.Name, opts, nil, mode)
			gr, repr, _ := explainWith(t, remote, fusion.Name, opts, nil, mode)
			require.Equal(t, gl.Text(), gr.Text(), mode)
			require.Equal(t, repl.Find(fusion.Name).Fired, repr.Find(fusion.Name).Fired)
			require.Equal(t, repl.Find(fusion.Name).Skipped, repr.Find(fusion.Name).Skipped)
		}
	}
	// options the plugin rejects are a configuration error, as for a built-in pass
	_, err = pass.NewPipelineWith([]pass.Request{{Name: fusion.Name, Options: map[string]any{"layers": []any{-1}}}}, true, remote)
	require.ErrorContains(t, err, "rejected its options: option layers: layer -1 is negative")
	_, err = pass.NewPipelineWith([]pass.Request{{Name: fusion.Name, Options: map[string]any{"layer": 1}}}, true, remote)
	require.ErrorContains(t, err, `unknown option "layer"`)
}
