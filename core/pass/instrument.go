package pass

import (
	"sync"
	"time"

	"github.com/glmflash/glmflash/core/ir"
)

// PassRun is one pass's run over one graph, as instrumentations see it.
type PassRun struct {
	// Pass is the description of the pass that runs.
	Pass Description
	// Graph is the graph: as the pass finds it (BeforePass), as it left
	// it (AfterPass), restored to its state before the pass
	// (AfterPassFailed).
	Graph *ir.Graph
	Env   *Env
	// Report is the pass's report, complete but for what instrumentations
	// add (AfterPass hooks may add to it: the duration, notes).
	Report *PassReport
	// Err is why the pass failed (AfterPassFailed only).
	Err error
}

// Instrumentation observes every pass run of a pipeline (MLIR's
// PassInstrumentation): BeforePass runs before the pass's Eligible, then
// either AfterPass (the pass did not fail, whether it fired or not) or
// AfterPassFailed (Eligible or Apply failed or panicked, or the output did
// not verify; the graph is already restored). Before hooks run in the
// order the instrumentations were added, after hooks in the reverse order,
// so that an instrumentation added first (timing) encloses the later ones.
// A pipeline's runs may be concurrent (one per program): an instrumentation
// keeps per-run state by its PassRun.
type Instrumentation interface {
	BeforePass(r *PassRun)
	AfterPass(r *PassRun)
	AfterPassFailed(r *PassRun)
}

// Instrument adds instrumentations after the pipeline's own (Timing, then
// SpecStatements).
func (p *Pipeline) Instrument(in ...Instrumentation) { p.instr = append(p.instr, in...) }

// Timing sets each pass report's Duration: from before the pass to after
// it, failed or not. Every pipeline has it first.
func Timing() Instrumentation { return &timing{} }

type timing struct{ start sync.Map } // *PassRun → time.Time

func (t *timing) BeforePass(r *PassRun) { t.start.Store(r, time.Now()) }
func (t *timing) AfterPass(r *PassRun)  { t.stop(r) }
func (t *timing) AfterPassFailed(r *PassRun) {
	t.stop(r)
}

func (t *timing) stop(r *PassRun) {
	if s, ok := t.start.LoadAndDelete(r); ok {
		r.Report.Duration = time.Since(s.(time.Time))
	}
}

// SpecStatements puts the pass's statement about the graph's kind
// (Description.Speculation) first in the notes of every verify and draft
// program's report: "verify graph: <statement>", or that the pass states
// nothing. Every pipeline has it, after Timing.
func SpecStatements() Instrumentation { return specStatements{} }

type specStatements struct{}

func (specStatements) BeforePass(*PassRun)      {}
func (specStatements) AfterPassFailed(*PassRun) {}
func (specStatements) AfterPass(r *PassRun) {
	kind := KindOf(r.Graph)
	if kind == PlainGraph {
		return
	}
	note := r.Pass.Speculation(kind)
	if note == "" {
		note = "states nothing about " + string(kind) + " graphs"
	}
	r.Report.Notes = append([]string{string(kind) + " graph: " + note}, r.Report.Notes...)
}

// Dumps hands the graph text (ir.Graph.Text) to dump before and after each
// pass that does not fail: dump(pass, "before" or "after", text).
func Dumps(dump func(pass, when, text string)) Instrumentation { return dumps(dump) }

type dumps func(pass, when, text string)

func (d dumps) BeforePass(r *PassRun)  { d(r.Pass.Name, "before", r.Graph.Text()) }
func (d dumps) AfterPass(r *PassRun)   { d(r.Pass.Name, "after", r.Graph.Text()) }
func (dumps) AfterPassFailed(*PassRun) {}
