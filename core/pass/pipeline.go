package pass

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/glmflash/glmflash/core/ir"
)

// Request asks for one pass with its options.
type Request struct {
	Name    string
	Options map[string]any
	// Dir is the directory of the configuration file the request was
	// written in: relative Path options are relative to it ("": the
	// working directory).
	Dir string
}

// Pipeline runs configured passes in order.
type Pipeline struct {
	passes []Pass
	verify bool
	// extra resolves passes beyond the built-in registry (plugins).
	extra Resolver
	// Dump, when set, receives the graph text before and after each pass.
	Dump func(pass, when, text string)
}

// NewPipeline instantiates and configures the requested passes, in order.
// Unknown passes, bad options and unmet requirements (a required pass not
// listed earlier) are errors; nothing is silently reordered.
func NewPipeline(reqs []Request, verify bool) (*Pipeline, error) {
	return NewPipelineWith(reqs, verify, nil)
}

// NewPipelineWith is NewPipeline with names also resolved by extra (plugin
// passes); built-in passes take precedence. extra may be nil.
func NewPipelineWith(reqs []Request, verify bool, extra Resolver) (*Pipeline, error) {
	p := &Pipeline{verify: verify, extra: extra}
	seen := map[string]bool{}
	for i, r := range reqs {
		f, ok := p.lookup(r.Name)
		if !ok {
			err := fmt.Errorf("passes[%d]: unknown pass %q (known: %s)", i, r.Name, strings.Join(p.names(), ", "))
			if ex, ok := extra.(Explainer); ok {
				if f := ex.Failures(); len(f) > 0 {
					err = fmt.Errorf("%w; plugins that could not be loaded: %s", err, strings.Join(f, "; "))
				}
			}
			return nil, err
		}
		ps := f()
		for _, req := range ps.Describe().Requires {
			if !seen[req] {
				return nil, fmt.Errorf("passes[%d]: pass %s requires %s to run before it; list %s earlier", i, r.Name, req, req)
			}
		}
		if err := Configure(ps, r.Options, r.Dir); err != nil {
			return nil, fmt.Errorf("passes[%d]: pass %s: %w", i, r.Name, err)
		}
		seen[r.Name] = true
		p.passes = append(p.passes, ps)
	}
	return p, nil
}

// Add appends an already configured pass (plugins use this).
func (p *Pipeline) Add(ps Pass) { p.passes = append(p.passes, ps) }

// Passes returns the pipeline's passes in order.
func (p *Pipeline) Passes() []Pass { return p.passes }

// SiteReport is one site in a report.
type SiteReport struct {
	Where  string `json:"where"`
	Layer  int    `json:"layer"`
	Reason string `json:"reason,omitempty"`
	Note   string `json:"note,omitempty"`
}

// PassReport is one pass's outcome.
type PassReport struct {
	Name      string        `json:"name"`
	Version   string        `json:"version,omitempty"`
	Requested bool          `json:"requested"`
	Fired     []SiteReport  `json:"fired"`
	Skipped   []SiteReport  `json:"skipped"`
	Duration  time.Duration `json:"duration_ns"`
	Error     string        `json:"error,omitempty"`
	Notes     []string      `json:"notes,omitempty"`
	Stats     []Statistic   `json:"stats,omitempty"`
}

// Report is the outcome of a pipeline run over one graph.
type Report struct {
	Program string       `json:"program"`
	Passes  []PassReport `json:"passes"`
}

// Find returns the report of a pass by name.
func (r *Report) Find(name string) *PassReport {
	for i := range r.Passes {
		if r.Passes[i].Name == name {
			return &r.Passes[i]
		}
	}
	return nil
}

// FiredPasses lists passes that fired at least once.
func (r *Report) FiredPasses() []string {
	var out []string
	for _, p := range r.Passes {
		if len(p.Fired) > 0 {
			out = append(out, p.Name)
		}
	}
	return out
}

// JSON renders the report.
func (r *Report) JSON() string {
	b, _ := json.MarshalIndent(r, "", "  ")
	return string(b)
}

