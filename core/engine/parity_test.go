package engine_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model"

	_ "github.com/glmflash/glmflash/passes/all" // the built-in passes, which are not gated
)

// lmHeadFromEmbedding is a valid but wrong rewrite: the LM head reads the
// embedding table (same shape) instead of its own weight.
type lmHeadFromEmbedding struct{}

func (lmHeadFromEmbedding) Eligible(*ir.Graph, *pass.Analyses, *pass.Env) []pass.Site {
	return []pass.Site{{Where: "graph", Layer: -1, OK: true}}
}

func (lmHeadFromEmbedding) Apply(g *ir.Graph, _ []pass.Site) (pass.Result, error) {
	var head, emb *ir.Value
	for _, n := range g.Nodes {
		for _, v := range n.Inputs {
			switch v.Ref {
			case "lm_head.weight":
				head = v
			case "model.language_model.embed_tokens.weight":
				emb = v
			}
		}
	}
	if head == nil || emb == nil {
		return pass.Result{}, nil
	}
	g.ReplaceUses(head, emb)
	return pass.Result{Fired: 1}, nil
}

// identity fires and changes nothing.
type identity struct{}

func (identity) Eligible(*ir.Graph, *pass.Analyses, *pass.Env) []pass.Site {
	return []pass.Site{{Where: "graph", Layer: -1, OK: true}}
}
func (identity) Apply(*ir.Graph, []pass.Site) (pass.Result, error) { return pass.Result{Fired: 1}, nil }

func parityEngine(t *testing.T, p pass.Pass, parity *engine.Parity) *engine.Engine {
	return parityEngineCtx(t, p, parity, 0)
}

func parityEngineCtx(t *testing.T, p pass.Pass, parity *engine.Parity, maxPos int) *engine.Engine {
	t.Helper()
	ck, err := model.Open(filepath.Join("..", "..", "testdata", "glm5next-tiny-a", "checkpoint"))
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	pl, err := pass.NewPipeline(nil, true)
	require.NoError(t, err)
	pl.Add(pass.Description{Name: "plugin-x", Version: "0.0.1"}, p)
	e, err := engine.New(ck.Config(), ck, engine.Options{Slots: 2, Passes: pl, Parity: parity, MaxPositions: maxPos})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	return e
}

// A pass whose graph is valid but computes other logits is refused at
// load, in every batch mode, with the logit, both values and the opt-out;
// without the gate (the operator opted out) the program is served.
func TestParityGateRefusesAWrongPass(t *testing.T) {
	gate := &engine.Parity{Passes: []string{"plugin-x"}, OptOut: "set plugins.allow_parity_mismatch: true"}
	for _, mode := range []graph.Mode{graph.Mixed, graph.Prefill, graph.Decode, graph.Extend} {
		key := engine.Key{Mode: mode, Logits: graph.AllLogits}
		e := parityEngine(t, lmHeadFromEmbedding{}, gate)
		_, err := e.Program(key)
		require.Error(t, err, mode)
		assert.ErrorContains(t, err, "program "+key.String()+": pass plugin-x fails the parity probe against the graph without it")
		assert.ErrorContains(t, err, "without the passes (|Δ|")
		assert.ErrorContains(t, err, "set plugins.allow_parity_mismatch: true to serve it anyway")
		_, err = parityEngine(t, lmHeadFromEmbedding{}, nil).Program(key)
		require.NoError(t, err, "opted out")
	}
}

// The probe fits a short context limit (a study sizes it for its longest
// request), down to 2 positions, in every mode.
func TestParityProbeFitsTheContext(t *testing.T) {
	gate := &engine.Parity{Passes: []string{"plugin-x"}}
	for _, L := range []int{2, 3, 6} {
		for _, mode := range []graph.Mode{graph.Mixed, graph.Prefill, graph.Decode, graph.Extend} {
			key := engine.Key{Mode: mode, Logits: graph.AllLogits}
			_, err := parityEngineCtx(t, identity{}, gate, L).Program(key)
			require.NoError(t, err, "%s, context %d", mode, L)
			_, err = parityEngineCtx(t, lmHeadFromEmbedding{}, gate, L).Program(key)
			require.ErrorContains(t, err, "fails the parity probe", "%s, context %d", mode, L)
		}
	}
}

// A pass that keeps the logits passes the gate; one that is not checked
// (a built-in pass) is not probed.
func TestParityGateKeepsACorrectPass(t *testing.T) {
	key := engine.Key{Mode: graph.Mixed, Logits: graph.LastLogits}
	_, err := parityEngine(t, identity{}, &engine.Parity{Passes: []string{"plugin-x"}}).Program(key)
	require.NoError(t, err)
	_, err = parityEngine(t, lmHeadFromEmbedding{}, &engine.Parity{Passes: []string{"another"}}).Program(key)
	require.NoError(t, err)
}

// FromConfig gates the configuration's passes that are not built-in (the
// plugin passes), unless plugins.allow_parity_mismatch.
func TestFromConfigGatesPluginPasses(t *testing.T) {
	pl, err := pass.NewPipeline(nil, true)
	require.NoError(t, err)
	for y, want := range map[string][]string{
		"passes: [{name: plugin-x}, {name: host-length-reuse}]\n":              {"plugin-x"},
		"passes: [{name: plugin-x}]\nplugins: {allow_parity_mismatch: true}\n": nil,
		"passes: [{name: host-length-reuse}]\n":                                nil,
		"passes: [{name: plugin-x}]\nplugins: {parity_tolerance: 0.5}\n":       {"plugin-x"},
	} {
		ec, err := config.Parse([]byte(y), "t.yaml")
		require.NoError(t, err, y)
		o := engine.FromConfig(ec, engine.Setup{Pipeline: pl})
		if want == nil {
			assert.Nil(t, o.Parity, y)
			continue
		}
		require.NotNil(t, o.Parity, y)
		assert.Equal(t, want, o.Parity.Passes, y)
		assert.Equal(t, ec.Plugins.ParityTolerance, o.Parity.Tolerance, y)
	}
}
