// Package pass is the pass framework: the Pass interface every built-in and
// plugin pass implements, a registry of pass factories, the option schema
// they declare, the environment eligibility predicates see (model, weight
// dtypes, parallel topology, LoRA targets, debug captures), and a pipeline
// that runs requested passes in configuration order and reports, per pass,
// which sites fired and which were skipped and why.
package pass

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
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

// OptionType is the type of a pass option.
type OptionType string

// Option types.
const (
	Bool   OptionType = "bool"
	Int    OptionType = "int"
	Float  OptionType = "float"
	String OptionType = "string"
	Ints   OptionType = "[]int"
)

// Option declares one option of a pass.
type Option struct {
	Name    string
	Type    OptionType
	Default any
	Doc     string
	// Enum, for string options, lists the allowed values.
	Enum []string
}

// Description is what a pass says about itself.
type Description struct {
	Name     string
	Version  string
	Summary  string
	Requires []string // passes that must run before this one
	Options  []Option
}

// Result is what Apply did.
type Result struct {
	Fired int      // sites rewritten
	Notes []string // anything worth reporting
}

// Pass is a graph rewrite with per-site eligibility.
type Pass interface {
	Name() string
	Describe() Description
	// Configure receives the options, already defaulted and type-checked
	// against Describe().Options.
	Configure(opts map[string]any) error
	// Eligible lists every candidate site, each OK or skipped with a reason.
	// It must not modify the graph.
	Eligible(g *ir.Graph, a *Analyses, env *Env) []Site
	// Apply rewrites the given (OK) sites.
	Apply(g *ir.Graph, sites []Site) (Result, error)
}

// WeightInfo tells a predicate how a checkpoint tensor is stored.
type WeightInfo interface {
	DType(name string) (safetensors.DType, bool)
}

// Topology is the attention tensor-parallel layout predicates check.
type Topology struct {
	Size, Rank int
	Known      bool // false: rank/size metadata missing
}

// LoRATarget is one adapter's target module, optionally restricted to layers.
type LoRATarget struct {
	Adapter string
	Module  string // e.g. "k_proj"
	Layers  []int  // empty: all
}

// Hits reports whether the target covers module name in layer l.
func (t LoRATarget) Hits(module string, l int) bool {
	if t.Module != module {
		return false
	}
	if len(t.Layers) == 0 {
		return true
	}
	for _, x := range t.Layers {
		if x == l {
			return true
		}
	}
	return false
}

// Env is what eligibility predicates may consult besides the graph.
type Env struct {
	Model   *model.Config
	Weights WeightInfo // nil: every weight counts as unquantized
	TP      Topology
	LoRA    []LoRATarget
	// CaptureHidden lists layers whose residual must be observable after the
	// layer.
	CaptureHidden map[int]bool
	// HostLengths says the scheduler provides host-side batch lengths.
	HostLengths bool
	// Program names the program being built ("prefill/last", ...).
	Program string
	// Device is the backend the program will run on ("cpu", "cuda"), for
	// passes whose eligibility or choices depend on it.
	Device string
}

// WeightDType returns a weight's storage dtype (BF16 when unknown).
func (e *Env) WeightDType(name string) safetensors.DType {
	if e.Weights != nil {
		if dt, ok := e.Weights.DType(name); ok {
			return dt
		}
	}
	return safetensors.BF16
}

// Analyses caches facts about a graph that several passes need.
type Analyses struct {
	g     *ir.Graph
	users map[*ir.Value][]*ir.Node
}

// NewAnalyses indexes g.
func NewAnalyses(g *ir.Graph) *Analyses {
	a := &Analyses{g: g, users: map[*ir.Value][]*ir.Node{}}
	for _, n := range g.Nodes {
		for _, in := range n.Inputs {
			a.users[in] = append(a.users[in], n)
		}
	}
	return a
}

// Users returns the nodes reading v.
func (a *Analyses) Users(v *ir.Value) []*ir.Node { return a.users[v] }

// IsOutput reports whether v is a graph output.
func (a *Analyses) IsOutput(v *ir.Value) bool {
	for _, o := range a.g.Outputs {
		if o == v {
			return true
		}
	}
	return false
}

// Factory makes a fresh pass instance.
type Factory func() Pass

var (
	regMu    sync.RWMutex
	registry = map[string]Factory{}
)

// Register adds a pass factory under its name.
func Register(name string, f Factory) {
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := registry[name]; dup {
		panic(fmt.Sprintf("pass: %q registered twice", name))
	}
	registry[name] = f
}

// Lookup finds a registered pass factory.
func Lookup(name string) (Factory, bool) {
	regMu.RLock()
	defer regMu.RUnlock()
	f, ok := registry[name]
	return f, ok
}

// Names lists registered passes, sorted.
func Names() []string {
	regMu.RLock()
	defer regMu.RUnlock()
	var n []string
	for k := range registry {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// NormalizeOptions checks opts against the declared options: unknown names
// and wrong types are errors naming the pass and the option; missing ones
// get their defaults.
func NormalizeOptions(d Description, opts map[string]any) (map[string]any, error) {
	out := map[string]any{}
	known := map[string]Option{}
	for _, o := range d.Options {
		known[o.Name] = o
		out[o.Name] = o.Default
	}
	var names []string
	for k := range opts {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		o, ok := known[k]
		if !ok {
			var valid []string
			for _, x := range d.Options {
				valid = append(valid, x.Name)
			}
			return nil, fmt.Errorf("pass %s: unknown option %q (options: %s)", d.Name, k, strings.Join(valid, ", "))
		}
		v, err := coerce(o, opts[k])
		if err != nil {
			return nil, fmt.Errorf("pass %s: option %s: %w", d.Name, k, err)
		}
		out[k] = v
	}
	return out, nil
}

func coerce(o Option, v any) (any, error) {
	switch o.Type {
	case Bool:
		if b, ok := v.(bool); ok {
			return b, nil
		}
	case Int:
		switch x := v.(type) {
		case int:
			return x, nil
		case int64:
			return int(x), nil
		case float64:
			if x == float64(int(x)) {
				return int(x), nil
			}
		}
	case Float:
		switch x := v.(type) {
		case float64:
			return x, nil
		case int:
			return float64(x), nil
		case int64:
			return float64(x), nil
		}
	case String:
		if s, ok := v.(string); ok {
			if len(o.Enum) > 0 {
				for _, e := range o.Enum {
					if e == s {
						return s, nil
					}
				}
				return nil, fmt.Errorf("%q is not one of %s", s, strings.Join(o.Enum, ", "))
			}
			return s, nil
		}
	case Ints:
		switch x := v.(type) {
		case []int:
			return x, nil
		case []any:
			out := make([]int, len(x))
			for i, e := range x {
				n, err := coerce(Option{Type: Int}, e)
				if err != nil {
					return nil, fmt.Errorf("element %d: %w", i, err)
				}
				out[i] = n.(int)
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("want %s, got %T (%v)", o.Type, v, v)
}
