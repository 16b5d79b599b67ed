package pass

import (
	"sort"

	"github.com/glmflash/glmflash/core/ir"
)

// Resolver supplies passes beyond the built-in registry: a plugin host
// resolves the names of the plugin passes it discovered.
type Resolver interface {
	Lookup(name string) (Registration, bool)
	// Names lists the passes the resolver knows.
	Names() []string
}

// Explainer is implemented by resolvers that can say why passes they would
// have provided are missing (plugins that could not be loaded): a pass name
// that resolves to nothing is reported with these reasons.
type Explainer interface {
	Failures() []string
}

// FallibleEligibility is implemented by passes whose eligibility check can
// fail as a whole (a plugin subprocess that crashed or timed out). The
// pipeline calls EligibleE instead of Eligible and marks the pass failed,
// with the graph unchanged, when it returns an error.
type FallibleEligibility interface {
	EligibleE(g *ir.Graph, a *Analyses, env *Env) ([]Site, error)
}

func (p *Pipeline) lookup(name string) (Registration, bool) {
	if r, ok := Lookup(name); ok {
		return r, true
	}
	if p.extra != nil {
		return p.extra.Lookup(name)
	}
	return Registration{}, false
}

// names lists built-in and resolver passes, sorted, without duplicates.
func (p *Pipeline) names() []string {
	n := Names()
	if p.extra == nil {
		return n
	}
	seen := map[string]bool{}
	for _, k := range n {
		seen[k] = true
	}
	for _, k := range p.extra.Names() {
		if !seen[k] {
			seen[k] = true
			n = append(n, k)
		}
	}
	sort.Strings(n)
	return n
}
