package ir

import (
	"fmt"
	"sort"
	"sync"
)

// OutType is what shape inference says about one output.
type OutType struct {
	Name  string
	DType DType
	Shape []int
}

// OpDef registers an op: its arity, shape inference and properties.
type OpDef struct {
	Name string
	Doc  string
	// MinInputs/MaxInputs bound the number of inputs (MaxInputs < 0: any).
	MinInputs, MaxInputs int
	// Infer checks the inputs and attributes and returns the outputs' types.
	Infer func(n *Node) ([]OutType, error)
	// Const ops compute derived weights from weights; the executor folds
	// them once at load time.
	Const bool
	// SideEffects ops update sequence state (caches) and are never removed
	// as dead code.
	SideEffects bool
}

var (
	regMu sync.RWMutex
	ops   = map[string]OpDef{}
)

// Register adds an op definition; registering a name twice is an error.
func Register(d OpDef) error {
	regMu.Lock()
	defer regMu.Unlock()
	if d.Name == "" || d.Infer == nil {
		return fmt.Errorf("ir: op definition needs a name and Infer")
	}
	if _, dup := ops[d.Name]; dup {
		return fmt.Errorf("ir: op %q registered twice", d.Name)
	}
	ops[d.Name] = d
	return nil
}

// MustRegister is Register that panics (for package init).
func MustRegister(d OpDef) {
	if err := Register(d); err != nil {
		panic(err)
	}
}

// Lookup finds an op definition.
func Lookup(name string) (OpDef, bool) {
	regMu.RLock()
	defer regMu.RUnlock()
	d, ok := ops[name]
	return d, ok
}

// OpNames lists the registered ops, sorted.
func OpNames() []string {
	regMu.RLock()
	defer regMu.RUnlock()
	n := make([]string, 0, len(ops))
	for k := range ops {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}
