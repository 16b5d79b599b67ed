package tests

import (
	"testing"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/glmflash/glmflash/plugins/examples/sharedexpert/fusion"
	"github.com/glmflash/glmflash/plugins/host"
	"github.com/glmflash/glmflash/plugins/wire"
	pb "github.com/glmflash/glmflash/proto/glmflash/plugin/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

// resolver resolves in-process passes by name.
type resolver map[string]pass.Registration

func (r resolver) Lookup(n string) (pass.Registration, bool) { f, ok := r[n]; return f, ok }
func (r resolver) Names() []string {
	var n []string
	for k := range r {
		n = append(n, k)
	}
	return n
}

var inProcessFusion = resolver{fusion.Name: {Description: fusion.Description, New: fusion.New}}

// roundTrip serializes g to protobuf bytes and back.
func roundTrip(t *testing.T, g *ir.Graph) *ir.Graph {
	t.Helper()
	enc, err := wire.EncodeGraph(g)
	require.NoError(t, err)
	b, err := proto.Marshal(enc.Graph)
	require.NoError(t, err)
	var m pb.Graph
	require.NoError(t, proto.Unmarshal(b, &m))
	out, err := wire.DecodeGraph(&m)
	require.NoError(t, err)
	return out
}

// The IR round-trips losslessly through protobuf: the real graphs of every
// fixture in every mode, as built and after every built-in pass and the
// example plugin's pass (which add linear_split, linear_batched,
// mhc_post_pre, moe_append_expert, derived weights, tuned attributes...).
func TestPluginWireIRRoundTrip(t *testing.T) {
	tdir := ""
	for _, name := range fixtures {
		ck, _ := openFixture(t, name)
		cfg := ck.Config()
		if tdir == "" {
			tdir = fixedTable(t, cfg)
		}
		all := append(defaultRequests(tdir), pass.Request{Name: fusion.Name})
		for _, mode := range []graph.Mode{graph.Prefill, graph.Decode, graph.Extend, graph.Mixed} {
			for _, lg := range []graph.Logits{graph.AllLogits, graph.LastLogits} {
				for _, capture := range []bool{false, true} {
					g, err := graph.Build(cfg, graph.Options{Mode: mode, Logits: lg, CaptureHidden: capture})
					require.NoError(t, err)
					back := roundTrip(t, g)
					require.Equal(t, g.Text(), back.Text(), "%s %s/%s", name, mode, lg)
					require.NoError(t, back.Verify())
					// the decoded graph is a working graph: passes run on it
					pl, err := pass.NewPipelineWith(all, true, inProcessFusion)
					require.NoError(t, err)
					rep, err := pl.Run(g, config.Default().PassEnv(cfg, ck))
					require.NoError(t, err)
					for _, p := range rep.Passes {
						require.Empty(t, p.Error, p.Name)
					}
					back = roundTrip(t, g)
					require.Equal(t, g.Text(), back.Text(), "%s %s/%s after passes", name, mode, lg)
					require.NoError(t, back.Verify())
				}
			}
		}
	}
}

// The environment, sites and descriptions cross the wire intact.
func TestPluginWireEnvSitesDescription(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	cfg := ck.Config()
	g, err := graph.Build(cfg, graph.Options{Mode: graph.Decode, Logits: graph.LastLogits})
	require.NoError(t, err)
	q0 := "model.language_model.layers.0.self_attn.q_proj.weight"
	e0 := "model.language_model.layers.3.mlp.experts.5.up_proj.weight"
	env := &pass.Env{Model: cfg, Weights: fakeWeights{q0: safetensors.F8E4M3, e0: safetensors.BF16, "not.in.graph": safetensors.F32},
		TP: pass.Topology{Size: 2, Rank: 1, Known: true}, LoRA: []pass.LoRATarget{{Adapter: "a", Module: "k_proj", Layers: []int{1, 2}}},
		CaptureHidden: map[int]bool{3: true, 5: true}, HostLengths: true, Program: "decode/last"}
	m, err := wire.EncodeEnv(env, g)
	require.NoError(t, err)
	require.Len(t, m.WeightDtypes, 2, "only the graph's own weights (stacked leaves expanded)")
	back, err := wire.DecodeEnv(m)
	require.NoError(t, err)
	require.Equal(t, *cfg, *back.Model)
	require.Equal(t, safetensors.F8E4M3, back.WeightDType(q0))
	require.Equal(t, safetensors.BF16, back.WeightDType(e0))
	require.Equal(t, env.TP, back.TP)
	require.Equal(t, env.LoRA, back.LoRA)
	require.Equal(t, env.CaptureHidden, back.CaptureHidden)
	require.Equal(t, env.HostLengths, back.HostLengths)
	require.Equal(t, env.Program, back.Program)
	m, err = wire.EncodeEnv(&pass.Env{}, g)
	require.NoError(t, err)
	back, err = wire.DecodeEnv(m)
	require.NoError(t, err)
	require.Nil(t, back.Weights)
	require.Nil(t, back.Model)

	sites := []pass.Site{{Where: "layer 3", Layer: 3, OK: true, Note: "n", Nodes: []*ir.Node{g.Nodes[5], g.Nodes[9]}}, pass.Skip("layer 4", 4, "because")}
	ws, err := wire.EncodeSites(g, sites)
	require.NoError(t, err)
	got, err := wire.DecodeSites(g, ws)
	require.NoError(t, err)
	require.Equal(t, sites, got)
	ws[0].Nodes = []int32{int32(len(g.Nodes))}
	_, err = wire.DecodeSites(g, ws)
	require.ErrorContains(t, err, "out of range")

	d, err := pass.DescriptionOf(fusion.Description, fusion.New())
	require.NoError(t, err)
	md, err := wire.EncodeDescription(d)
	require.NoError(t, err)
	dd, err := wire.DecodeDescription(md)
	require.NoError(t, err)
	require.Equal(t, d, dd)
}

// The host's validation of a returned graph: what a plugin may not do.
func TestPluginInstallValidation(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	cfg := ck.Config()
	fresh := func() *ir.Graph {
		g, err := graph.Build(cfg, graph.Options{Mode: graph.Decode, Logits: graph.LastLogits})
		require.NoError(t, err)
		return g
	}
	encode := func(g *ir.Graph) *pb.Graph {
		e, err := wire.EncodeGraph(g)
		require.NoError(t, err)
		return e.Graph
	}
	cases := map[string]struct {
		edit func(m *pb.Graph)
		want string
	}{
		"unknown op":        {func(m *pb.Graph) { m.Nodes[3].Op = "warp_drive" }, `unknown op "warp_drive"`},
		"use before def":    {func(m *pb.Graph) { n := len(m.Nodes); m.Nodes[0], m.Nodes[n-1] = m.Nodes[n-1], m.Nodes[0] }, "not defined before use"},
		"wrong output type": {func(m *pb.Graph) { m.Nodes[3].Outputs[0].Shape[1]++ }, "shape inference says"},
		"new input": {func(m *pb.Graph) {
			m.Inputs = append(m.Inputs, &pb.Value{Id: 99999, Name: "x", Kind: pb.Kind_KIND_INPUT, Dtype: pb.DType_DTYPE_I32})
		}, "cannot add or remove graph inputs"},
		"changed input":      {func(m *pb.Graph) { m.Inputs[0].Name = "tokens2" }, "cannot change graph inputs"},
		"output renamed":     {func(m *pb.Graph) { m.Outputs[0].Name = "logits2" }, "graph outputs changed"},
		"attrs changed":      {func(m *pb.Graph) { m.Attrs = m.Attrs[:1] }, "graph attributes changed"},
		"unknown checkpoint": {func(m *pb.Graph) { m.Weights[0].Ref = "model.language_model.layers.99.mlp.gate.weight" }, "not a tensor of the model's checkpoint"},
		"wrong weight shape": {func(m *pb.Graph) { m.Weights[1].Ref = m.Weights[0].Ref; m.Weights[1].Shape = []int64{3, 3} }, "in the checkpoint"},
		"weight without ref": {func(m *pb.Graph) { m.Weights[0].Ref = "" }, "checkpoint reference"},
		"undeclared attribute": {func(m *pb.Graph) {
			n := firstNode(m, ir.OpRMSNorm)
			n.Attrs = append(n.Attrs, &pb.Attr{Key: "epsilon", Value: &pb.AttrValue{Value: &pb.AttrValue_Float{Float: 1e-5}}})
		}, `attribute "epsilon" (1e-05) is not declared for op rmsnorm`},
		"wrong-typed attribute": {func(m *pb.Graph) {
			n := firstNode(m, ir.OpRMSNorm)
			n.Attrs[0].Value = &pb.AttrValue{Value: &pb.AttrValue_Str{Str: "1e-5"}}
		}, `attribute "eps" is string "1e-5", op rmsnorm declares it float`},
		"mode changed": {func(m *pb.Graph) {
			for _, a := range m.Attrs {
				if a.Key == ir.GraphAttrMode {
					a.Value = &pb.AttrValue{Value: &pb.AttrValue_Str{Str: "prefill"}}
				}
			}
		}, `graph attributes changed from {layers=8, logits="last", mode="decode"} to {layers=8, logits="last", mode="prefill"}`},
		"const op on non-weight": {func(m *pb.Graph) {
			for _, n := range m.Nodes {
				if n.Op == ir.OpConcatRows {
					n.Inputs[0] = m.Nodes[1].Outputs[0].Id // the embedding's activation
					return
				}
			}
		}, "must be an f32 weight"},
	}
	for name, c := range cases {
		g := fresh()
		before := g.Text()
		m := encode(g)
		c.edit(m)
		err := host.Install(g, m, ck)
		require.ErrorContains(t, err, c.want, name)
		require.Equal(t, before, g.Text(), "%s: graph must be unchanged", name)
		require.NoError(t, g.Verify())
	}
	// the identity rewrite installs
	g := fresh()
	m := encode(g)
	require.NoError(t, host.Install(g, m, ck))
	require.Equal(t, fresh().Text(), g.Text())
}

// A plugin's returned graph is untrusted bytes: whatever they are, Install
// never panics, and either installs a graph that verifies or leaves the
// engine's graph exactly as it was.
func FuzzInstall(f *testing.F) {
	ck, _ := openFixture(f, fixtures[0])
	cfg := ck.Config()
	fresh := func(t testing.TB) *ir.Graph {
		g, err := graph.Build(cfg, graph.Options{Mode: graph.Decode, Logits: graph.LastLogits})
		require.NoError(t, err)
		return g
	}
	e, err := wire.EncodeGraph(fresh(f))
	require.NoError(f, err)
	seed, err := proto.Marshal(e.Graph)
	require.NoError(f, err)
	f.Add(seed)
	e.Graph.Nodes[3].Outputs[0].Shape[1]++
	b, err := proto.Marshal(e.Graph)
	require.NoError(f, err)
	f.Add(b)
	f.Add(seed[:len(seed)/2])
	e.Graph.Nodes[3].Outputs[0].Shape[1]--
	for _, edit := range []func(n *pb.Node){ // an undeclared attribute, a wrong-typed one
		func(n *pb.Node) {
			n.Attrs = append(n.Attrs, &pb.Attr{Key: "epsilon", Value: &pb.AttrValue{Value: &pb.AttrValue_Int{Int: 1}}})
		},
		func(n *pb.Node) { n.Attrs[0].Value = &pb.AttrValue{Value: &pb.AttrValue_Bool{Bool: true}} },
	} {
		m := proto.Clone(e.Graph).(*pb.Graph)
		edit(firstNode(m, ir.OpRMSNorm))
		b, err := proto.Marshal(m)
		require.NoError(f, err)
		f.Add(b)
	}
	before := fresh(f).Text()
	f.Fuzz(func(t *testing.T, b []byte) {
		var m pb.Graph
		if proto.Unmarshal(b, &m) != nil {
			return
		}
		g := fresh(t)
		if err := host.Install(g, &m, ck); err != nil {
			require.Equal(t, before, g.Text(), "a refused graph must leave the engine's unchanged")
			return
		}
		require.NoError(t, g.Verify())
	})
}

// A plugin's Describe and Eligible answers are untrusted bytes too: decoding
// them never panics, and sites that decode refer to nodes of the graph.
func FuzzPluginAnswers(f *testing.F) {
	ck, _ := openFixture(f, fixtures[0])
	g, err := graph.Build(ck.Config(), graph.Options{Mode: graph.Decode, Logits: graph.LastLogits})
	require.NoError(f, err)
	fd, err := pass.DescriptionOf(fusion.Description, fusion.New())
	require.NoError(f, err)
	d, err := wire.EncodeDescription(fd)
	require.NoError(f, err)
	b, err := proto.Marshal(d)
	require.NoError(f, err)
	f.Add(b, []byte{})
	sites, err := wire.EncodeSites(g, []pass.Site{{Where: "layer 1", Layer: 1, Nodes: g.Nodes[2:4], OK: true}, {Where: "layer 2", Layer: 2, Reason: "no"}})
	require.NoError(f, err)
	b, err = proto.Marshal(&pb.EligibleResponse{Sites: sites})
	require.NoError(f, err)
	f.Add([]byte{}, b)
	f.Fuzz(func(t *testing.T, describe, eligible []byte) {
		var dm pb.DescribeResponse
		if proto.Unmarshal(describe, &dm) == nil {
			_, _ = wire.DecodeDescription(&dm)
		}
		var em pb.EligibleResponse
		if proto.Unmarshal(eligible, &em) == nil {
			if ss, err := wire.DecodeSites(g, em.GetSites()); err == nil {
				for _, s := range ss {
					for _, n := range s.Nodes {
						require.Contains(t, g.Nodes, n)
					}
				}
			}
		}
	})
}

// firstNode is the first node of op in an encoded graph.
func firstNode(m *pb.Graph, op string) *pb.Node {
	for _, n := range m.Nodes {
		if n.Op == op {
			return n
		}
	}
	panic("no " + op + " node")
}
