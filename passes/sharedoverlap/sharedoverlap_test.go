package sharedoverlap_test

import (
	"testing"

	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/passes/gateup"
	"github.com/glmflash/glmflash/passes/sharedoverlap"
	"github.com/stretchr/testify/require"
)

var req = []pass.Request{{Name: sharedoverlap.Name}}

// The rewrite of the tiny model's decode graph, as IR text.
func TestGoldenIR(t *testing.T) {
	f := passtest.TinyA(t)
	g, _, _ := passtest.Explain(t, f.Checkpoint.Config(), graph.Decode, req, nil)
	passtest.Golden(t, "testdata/tiny-a.decode.golden", g.StableText())
}

// sideNodes checks g's side-stream nodes: in every MoE layer with a shared
// expert, exactly the expert's nodes, all after the MoE input's producer
// and before the router's first node, read only by each other and the
// final add; it returns them by layer.
func sideNodes(t *testing.T, g *ir.Graph) map[int][]*ir.Node {
	t.Helper()
	side := map[int][]*ir.Node{}
	index := map[*ir.Node]int{}
	for i, n := range g.Nodes {
		index[n] = i
		if ir.AttrStream.Get(n) == 1 {
			side[n.Layer] = append(side[n.Layer], n)
		}
	}
	for _, n := range g.Nodes {
		if n.Op != ir.OpMoEExperts {
			continue
		}
		h, route := n.Inputs[0], n.Inputs[1].Producer
		router := route.Inputs[0].Producer // the gate's linear
		nodes := side[n.Layer]
		require.NotEmpty(t, nodes, "layer %d", n.Layer)
		for _, s := range nodes {
			require.Greater(t, index[s], index[h.Producer], "layer %d: %s before the MoE input", n.Layer, s.Op)
			require.Less(t, index[s], index[router], "layer %d: %s after the router", n.Layer, s.Op)
		}
		last := nodes[len(nodes)-1]
		require.Equal(t, ir.OpLinear, last.Op)
		require.Contains(t, last.Inputs[1].Ref, "shared_experts.down_proj")
		users := g.Users(last.Outputs[0])
		require.Len(t, users, 1)
		require.Equal(t, ir.OpAdd, users[0].Op)
		require.Zero(t, ir.AttrStream.Get(users[0]), "the add joins the main stream")
	}
	return side
}

// Every MoE layer's shared expert moves before its router, on stream 1: the
// gate, up, swiglu and down nodes; after mlp-gate-up-fusion, the fused
// projection, swiglu_packed and down. In every batch mode.
func TestMarksEverySharedExpert(t *testing.T) {
	for _, dir := range passtest.Fixtures(t) {
		cfg := passtest.OpenFixture(t, dir).Checkpoint.Config()
		moe := 0
		for l := 0; l < cfg.NumHiddenLayers; l++ {
			if cfg.IsMoE(l) {
				moe++
			}
		}
		for _, mode := range []graph.Mode{graph.Prefill, graph.Decode, graph.Mixed} {
			g, rep, _ := passtest.Explain(t, cfg, mode, req, nil)
			pr := rep.Find(sharedoverlap.Name)
			require.Len(t, pr.Fired, moe, dir)
			side := sideNodes(t, g)
			require.Len(t, side, moe)
			for l, nodes := range side {
				require.Len(t, nodes, 4, "layer %d: gate, up, swiglu, down", l)
			}
			g, _, _ = passtest.Explain(t, cfg, mode, []pass.Request{{Name: gateup.Name}, {Name: sharedoverlap.Name}}, nil)
			for l, nodes := range sideNodes(t, g) {
				require.Len(t, nodes, 3, "layer %d: gate_up, swiglu_packed, down", l)
				require.Equal(t, ir.OpSwiGLUPacked, nodes[1].Op)
			}
		}
	}
}

// A second run finds every shared expert already on the side stream and
// says so.
func TestSkipsWhatIsAlreadyOnTheSideStream(t *testing.T) {
	cfg := passtest.TinyA(t).Checkpoint.Config()
	_, rep, _ := passtest.Explain(t, cfg, graph.Decode, []pass.Request{{Name: sharedoverlap.Name}, {Name: sharedoverlap.Name}}, nil)
	var second *pass.PassReport
	for i := range rep.Passes {
		if rep.Passes[i].Name == sharedoverlap.Name {
			second = &rep.Passes[i]
		}
	}
	require.NotNil(t, second)
	require.Empty(t, second.Fired)
	require.NotEmpty(t, second.Skipped)
	for _, s := range second.Skipped {
		require.Contains(t, s.Reason, "already on a side stream")
	}
}

// On speculative decoding's graphs the MTP layer's shared expert moves too.
func TestSpeculativeGraphs(t *testing.T) {
	cfg := passtest.TinyMTP(t).Config()
	reps := passtest.SpecStatement(t, sharedoverlap.Name, cfg, nil)
	require.NotEmpty(t, reps["verify"].Fired)
	for _, name := range []string{"draft-extend", "draft-extend-accepted", "draft-step"} {
		require.Len(t, reps[name].Fired, 1, name)
		require.Equal(t, cfg.MTPLayer(0), reps[name].Fired[0].Layer, name)
	}
}

// The conformance suite; a model without shared experts has no site.
func TestConformance(t *testing.T) {
	passtest.Run(t, passtest.TinyA(t), passtest.Subject{Name: sharedoverlap.Name,
		Ineligible: passtest.Ineligibility{Model: func(c *model.Config) { c.NSharedExperts = 0 }}})
}
