package pass

import (
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
)

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

// LoRAHit returns the first LoRA target that covers one of modules in
// layer l.
func (e *Env) LoRAHit(l int, modules ...string) (LoRATarget, bool) {
	for _, t := range e.LoRA {
		for _, m := range modules {
			if t.Hits(m, l) {
				return t, true
			}
		}
	}
	return LoRATarget{}, false
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
	// Tuner measures GEMM kernel choices on Device when its backend can
	// (nil elsewhere): prefill-autotune's measurements on a GPU.
	Tuner ir.GEMMTuner
}

// NewEnv is the environment of a single-process engine for model m with
// weights w: attention-TP size 1 (known), host lengths provided, no LoRA
// targets and no hidden-state captures.
func NewEnv(m *model.Config, w WeightInfo) *Env {
	return &Env{Model: m, Weights: w, TP: Topology{Size: 1, Known: true}, HostLengths: true, CaptureHidden: map[int]bool{}}
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
