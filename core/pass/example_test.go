package pass_test

import (
	"fmt"
	"testing"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/stretchr/testify/require"
)

// The worked example of what a new pass costs: a description and Eligible
// and Apply (what passes/<name>/<name>.go holds, less its package comment).
// shared-sigmoid makes a sigmoid that repeats an earlier one of the same
// value read the earlier one's output.

var sharedSigmoid = pass.Description{Name: "t-shared-sigmoid", Version: "1.0.0",
	Summary: "a sigmoid of a value already put through one reads that one's output",
	Verify:  "eligible: the rewrite does not depend on the batch",
	Draft:   "eligible: the rewrite does not depend on the batch"}

func init() { pass.Register(sharedSigmoid, func() pass.Pass { return &sharedSigmoidPass{} }) }

type sharedSigmoidPass struct{}

func (*sharedSigmoidPass) Eligible(g *ir.Graph, a *pass.Analyses, env *pass.Env) []pass.Site {
	var sites []pass.Site
	first := map[*ir.Value]*ir.Node{}
	for _, n := range g.Nodes {
		if n.Op != ir.OpSigmoid {
			continue
		}
		where := fmt.Sprintf("%s (layer %d)", n.Outputs[0].Name, n.Layer)
		if f, ok := first[n.Inputs[0]]; ok {
			sites = append(sites, pass.Site{Where: where, Layer: n.Layer, OK: true, Nodes: []*ir.Node{n}, Data: f})
		} else {
			first[n.Inputs[0]] = n
			sites = append(sites, pass.Skip(where, n.Layer, "the first sigmoid of its input"))
		}
	}
	return sites
}

func (*sharedSigmoidPass) Apply(g *ir.Graph, sites []pass.Site) (pass.Result, error) {
	for _, s := range sites {
		g.ReplaceUses(s.Nodes[0].Outputs[0], s.Data.(*ir.Node).Outputs[0])
	}
	return pass.Result{Fired: len(sites), Notes: []string{fmt.Sprintf("%d nodes removed", g.RemoveDead())}}, nil
}

func TestWorkedExamplePass(t *testing.T) {
	g := ir.New("ex")
	x := g.AddInput("x", ir.F32, ir.DimT, 4)
	a := g.Op1(ir.OpSigmoid, 0, nil, x).Named("a")
	b := g.Op1(ir.OpSigmoid, 0, nil, x).Named("b")
	g.Outputs["y"] = g.Op1(ir.OpAdd, 0, nil, a, b).Named("y")
	pl, err := pass.NewPipeline([]pass.Request{{Name: sharedSigmoid.Name}}, true)
	require.NoError(t, err)
	g.SetMode(ir.ModeVerify)
	rep, err := pl.Run(g, &pass.Env{Program: "example"})
	require.NoError(t, err)
	pr := rep.Find(sharedSigmoid.Name)
	require.Empty(t, pr.Error)
	require.Len(t, pr.Fired, 1)
	require.Equal(t, []string{"verify graph: " + sharedSigmoid.Verify, "1 nodes removed"}, pr.Notes)
	require.Equal(t, `graph ex {mode="verify"}
  input %x : f32[T,4]
  %a : f32[T,4] = sigmoid @L0(%x)
  %y : f32[T,4] = add @L0(%a, %a)
  output y = %y
`, g.StableText())
}
