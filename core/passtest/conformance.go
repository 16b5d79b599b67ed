package passtest

import (
	"fmt"
	"maps"
	"math"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/eval"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model"
)

// Tolerance is the parity bound on max |Δlogit|.
const Tolerance = 1e-4

// Subject is one pass under test.
type Subject struct {
	// Name is the pass's name.
	Name string
	// Resolver resolves Name when it is not a built-in pass (a plugin host).
	Resolver pass.Resolver
	// Options are the pass's options for the "on" runs.
	Options map[string]any
	// Ineligible makes every site of the pass ineligible.
	Ineligible Ineligibility
}

// Ineligibility describes inputs under which a pass must not fire anywhere.
// Each part is optional; they apply together.
type Ineligibility struct {
	// Env edits the eligibility environment (e.g. TP metadata missing, a
	// LoRA target on every module the pass fuses, host lengths absent).
	Env func(*pass.Env)
	// Options are merged over Subject.Options.
	Options map[string]any
	// Model edits a copy of the model configuration the graph is built from.
	Model func(*model.Config)
}

// graphs are the programs the suite builds: every batch mode.
var graphs = []graph.Options{
	{Mode: graph.Prefill, Logits: graph.AllLogits},
	{Mode: graph.Prefill, Logits: graph.LastLogits},
	{Mode: graph.Decode, Logits: graph.LastLogits},
	{Mode: graph.Extend, Logits: graph.AllLogits},
	{Mode: graph.Mixed, Logits: graph.LastLogits},
}

func (s Subject) pipeline(t testing.TB, opts map[string]any) *pass.Pipeline {
	t.Helper()
	pl, err := pass.NewPipelineWith([]pass.Request{{Name: s.Name, Options: maps.Clone(opts)}}, false, s.Resolver)
	if err != nil {
		t.Fatalf("%s: %v", s.Name, err)
	}
	return pl
}

func env(f *Fixture, cfg *model.Config, program string) *pass.Env {
	e := pass.NewEnv(cfg, f.Checkpoint)
	e.Program = program
	return e
}

