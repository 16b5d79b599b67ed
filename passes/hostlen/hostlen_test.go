package hostlen_test

import (
	"testing"

	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/passes/hostlen"
	"github.com/stretchr/testify/require"
)

var req = []pass.Request{{Name: hostlen.Name}}

// The rewrite of the tiny model's decode graph, as IR text.
func TestGoldenIR(t *testing.T) {
	f := passtest.TinyA(t)
	g, _, _ := passtest.Explain(t, f.Checkpoint.Config(), graph.Decode, req, nil)
	passtest.Golden(t, "testdata/tiny-a.decode.golden", g.StableText())
}

// Every node that reads the lengths (the ReadsLengths trait) is rewired;
// the executor's copy is left dead and removed.
func TestFiresAtEveryLengthsReader(t *testing.T) {
	for _, dir := range passtest.Fixtures(t) {
		cfg := passtest.OpenFixture(t, dir).Checkpoint.Config()
		before, err := graph.Build(cfg, graph.Options{Mode: graph.Decode, Logits: graph.LastLogits})
		require.NoError(t, err)
		readers := 0
		for _, n := range before.Nodes {
			if n.Def().ReadsLengths {
				readers++
			}
		}
		g, rep, _ := passtest.Explain(t, cfg, graph.Decode, req, nil)
		pr := rep.Find(hostlen.Name)
		require.Len(t, pr.Fired, readers, dir)
		require.Equal(t, []int64{int64(readers), 1}, []int64{pr.Stats[0].Value, pr.Stats[1].Value}, dir)
		for _, n := range g.Nodes {
			require.NotEqual(t, ir.OpSeqLengths, n.Op)
		}
	}
}

// Without host metadata nothing fires and the graph is unchanged.
func TestIneligibleWithoutHostLengths(t *testing.T) {
	cfg := passtest.TinyA(t).Checkpoint.Config()
	env := pass.NewEnv(cfg, nil)
	env.HostLengths = false
	g, rep, before := passtest.Explain(t, cfg, graph.Decode, req, env)
	pr := rep.Find(hostlen.Name)
	require.Empty(t, pr.Fired)
	for _, s := range pr.Skipped {
		require.Contains(t, s.Reason, "host batch metadata is absent")
	}
	require.Equal(t, before, g.Text())
}

// The conformance suite.
func TestConformance(t *testing.T) {
	passtest.Run(t, passtest.TinyA(t), passtest.Subject{Name: hostlen.Name,
		Ineligible: passtest.Ineligibility{Env: func(e *pass.Env) { e.HostLengths = false }}})
}
