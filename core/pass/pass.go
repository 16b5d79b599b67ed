// Package pass is the pass framework: the Pass interface every built-in and
// plugin pass implements, a registry of pass factories, the option schema
// they declare, the environment eligibility predicates see (model, weight
// dtypes, parallel topology, LoRA targets, debug captures), and a pipeline
// that runs requested passes in configuration order and reports, per pass,
// which sites fired and which were skipped and why.
package pass

import (
	"fmt"

	"github.com/glmflash/glmflash/core/ir"
)

// Site is one place a pass may fire: a layer, a boundary, a shape bucket.
type Site struct {
	// Where is a stable human label ("layer 3", "layer 2 ffn → layer 3 attn").
	Where string
	// Layer is the decoder layer (−1 when the site is not a layer).
	Layer int
	// OK says the pass may fire here; otherwise Reason says why not.
	OK     bool
	Reason string
	// Note qualifies an OK site (e.g. "partial bfg form").
	Note string
	// Nodes are the graph nodes the site covers (Apply rewrites them).
	Nodes []*ir.Node
	// Data is private to the pass that produced the site.
	Data any
}

// Skip returns a not-OK site.
func Skip(where string, layer int, format string, args ...any) Site {
	return Site{Where: where, Layer: layer, Reason: fmt.Sprintf(format, args...)}
}

// Description is everything a pass says about itself, declared once where
// the pass is registered (Register for a built-in pass, sdk.Serve for a
// plugin's): the code of a pass is its Eligible and Apply, nothing else.
// The pipeline, the report, `glmflash passes list` and the plugin protocol
// (DescribeResponse) all read it from here.
type Description struct {
	Name     string
	Version  string
	Summary  string
	Requires []string // passes that must run before this one
	// Options is the option schema. A pass with an options struct
	// (WithOptions) leaves it empty: DescriptionOf derives it.
	Options []Option
	// Verify and Draft state how the pass treats speculative decoding's
	// verify and draft graphs (GraphKind): eligible or not, and why. The
	// pipeline puts the statement in the report of every verify and draft
	// program, beside the sites. Every built-in pass states both (Register
	// checks); a plugin's pass states neither (the protocol does not carry
	// them) and is reported as stating nothing.
	Verify, Draft string
}

// Speculation is the pass's statement about graphs of kind ("" for plain
// graphs, and where the pass states nothing).
func (d Description) Speculation(kind GraphKind) string {
	switch kind {
	case VerifyGraph:
		return d.Verify
	case DraftGraph:
		return d.Draft
	}
	return ""
}

// Result is what Apply did.
type Result struct {
	Fired int         // sites rewritten
	Notes []string    // anything worth reporting
	Stats []Statistic // named counters (Counters builds them from a struct)
}

// Pass is a graph rewrite with per-site eligibility: the only code a pass
// writes. What it is (name, version, summary, requirements, speculation
// statements) is its Description; a pass with options declares them as a
// struct (WithOptions, options.go).
type Pass interface {
	// Eligible lists every candidate site, each OK or skipped with a reason.
	// It must not modify the graph.
	Eligible(g *ir.Graph, a *Analyses, env *Env) []Site
	// Apply rewrites the given (OK) sites.
	Apply(g *ir.Graph, sites []Site) (Result, error)
}

// Factory makes a fresh pass instance.
type Factory func() Pass

// Registration is a pass as the registry (or a Resolver) knows it: its
// description and a factory of instances.
type Registration struct {
	Description
	New Factory
}

// Schema is the registration's option declaration (Schema of a fresh
// instance).
func (r Registration) Schema() ([]Option, error) { return Schema(r.Description, r.New()) }

// Describe is the registration's description with its options' schema
// (DescriptionOf a fresh instance).
func (r Registration) Describe() (Description, error) { return DescriptionOf(r.Description, r.New()) }

// Instance is a configured pass of a pipeline: its description and the
// instance that runs.
type Instance struct {
	Description
	Pass Pass
}
