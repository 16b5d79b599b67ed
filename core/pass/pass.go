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

// Description is what a pass says about itself.
type Description struct {
	Name     string
	Version  string
	Summary  string
	Requires []string // passes that must run before this one
	// Options is the option schema. A pass with an options struct
	// (WithOptions) leaves it empty: DescriptionOf derives it.
	Options []Option
}

// Result is what Apply did.
type Result struct {
	Fired int         // sites rewritten
	Notes []string    // anything worth reporting
	Stats []Statistic // named counters (Counters builds them from a struct)
}

// Pass is a graph rewrite with per-site eligibility. A pass with options
// declares them as a struct (WithOptions, options.go).
type Pass interface {
	Name() string
	Describe() Description
	// Eligible lists every candidate site, each OK or skipped with a reason.
	// It must not modify the graph.
	Eligible(g *ir.Graph, a *Analyses, env *Env) []Site
	// Apply rewrites the given (OK) sites.
	Apply(g *ir.Graph, sites []Site) (Result, error)
}