func buildGraph(t testing.TB, cfg *model.Config, o graph.Options) *ir.Graph {
	t.Helper()
	g, err := graph.Build(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func program(o graph.Options) string { return o.Mode.String() + "/" + string(o.Logits) }

// Run runs the conformance suite on s over fixture f: the suite every pass must pass, built-in or plugin (a
// plugin is tested through its real subprocess by giving the suite a plugin
// host as the Resolver):
//
//   - eligibility is pure: Eligible does not change the graph, every site has
//     a label (distinct among OK sites) and every skipped site a reason;
//   - determinism: the pass applied to two freshly built copies of a graph
//     (by two fresh pass instances) gives identical IR text, in every batch
//     mode;
//   - verifier-clean: the rewritten graph verifies and the pass reports no
//     error;
//   - no change when ineligible: under the subject's Ineligible settings no
//     site is OK, Apply is not called and the graph is unchanged;
//   - parity: on a transformers fixture, every case's logits within 1e-4 of
//     the pass-off engine with identical greedy tokens, and the pass fired,
//     at each of TPSizes (tensor-parallel ranks seeing their real topology).
func Run(t *testing.T, f *Fixture, s Subject) {
	t.Helper()
	cfg := f.Checkpoint.Config()
	t.Run("eligibility-is-pure", func(t *testing.T) {
		for _, o := range graphs {
			g := buildGraph(t, cfg, o)
			before := g.Text()
			ps := s.pipeline(t, s.Options).Passes()[0].Pass
			var sites []pass.Site
			if fe, ok := ps.(pass.FallibleEligibility); ok {
				var err error
				if sites, err = fe.EligibleE(g, pass.NewAnalyses(g), env(f, cfg, program(o))); err != nil {
					t.Fatalf("%s: Eligible failed: %v", program(o), err)
				}
			} else {
				sites = ps.Eligible(g, pass.NewAnalyses(g), env(f, cfg, program(o)))
			}
			if g.Text() != before {
				t.Fatalf("%s: Eligible changed the graph", program(o))
			}
			ok := map[string]bool{}
			for _, st := range sites {
				if key := fmt.Sprintf("%s/%d", st.Where, st.Layer); st.OK && ok[key] {
					t.Errorf("%s: two OK sites are labelled %s (layer %d)", program(o), st.Where, st.Layer)
				} else if st.OK {
					ok[key] = true
				}
				if st.Where == "" {
					t.Errorf("%s: a site has no label", program(o))
				}
				if !st.OK && st.Reason == "" {
					t.Errorf("%s: site %s is skipped without a reason", program(o), st.Where)
				}
			}
		}
	})
	t.Run("deterministic-and-verifier-clean", func(t *testing.T) {
		for _, o := range graphs {
			var texts [2]string
			for i := range texts {
				g := buildGraph(t, cfg, o)
				rep, err := s.pipeline(t, s.Options).Run(g, env(f, cfg, program(o)))
				if err != nil {
					t.Fatalf("%s: %v", program(o), err)
				}
				if pr := rep.Find(s.Name); pr == nil || pr.Error != "" {
					t.Fatalf("%s: pass failed: %+v", program(o), pr)
				}
				if err := g.Verify(); err != nil {
					t.Fatalf("%s: the rewritten graph does not verify: %v", program(o), err)
				}
				texts[i] = g.Text()
			}
			if texts[0] != texts[1] {
				t.Fatalf("%s: two applications to fresh copies differ", program(o))
			}
		}
	})
	t.Run("ineligible-leaves-graph-unchanged", func(t *testing.T) {
		in := s.Ineligible
		c := cfg.Clone()
		if in.Model != nil {
			in.Model(c)
		}
		opts := maps.Clone(s.Options)
		if opts == nil {
			opts = map[string]any{}
		}
		maps.Copy(opts, in.Options)
		for _, o := range graphs {
			g := buildGraph(t, c, o)
			before := g.Text()
			e := env(f, c, program(o))
			if in.Env != nil {
				in.Env(e)
			}
			rep, err := s.pipeline(t, opts).Run(g, e)
			if err != nil {
				t.Fatalf("%s: %v", program(o), err)
			}
			pr := rep.Find(s.Name)
			if pr == nil || pr.Error != "" || len(pr.Fired) > 0 {
				t.Fatalf("%s: under the ineligible settings the pass must not fire: %+v", program(o), pr)
			}
			if len(pr.Skipped) == 0 {
				t.Fatalf("%s: no skipped site reported (every candidate must be reported with its reason)", program(o))
			}
			if g.Text() != before {
				t.Fatalf("%s: graph changed although no site was eligible", program(o))
			}
		}
	})
	t.Run("parity", func(t *testing.T) {
		base := RunCases(t, f, nil)
		for _, tp := range TPSizes {
			if err := graph.CheckTP(cfg, tp); err != nil {
				t.Logf("TP %d skipped: %v", tp, err)
				continue
			}
			pl := s.pipeline(t, s.Options)
			e, err := engine.New(cfg, f.Checkpoint, engine.Options{Slots: 2, Passes: pl, PassEnv: env(f, cfg, ""), TP: tp})
			if err != nil {
				t.Fatal(err)
			}
			got := RunCases(t, f, e)
			worst, err := Compare(base, got, cfg.VocabSize)
			if err != nil {
				t.Fatalf("TP %d: %v", tp, err)
			}
			fired := false
			for key, rep := range e.Reports() {
				pr := rep.Find(s.Name)
				if pr == nil || pr.Error != "" {
					t.Fatalf("TP %d %s: pass failed: %+v", tp, key, pr)
				}
				fired = fired || len(pr.Fired) > 0
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			if !fired {
				t.Fatalf("TP %d: the pass fired nowhere on the fixture: parity proves nothing", tp)
			}
			t.Logf("%s at TP %d: max|Δlogit| vs the pass-off TP 1 engine %.1e over %d runs", s.Name, tp, worst, len(base))
		}
	})
}

// TPSizes are the tensor-parallel sizes the parity part of the suite runs
// the pass at (the ranks as goroutines on the cpu backend), each against
// the pass-off engine on one device; a size the fixture's model cannot be
// split over is skipped, saying why.
var TPSizes = []int{1, 2, 4}

// RunCases runs every case of the fixture on e (a pass-off engine when nil)
// and returns each run's logits: prefill rows, decode steps fed with the
// reference's greedy tokens, extend rows.
func RunCases(t testing.TB, f *Fixture, e *engine.Engine) [][]float32 {
	t.Helper()
	if e == nil {
		var err error
		if e, err = engine.New(f.Checkpoint.Config(), f.Checkpoint, engine.Options{Slots: 2}); err != nil {
			t.Fatal(err)
		}
	}
	var out [][]float32
	for _, c := range f.Reference.Cases {
		slot, err := e.Store().Alloc()
		if err != nil {
			t.Fatal(err)
		}
		run := func(key engine.Key, toks []int32) {
			r, err := e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: toks}}})
			if err != nil {
				t.Fatalf("case %s: %v", c.Name, err)
			}
			out = append(out, r.Logits)
		}
		switch c.Kind {
		case "prefill":
			run(engine.Key{Mode: graph.Prefill, Logits: graph.AllLogits}, c.Tokens)
		case "decode":
			run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, c.Tokens)
			for _, tok := range c.Greedy {
				run(engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}, []int32{tok})
			}
		case "extend":
			run(engine.Key{Mode: graph.Prefill, Logits: graph.AllLogits}, c.Tokens[:c.Split])
			run(engine.Key{Mode: graph.Extend, Logits: graph.AllLogits}, c.Tokens[c.Split:])
		}
		if err := e.Store().Free(slot); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// Compare checks got against base: every value within Tolerance and every
// row's argmax identical. It returns the largest |Δ|.
func Compare(base, got [][]float32, vocab int) (float64, error) {
	if len(got) != len(base) {
		return 0, fmt.Errorf("%d runs, want %d", len(got), len(base))
	}
	worst := 0.0
	for i := range base {
		if len(got[i]) != len(base[i]) {
			return 0, fmt.Errorf("run %d: %d logits, want %d", i, len(got[i]), len(base[i]))
		}
		for j := range base[i] {
			worst = math.Max(worst, math.Abs(float64(got[i][j]-base[i][j])))
		}
		for r := 0; r < len(base[i])/vocab; r++ {
			if eval.Argmax(base[i][r*vocab:(r+1)*vocab]) != eval.Argmax(got[i][r*vocab:(r+1)*vocab]) {
				return worst, fmt.Errorf("run %d row %d: greedy token changed", i, r)
			}
		}
	}
	if worst > Tolerance {
		return worst, fmt.Errorf("max |Δlogit| %.2e exceeds %g", worst, Tolerance)
	}
	return worst, nil
}

// InProcess resolves one pass, described by d and made by f, by its name: a
// plugin author runs the suite on the pass in process (without building the
// binary) with Subject{Name: d.Name, Resolver: passtest.InProcess(d, f)}.
func InProcess(d pass.Description, f pass.Factory) pass.Resolver {
	return inProcess{pass.Registration{Description: d, New: f}}
}

type inProcess struct{ r pass.Registration }

func (r inProcess) Lookup(name string) (pass.Registration, bool) {
	if name == r.r.Name {
		return r.r, true
	}
	return pass.Registration{}, false
}

func (r inProcess) Names() []string { return []string{r.r.Name} }
