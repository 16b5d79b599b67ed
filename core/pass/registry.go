package pass

import (
	"fmt"
	"sort"
	"sync"
)

// Factory makes a fresh pass instance.
type Factory func() Pass

var (
	regMu    sync.RWMutex
	registry = map[string]Factory{}
)

// Register adds a pass factory under its name (built-in passes call it in
// init). The pass's name and options declaration are checked at once: a
// mismatch or a malformed options struct panics at start, not at use.
func Register(name string, f Factory) {
	p := f()
	if p.Name() != name {
		panic(fmt.Sprintf("pass: %q registered under the name %q", p.Name(), name))
	}
	if _, err := Schema(p); err != nil {
		panic(err)
	}
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