// String renders a table: one row per pass, then skipped sites with reasons.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pass report for %s\n", r.Program)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "pass\trequested\tfired\tskipped\ttime")
	for _, p := range r.Passes {
		req := "no"
		if p.Requested {
			req = "yes"
		}
		st := fmt.Sprintf("%d", len(p.Fired))
		if p.Error != "" {
			st = "FAILED"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", p.Name, req, st, len(p.Skipped), p.Duration.Round(time.Microsecond))
	}
	tw.Flush()
	for _, p := range r.Passes {
		if p.Error != "" {
			fmt.Fprintf(&b, "  %s failed: %s\n", p.Name, p.Error)
		}
		for _, s := range p.Fired {
			if s.Note != "" {
				fmt.Fprintf(&b, "  %s fired at %s: %s\n", p.Name, s.Where, s.Note)
			}
		}
		for _, s := range p.Skipped {
			fmt.Fprintf(&b, "  %s skipped %s: %s\n", p.Name, s.Where, s.Reason)
		}
		for _, n := range p.Notes {
			fmt.Fprintf(&b, "  %s: %s\n", p.Name, n)
		}
		for _, st := range p.Stats {
			fmt.Fprintf(&b, "  %s: %s = %d", p.Name, st.Name, st.Value)
			if st.Doc != "" {
				fmt.Fprintf(&b, " (%s)", st.Doc)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// Run applies the pipeline to g. A pass whose Apply fails, or whose output
// does not verify, is marked failed and the graph is restored to its state
// before that pass; the other passes still run. The returned error is only
// for failures of the pipeline itself.
func (p *Pipeline) Run(g *ir.Graph, env *Env) (*Report, error) {
	rep := &Report{Program: env.Program}
	requested := map[string]bool{}
	for _, ps := range p.passes {
		requested[ps.Name()] = true
		rep.Passes = append(rep.Passes, p.runOne(g, env, ps))
	}
	for _, name := range p.names() {
		if !requested[name] {
			rep.Passes = append(rep.Passes, PassReport{Name: name, Requested: false})
		}
	}
	if err := g.Verify(); err != nil {
		return rep, fmt.Errorf("pass pipeline left a graph that does not verify: %w", err)
	}
	return rep, nil
}

func (p *Pipeline) runOne(g *ir.Graph, env *Env, ps Pass) (pr PassReport) {
	start := time.Now()
	pr = PassReport{Name: ps.Name(), Version: ps.Describe().Version, Requested: true}
	defer func() { pr.Duration = time.Since(start) }()
	snap := g.Snapshot()
	fail := func(err error) PassReport {
		g.Restore(snap)
		pr.Error = err.Error()
		pr.Fired = nil
		return pr
	}
	defer func() {
		if r := recover(); r != nil {
			pr = fail(fmt.Errorf("panic: %v", r))
		}
	}()
	if p.Dump != nil {
		p.Dump(ps.Name(), "before", g.Text())
	}
	var sites []Site
	if fe, ok := ps.(FallibleEligibility); ok {
		var err error
		if sites, err = fe.EligibleE(g, NewAnalyses(g), env); err != nil {
			return fail(err)
		}
	} else {
		sites = ps.Eligible(g, NewAnalyses(g), env)
	}
	var ok []Site
	for _, s := range sites {
		if s.OK {
			ok = append(ok, s)
			pr.Fired = append(pr.Fired, SiteReport{Where: s.Where, Layer: s.Layer, Note: s.Note})
		} else {
			pr.Skipped = append(pr.Skipped, SiteReport{Where: s.Where, Layer: s.Layer, Reason: s.Reason})
		}
	}
	sort.SliceStable(pr.Skipped, func(i, j int) bool { return pr.Skipped[i].Layer < pr.Skipped[j].Layer })
	if len(ok) > 0 {
		res, err := ps.Apply(g, ok)
		if err != nil {
			return fail(err)
		}
		pr.Notes, pr.Stats = res.Notes, res.Stats
		if p.verify {
			if err := g.Verify(); err != nil {
				return fail(fmt.Errorf("output does not verify: %w", err))
			}
		}
	}
	if kind := KindOf(g); kind != PlainGraph {
		note := "states nothing about " + string(kind) + " graphs"
		if sa, ok := ps.(SpecAware); ok {
			note = sa.Speculation(kind)
		}
		pr.Notes = append([]string{string(kind) + " graph: " + note}, pr.Notes...)
	}
	if p.Dump != nil {
		p.Dump(ps.Name(), "after", g.Text())
	}
	return pr
}
