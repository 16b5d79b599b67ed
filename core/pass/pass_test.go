package pass

import (
	"errors"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/stretchr/testify/require"
)

// fake is a configurable test pass.
type fake struct {
	name     string
	requires []string
	apply    func(g *ir.Graph) error
	sites    []Site
	stats    []Statistic
	opts     map[string]any
}

func (f *fake) describe() Description {
	return Description{Name: f.name, Version: "0", Summary: "a test pass", Requires: f.requires, Options: []Option{
		{Name: "n", Type: Int, Default: 1}, {Name: "mode", Type: String, Default: "a", Enum: []string{"a", "b"}}, {Name: "xs", Type: Ints, Default: []int{}}},
		Verify: "eligible on " + f.name, Draft: "not eligible"}
}
func (f *fake) Configure(o map[string]any) error { f.opts = o; return nil }
func (f *fake) Eligible(g *ir.Graph, a *Analyses, env *Env) []Site {
	return f.sites
}
func (f *fake) Apply(g *ir.Graph, sites []Site) (Result, error) {
	if f.apply != nil {
		return Result{Fired: len(sites)}, f.apply(g)
	}
	return Result{Fired: len(sites), Stats: f.stats}, nil
}

var fakes = map[string]*fake{}

func reg(f *fake) {
	fakes[f.name] = f
	if _, ok := Lookup(f.name); !ok {
		Register(f.describe(), func() Pass { return fakes[f.name] })
	}
}

func tiny() *ir.Graph {
	g := ir.New("t")
	x := g.AddInput("tokens", ir.I32, ir.DimT)
	s := g.Op1(ir.OpEmbed, -1, ir.Attrs{"streams": 1}, x, g.AddWeight("emb", 8, 4))
	m := g.Op1(ir.OpStreamMean, -1, nil, s)
	g.Outputs["logits"] = g.Op1(ir.OpLinear, -1, nil, m, g.AddWeight("head", 8, 4))
	return g
}

func TestPipelineValidatesRequests(t *testing.T) {
	reg(&fake{name: "t-a"})
	reg(&fake{name: "t-b", requires: []string{"t-a"}})
	_, err := NewPipeline([]Request{{Name: "t-nope"}}, true)
	require.ErrorContains(t, err, `unknown pass "t-nope"`)
	_, err = NewPipeline([]Request{{Name: "t-b"}, {Name: "t-a"}}, true)
	require.ErrorContains(t, err, "t-b requires t-a to run before it")
	_, err = NewPipeline([]Request{{Name: "t-a", Options: map[string]any{"m": 1}}}, true)
	require.ErrorContains(t, err, `pass t-a: unknown option "m"`)
	_, err = NewPipeline([]Request{{Name: "t-a", Options: map[string]any{"n": "x"}}}, true)
	require.ErrorContains(t, err, "option n: want int")
	_, err = NewPipeline([]Request{{Name: "t-a", Options: map[string]any{"n": 3.0}}}, true)
	require.ErrorContains(t, err, "option n: want int", "a float is never an int, not even 3.0")
	_, err = NewPipeline([]Request{{Name: "t-a", Options: map[string]any{"mode": "c"}}}, true)
	require.ErrorContains(t, err, `"c" is not one of a, b`)
	p, err := NewPipeline([]Request{{Name: "t-a", Options: map[string]any{"n": int64(3), "xs": []any{1, 2}}}, {Name: "t-b"}}, true)
	require.NoError(t, err)
	require.Len(t, p.Passes(), 2)
	require.Equal(t, 3, fakes["t-a"].opts["n"])
	require.Equal(t, []int{1, 2}, fakes["t-a"].opts["xs"])
	require.Equal(t, "a", fakes["t-a"].opts["mode"])
}

