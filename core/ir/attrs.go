package ir

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// AttrStream is the attribute that places a node on a stream: 0 (absent)
// the main one; 1 a side stream, where a backend with streams (cuda) may
// run it beside the main-stream nodes that follow it, waiting only for the
// values it reads (a pass sets it: moe-shared-overlap). It never changes a
// result; backends without streams ignore it.
const AttrStream = "stream"

// Attrs are a node's attributes. Values are int, float64, string, bool or
// []int; anything else is rejected by the verifier.
type Attrs map[string]any

// Int returns an int attribute (or def when absent).
func (a Attrs) Int(k string, def int) int {
	if v, ok := a[k].(int); ok {
		return v
	}
	return def
}

// Float returns a float attribute (or def when absent).
func (a Attrs) Float(k string, def float64) float64 {
	switch v := a[k].(type) {
	case float64:
		return v
	case int:
		return float64(v)
	}
	return def
}

// String returns a string attribute (or def when absent).
func (a Attrs) String(k, def string) string {
	if v, ok := a[k].(string); ok {
		return v
	}
	return def
}

// Bool returns a bool attribute (or false when absent).
func (a Attrs) Bool(k string) bool {
	v, _ := a[k].(bool)
	return v
}

// Ints returns an []int attribute.
func (a Attrs) Ints(k string) []int {
	v, _ := a[k].([]int)
	return v
}

// Has reports whether the attribute is set.
func (a Attrs) Has(k string) bool { _, ok := a[k]; return ok }

// Clone returns a shallow copy.
func (a Attrs) Clone() Attrs {
	c := Attrs{}
	for k, v := range a {
		c[k] = v
	}
	return c
}

// Format prints attributes sorted by key: "{a=1, b="x"}".
func (a Attrs) Format() string {
	if len(a) == 0 {
		return ""
	}
	keys := make([]string, 0, len(a))
	for k := range a {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + formatAttr(a[k])
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func formatAttr(v any) string {
	switch x := v.(type) {
	case int:
		return strconv.Itoa(x)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case string:
		return strconv.Quote(x)
	case bool:
		return strconv.FormatBool(x)
	case []int:
		s := make([]string, len(x))
		for i, e := range x {
			s[i] = strconv.Itoa(e)
		}
		return "[" + strings.Join(s, ",") + "]"
	}
	return fmt.Sprintf("<%T>", v)
}

func validAttr(v any) bool {
	switch v.(type) {
	case int, float64, string, bool, []int:
		return true
	}
	return false
}
