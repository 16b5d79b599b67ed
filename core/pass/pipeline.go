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

// Pipeline runs configured passes in order, each observed by the
// pipeline's instrumentations (instrument.go).
type Pipeline struct {
	passes []Instance
	verify bool
	// extra resolves passes beyond the built-in registry (plugins).
	extra Resolver
	instr []Instrumentation
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
	p := &Pipeline{verify: verify, extra: extra, instr: []Instrumentation{Timing(), SpecStatements()}}
	seen := map[string]bool{}
	for i, r := range reqs {
		reg, ok := p.lookup(r.Name)
		if !ok {
			err := fmt.Errorf("passes[%d]: unknown pass %q (known: %s)", i, r.Name, strings.Join(p.names(), ", "))
			if ex, ok := extra.(Explainer); ok {
				if f := ex.Failures(); len(f) > 0 {
					err = fmt.Errorf("%w; plugins that could not be loaded: %s", err, strings.Join(f, "; "))
				}
			}
			return nil, err
		}
		ps := reg.New()
		for _, req := range reg.Requires {
			if !seen[req] {
				return nil, fmt.Errorf("passes[%d]: pass %s requires %s to run before it; list %s earlier", i, r.Name, req, req)
			}
		}
		if err := Configure(reg.Description, ps, r.Options, r.Dir); err != nil {
			return nil, fmt.Errorf("passes[%d]: pass %s: %w", i, r.Name, err)
		}
		seen[r.Name] = true
		p.passes = append(p.passes, Instance{Description: reg.Description, Pass: ps})
	}
	return p, nil
}

// Add appends an already configured pass.
func (p *Pipeline) Add(d Description, ps Pass) {
	p.passes = append(p.passes, Instance{Description: d, Pass: ps})
}

// Passes returns the pipeline's passes in order.
func (p *Pipeline) Passes() []Instance { return p.passes }

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
	for _, in := range p.passes {
		requested[in.Name] = true
		rep.Passes = append(rep.Passes, p.runOne(g, env, in))
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

// runOne runs one pass between its instrumentations' hooks.
func (p *Pipeline) runOne(g *ir.Graph, env *Env, in Instance) PassReport {
	r := &PassRun{Pass: in.Description, Graph: g, Env: env,
		Report: &PassReport{Name: in.Name, Version: in.Version, Requested: true}}
	for _, i := range p.instr {
		i.BeforePass(r)
	}
	snap := g.Snapshot()
	if r.Err = p.apply(g, env, in.Pass, r.Report); r.Err != nil {
		g.Restore(snap)
		r.Report.Error = r.Err.Error()
		r.Report.Fired = nil
		for i := len(p.instr) - 1; i >= 0; i-- {
			p.instr[i].AfterPassFailed(r)
		}
	} else {
		for i := len(p.instr) - 1; i >= 0; i-- {
			p.instr[i].AfterPass(r)
		}
	}
	return *r.Report
}

// apply runs ps's Eligible and (on the OK sites) Apply, recording the
// sites, notes and statistics in pr; a panic is an error.
func (p *Pipeline) apply(g *ir.Graph, env *Env, ps Pass, pr *PassReport) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	var sites []Site
	if fe, ok := ps.(FallibleEligibility); ok {
		if sites, err = fe.EligibleE(g, NewAnalyses(g), env); err != nil {
			return err
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
	if len(ok) == 0 {
		return nil
	}
	res, err := ps.Apply(g, ok)
	if err != nil {
		return err
	}
	pr.Notes, pr.Stats = res.Notes, res.Stats
	if p.verify {
		if err := g.Verify(); err != nil {
			return fmt.Errorf("output does not verify: %w", err)
		}
	}
	return nil
}
