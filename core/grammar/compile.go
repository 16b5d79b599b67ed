package grammar

import (
	"container/list"
	"encoding/json"
	"fmt"
	"sync"
)

// Kind is what a Spec's text is.
type Kind int

// Kinds of grammar.
const (
	Regex      Kind = iota + 1 // a regular expression (Go/Perl syntax), matched in whole
	JSONSchema                 // a JSON Schema (the subset below), compact JSON
	JSONObject                 // any JSON object (Text empty), nesting up to ObjectDepth
	Choice                     // a JSON array of strings: exactly one of them
	ToolCalls                  // a JSON ToolCallSpec: GLM-4.5 tool calls
)

func (k Kind) String() string {
	switch k {
	case Regex:
		return "regex"
	case JSONSchema:
		return "json_schema"
	case JSONObject:
		return "json_object"
	case Choice:
		return "choice"
	case ToolCalls:
		return "tool_calls"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Spec says what an output must be.
//
// JSON (JSONSchema, JSONObject, and a tool call's non-string arguments) is
// compact: no whitespace outside strings; numbers have integer parts of
// at most 15 digits, fractions of at most 15 and exponents of at most 2
// (every integer exact in a double). The JSON Schema subset: type
// (string, number, integer, boolean, null, object, array, or an array of
// them), properties (written in schema order; the required ones always,
// the others optionally), required, additionalProperties (false or true:
// only declared properties are written; absent the same), enum and const
// (beside type, the values of that type), anyOf (a choice of branches),
// oneOf (the same, where its branches are exclusive: different JSON types
// or literals without a common value; else refused), $ref to #/$defs/NAME or
// #/definitions/NAME (not recursive), items, minItems, maxItems,
// minLength, maxLength, pattern (matched in whole; written unescaped, so
// it cannot produce '"', '\\' or control characters), format (date, time,
// date-time, uuid, email: a regex of a subset of each), and the
// annotations (title, description, default, examples, …). Any other
// keyword is refused by name. An object without properties is any JSON
// object ({} with additionalProperties false), a schema without a type any
// JSON value, nesting up to ObjectDepth.
type Spec struct {
	Kind Kind
	Text string
	// After, when set, lets free text come first, up to and including the
	// first occurrence of After (e.g. "</think>": reasoning precedes the
	// structured output); the grammar applies from there.
	After string
	// AfterOpen, with After, makes the free text optional and, when
	// present, opening with AfterOpen (e.g. an optional
	// "<think>…</think>" before the output).
	AfterOpen string
}

// MaxAfterBytes bounds Spec.After.
const MaxAfterBytes = 64

// MaxChoices bounds a Choice's strings (and MaxChoiceBytes their bytes).
const (
	MaxChoices     = 1024
	MaxChoiceBytes = 64 << 10
)

// build compiles spec into a fresh NFA, returning its start.
func build(spec Spec) (*nfa, int32, error) {
	n := newNFA()
	var start int32
	switch spec.Kind {
	case Regex:
		start = n.regex(spec.Text, nil, acceptState)
	case JSONSchema:
		if len(spec.Text) > MaxSchemaBytes {
			return nil, 0, fmt.Errorf("the schema is %d bytes, at most %d", len(spec.Text), MaxSchemaBytes)
		}
		raw := json.RawMessage(spec.Text)
		root, err := decodeSchema(raw)
		if err != nil {
			return nil, 0, fmt.Errorf("schema: %v", err)
		}
		c := &schemaCompiler{n: n, root: root}
		start = c.schema(raw, "schema", acceptState)
	case JSONObject:
		if spec.Text != "" {
			return nil, 0, fmt.Errorf("json_object takes no text")
		}
		start = n.jsonObject(ObjectDepth, acceptState)
	case Choice:
		if len(spec.Text) > MaxChoiceBytes {
			return nil, 0, fmt.Errorf("the choices are %d bytes, at most %d", len(spec.Text), MaxChoiceBytes)
		}
		var cs []string
		if err := json.Unmarshal([]byte(spec.Text), &cs); err != nil || len(cs) == 0 {
			return nil, 0, fmt.Errorf("choice must be a non-empty array of strings")
		}
		if len(cs) > MaxChoices {
			return nil, 0, fmt.Errorf("at most %d choices, got %d", MaxChoices, len(cs))
		}
		ps := make([]func(int32) int32, len(cs))
		for i, c := range cs {
			ps[i] = func(next int32) int32 { return n.lit(c, next) }
		}
		start = n.alt(acceptState, ps...)
	case ToolCalls:
		var tc ToolCallSpec
		if err := json.Unmarshal([]byte(spec.Text), &tc); err != nil {
			return nil, 0, fmt.Errorf("tool calls: %v", err)
		}
		start = n.toolCalls(tc, acceptState)
	default:
		return nil, 0, fmt.Errorf("unknown grammar kind %d", int(spec.Kind))
	}
	if spec.After != "" {
		if len(spec.After) > MaxAfterBytes {
			return nil, 0, fmt.Errorf("after: %d bytes, at most %d", len(spec.After), MaxAfterBytes)
		}
		body := start
		start = n.until(spec.After, body)
		if spec.AfterOpen != "" {
			if len(spec.AfterOpen) > MaxAfterBytes {
				return nil, 0, fmt.Errorf("after_open: %d bytes, at most %d", len(spec.AfterOpen), MaxAfterBytes)
			}
			start = n.eps(body, n.lit(spec.AfterOpen, start))
		}
	} else if spec.AfterOpen != "" {
		return nil, 0, fmt.Errorf("after_open needs after")
	}
	if n.err != nil {
		return nil, 0, n.err
	}
	return n, start, nil
}

// until is free text up to and including the first occurrence of lit,
// then next: the KMP automaton of lit, its states matching lit's prefixes.
func (n *nfa) until(lit string, next int32) int32 {
	m := len(lit)
	fail := make([]int, m+1) // KMP failure function
	for i, k := 1, 0; i < m; i++ {
		for k > 0 && lit[i] != lit[k] {
			k = fail[k]
		}
		if lit[i] == lit[k] {
			k++
		}
		fail[i+1] = k
	}
	states := make([]int32, m)
	for i := range states {
		states[i] = n.add(nstate{})
	}
	for k := range m {
		var es []edge
		for b := 0; b < 256; b++ {
			j := k
			for j > 0 && lit[j] != byte(b) {
				j = fail[j]
			}
			if lit[j] == byte(b) {
				j++
			}
			to := next
			if j < m {
				to = states[j]
			}
			if l := len(es); l > 0 && es[l-1].to == to && int(es[l-1].hi) == b-1 {
				es[l-1].hi = byte(b)
			} else {
				es = append(es, edge{byte(b), byte(b), to})
			}
		}
		n.states[states[k]].edges = es
	}
	return states[0]
}

// Compiler compiles grammars over one vocabulary, keeping the last
// MaxCached compiled ones (by kind, after and text): requests that share a
// grammar share its automaton and its cached masks.
type Compiler struct {
	v *Vocab

	mu    sync.Mutex
	lru   *list.List // of *cached, most recent first
	index map[Spec]*list.Element
}

// MaxCached bounds a Compiler's cache of compiled grammars.
const MaxCached = 32

type cached struct {
	spec Spec
	g    *Grammar
}

// NewCompiler returns a compiler over v.
func NewCompiler(v *Vocab) *Compiler {
	return &Compiler{v: v, lru: list.New(), index: map[Spec]*list.Element{}}
}

// Vocab is the compiler's vocabulary.
func (c *Compiler) Vocab() *Vocab { return c.v }

// Compile compiles spec (or returns the cached grammar). Errors say what
// the spec got wrong, naming schema paths and keywords.
func (c *Compiler) Compile(spec Spec) (*Grammar, error) {
	c.mu.Lock()
	if e, ok := c.index[spec]; ok {
		c.lru.MoveToFront(e)
		c.mu.Unlock()
		return e.Value.(*cached).g, nil
	}
	c.mu.Unlock()
	n, start, err := build(spec)
	if err != nil {
		return nil, err
	}
	g, err := newGrammar(n, start, c.v)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.index[spec]; ok { // compiled meanwhile by another caller
		return e.Value.(*cached).g, nil
	}
	c.index[spec] = c.lru.PushFront(&cached{spec, g})
	for c.lru.Len() > MaxCached {
		old := c.lru.Remove(c.lru.Back()).(*cached)
		delete(c.index, old.spec)
	}
	return g, nil
}

// Cached is how many grammars the compiler holds.
func (c *Compiler) Cached() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}