func TestFailingPassIsRolledBackAndReported(t *testing.T) {
	g := tiny()
	before := g.Text()
	reg(&fake{name: "t-break", sites: []Site{{Where: "x", OK: true}}, apply: func(g *ir.Graph) error {
		g.Nodes[1].Inputs[0] = g.Nodes[2].Outputs[0] // not verifiable
		return nil
	}})
	reg(&fake{name: "t-err", sites: []Site{{Where: "x", OK: true}}, apply: func(g *ir.Graph) error {
		g.Nodes = g.Nodes[:1]
		return errors.New("boom")
	}})
	reg(&fake{name: "t-panic", sites: []Site{{Where: "x", OK: true}}, apply: func(g *ir.Graph) error { panic("oops") }})
	reg(&fake{name: "t-ok", sites: []Site{{Where: "here", OK: true}, Skip("there", 2, "because %d", 7)},
		stats: []Statistic{{Name: "nodes_fused", Value: 4, Doc: "nodes made one"}}})
	p, err := NewPipeline([]Request{{Name: "t-break"}, {Name: "t-err"}, {Name: "t-panic"}, {Name: "t-ok"}}, true)
	require.NoError(t, err)
	rep, err := p.Run(g, &Env{Program: "test"})
	require.NoError(t, err)
	require.Equal(t, before, g.Text())
	require.Contains(t, rep.Find("t-break").Error, "does not verify")
	require.Equal(t, "boom", rep.Find("t-err").Error)
	require.Contains(t, rep.Find("t-panic").Error, "panic: oops")
	ok := rep.Find("t-ok")
	require.Len(t, ok.Fired, 1)
	require.Equal(t, "because 7", ok.Skipped[0].Reason)
	require.Equal(t, []string{"t-ok"}, rep.FiredPasses())
	s := rep.String()
	require.True(t, strings.Contains(s, "t-break failed") && strings.Contains(s, "t-ok skipped there: because 7"), s)
	require.Contains(t, s, "t-ok: nodes_fused = 4 (nodes made one)")
	require.Equal(t, []Statistic{{Name: "nodes_fused", Value: 4, Doc: "nodes made one"}}, ok.Stats)
	require.Contains(t, rep.JSON(), `"stats": [`)
	require.Contains(t, rep.JSON(), `"requested": true`)
	// passes registered but not requested are listed as such
	for _, pr := range rep.Passes {
		if pr.Name == "t-a" {
			require.False(t, pr.Requested)
		}
	}
}

// recorder is an instrumentation that logs its hooks.
type recorder struct {
	tag string
	log *[]string
}

func (r recorder) BeforePass(p *PassRun) { *r.log = append(*r.log, r.tag+" before "+p.Pass.Name) }
func (r recorder) AfterPass(p *PassRun) {
	*r.log = append(*r.log, r.tag+" after "+p.Pass.Name)
}
func (r recorder) AfterPassFailed(p *PassRun) {
	*r.log = append(*r.log, r.tag+" failed "+p.Pass.Name+": "+p.Err.Error())
}

// Instrumentations see every pass run: before hooks in the order they were
// added, after hooks (or failed hooks, on the restored graph) in reverse;
// timing, dumps and the speculation statements are instrumentations.
func TestInstrumentation(t *testing.T) {
	reg(&fake{name: "t-i-ok", sites: []Site{{Where: "here", OK: true}}})
	reg(&fake{name: "t-i-err", sites: []Site{{Where: "x", OK: true}}, apply: func(g *ir.Graph) error {
		g.Nodes = g.Nodes[:1]
		return errors.New("boom")
	}})
	p, err := NewPipeline([]Request{{Name: "t-i-ok"}, {Name: "t-i-err"}}, true)
	require.NoError(t, err)
	var log []string
	var dumped []string
	p.Instrument(recorder{"a", &log}, recorder{"b", &log}, Dumps(func(pass, when, text string) {
		dumped = append(dumped, pass+" "+when)
	}))
	g := tiny()
	g.SetMode(ir.ModeVerify)
	before := g.Text()
	rep, err := p.Run(g, &Env{Program: "test"})
	require.NoError(t, err)
	require.Equal(t, []string{
		"a before t-i-ok", "b before t-i-ok", "b after t-i-ok", "a after t-i-ok",
		"a before t-i-err", "b before t-i-err", "b failed t-i-err: boom", "a failed t-i-err: boom",
	}, log)
	require.Equal(t, []string{"t-i-ok before", "t-i-ok after", "t-i-err before"}, dumped, "no after dump of a failed pass")
	require.Equal(t, before, g.Text())
	ok, bad := rep.Find("t-i-ok"), rep.Find("t-i-err")
	require.Positive(t, ok.Duration)
	require.Positive(t, bad.Duration, "a failed pass is timed too")
	require.Equal(t, []string{"verify graph: eligible on t-i-ok"}, ok.Notes, "the statement of the description")
	require.Empty(t, bad.Notes)
}
