package pass

import (
	"fmt"
	"sort"
	"sync"
)

var (
	regMu    sync.RWMutex
	registry = map[string]Registration{}
)

// Register adds a built-in pass (built-in passes call it in init) under its
// description, which is checked at once: a missing or malformed name
// (CheckName), version, summary or speculation statement (Verify, Draft), or a malformed options struct,
// panics at start, not at use.
func Register(d Description, f Factory) {
	switch {
	case d.Name == "":
		panic("pass: registered without a name")
	case CheckName(d.Name) != nil:
		panic("pass: " + CheckName(d.Name).Error())
	case d.Version == "" || d.Summary == "":
		panic(fmt.Sprintf("pass: %q registered without a version or a summary", d.Name))
	case d.Verify == "" || d.Draft == "":
		panic(fmt.Sprintf("pass: %q does not state how it treats verify and draft graphs (Description.Verify, Draft)", d.Name))
	}
	if _, err := Schema(d, f()); err != nil {
		panic(err)
	}
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := registry[d.Name]; dup {
		panic(fmt.Sprintf("pass: %q registered twice", d.Name))
	}
	registry[d.Name] = Registration{Description: d, New: f}
}

// Lookup finds a registered pass.
func Lookup(name string) (Registration, bool) {
	regMu.RLock()
	defer regMu.RUnlock()
	r, ok := registry[name]
	return r, ok
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
