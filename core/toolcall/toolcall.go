// Package toolcall holds what tool calling needs beside the chat API: the
// tools a request offers and the choice it makes (Spec, what constrained
// decoding of tool_choice "required" or a named function reads), and the
// parsers that turn a model's tool-call text back into calls,
// incrementally, for streaming:
//
//   - glm45, GLM-4.5's format (vLLM's --tool-call-parser glm45; the format
//     GLM-4.5's chat template teaches):
//
//     <tool_call>get_weather
//     <arg_key>city</arg_key>
//     <arg_value>Beijing</arg_value>
//     <arg_key>days</arg_key>
//     <arg_value>3</arg_value>
//     </tool_call>
//
//     the name right after <tool_call>, then key/value pairs; a value is
//     raw text when the parameter's schema type is string, else JSON
//     (text that is not JSON stays a string);
//
//   - json: <tool_call>{"name": "get_weather", "arguments": {…}}</tool_call>
//     (Hermes / Qwen style).
//
// Text outside the calls is content. A parser fed the output whole or in
// pieces cut anywhere gives the same content and calls
// (TestSplitAnywhere).
package toolcall

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
)

// Formats are the values of the tool-call-parser setting.
const (
	FormatNone  = "none"  // no parser: tools are refused
	FormatGLM45 = "glm45" // GLM-4.5's <arg_key>/<arg_value> format
	FormatJSON  = "json"  // a JSON object in <tool_call>…</tool_call>
)

// Formats lists the formats, in the order errors name them.
var Formats = []string{FormatNone, FormatGLM45, FormatJSON}

// Check refuses an unknown format.
func Check(format string) error {
	for _, f := range Formats {
		if f == format {
			return nil
		}
	}
	return fmt.Errorf("%q is not a tool-call parser (have %s)", format, strings.Join(Formats, ", "))
}

// The tags around a call.
const (
	Open  = "<tool_call>"
	Close = "</tool_call>"
)

// Tool is a function a request offers.
type Tool struct {
	Name        string
	Description string
	// Parameters is the JSON Schema of its arguments (a JSON object), nil
	// when the tool gave none (any object).
	Parameters json.RawMessage
	Strict     bool
}

// Choice modes (tool_choice).
const (
	ChoiceAuto     = "auto"     // the model decides
	ChoiceNone     = "none"     // no calls: the output is content
	ChoiceRequired = "required" // at least one call
	ChoiceFunction = "function" // a call of Choice.Name
)

// Choice is a request's tool_choice.
type Choice struct {
	Mode string
	Name string // the function, for ChoiceFunction
}

// Spec is what a request says about tools, checked.
type Spec struct {
	Tools  []Tool
	Choice Choice
	// Parallel allows several calls in one turn (parallel_tool_calls,
	// default true); false keeps the first.
	Parallel bool
	// Format is the parser's (and a constraint's) call format.
	Format string
}

// Constrained reports whether the choice must be enforced by constrained
// decoding (required, or a named function).
func (s *Spec) Constrained() bool {
	return s != nil && (s.Choice.Mode == ChoiceRequired || s.Choice.Mode == ChoiceFunction)
}

// Allowed are the tools a constrained output may call: the named one, or
// all of them.
func (s *Spec) Allowed() []Tool {
	if s.Choice.Mode == ChoiceFunction {
		for _, t := range s.Tools {
			if t.Name == s.Choice.Name {
				return []Tool{t}
			}
		}
		return nil
	}
	return s.Tools
}

// Parses reports whether the output is parsed for calls (tools given, the
// choice not none, a format).
func (s *Spec) Parses() bool {
	return s != nil && len(s.Tools) > 0 && s.Choice.Mode != ChoiceNone && s.Format != FormatNone && s.Format != ""
}

// Delta is a piece of parsed output: content, or a piece of call Index
// (its ID and Name on its first delta, then fragments of its arguments'
// JSON, which concatenate to a JSON object).
type Delta struct {
	Content   string
	Call      bool
	Index     int
	ID, Name  string
	Arguments string
}

// Call is a whole call.
type Call struct {
	ID, Name, Arguments string
}

// Collect joins deltas into content and calls.
func Collect(ds []Delta) (string, []Call) {
	var content strings.Builder
	var calls []Call
	for _, d := range ds {
		if !d.Call {
			content.WriteString(d.Content)
			continue
		}
		for len(calls) <= d.Index {
			calls = append(calls, Call{})
		}
		c := &calls[d.Index]
		if d.ID != "" {
			c.ID = d.ID
		}
		if d.Name != "" {
			c.Name = d.Name
		}
		c.Arguments += d.Arguments
	}
	return content.String(), calls
}

// Parser parses one output; it is used by one goroutine.
type Parser interface {
	// Feed takes the next piece of output and returns what it releases.
	Feed(s string) []Delta
	// Flush ends the output: a call cut off after its name is closed with
	// the arguments complete so far; one cut before is content.
	Flush() []Delta
}

// NewID returns a call id, "call_" and 24 random hex digits.
func NewID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "call_" + hex.EncodeToString(b[:])
}

// Options tune a parser.
type Options struct {
	// Tools say which arguments are strings (glm45); nil: none known.
	Tools []Tool
	// MaxCalls keeps the first calls only (0: all): the rest of the output
	// after the last kept call is dropped.
	MaxCalls int
	// NewID names the calls (nil: NewID).
	NewID func() string
}

// New returns a parser of a format (not none).
func New(format string, o Options) (Parser, error) {
	if o.NewID == nil {
		o.NewID = NewID
	}
	b := base{o: o, strs: stringArgs(o.Tools)}
	switch format {
	case FormatGLM45:
		return &glmParser{base: b}, nil
	case FormatJSON:
		return &jsonParser{base: b}, nil
	}
	if err := Check(format); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("tool-call parser %q parses nothing", format)
}

// stringArgs maps each tool to its string-typed parameters.
func stringArgs(tools []Tool) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for _, t := range tools {
		var s struct {
			Properties map[string]struct {
				Type json.RawMessage `json:"type"`
			} `json:"properties"`
		}
		if json.Unmarshal(t.Parameters, &s) != nil {
			continue
		}
		m := map[string]bool{}
		for k, p := range s.Properties {
			m[k] = isStringType(p.Type)
		}
		out[t.Name] = m
	}
	return out
}

// isStringType: "string", or a list of types whose only non-null one is
// string.
func isStringType(raw json.RawMessage) bool {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one == "string"
	}
	var many []string
	if json.Unmarshal(raw, &many) != nil {
		return false
	}
	str := false
	for _, t := range many {
		switch t {
		case "string":
			str = true
		case "null":
		default:
			return false
		}
	}
	return str
}

// base is what both parsers share: content outside calls, call numbering.
type base struct {
	o     Options
	strs  map[string]map[string]bool
	buf   string
	calls int  // calls started
	done  bool // MaxCalls reached: the rest is dropped
	lead  bool // after a call: white space before the next text is dropped
	out   []Delta
}

func (b *base) content(s string) {
	if s == "" {
		return
	}
	if n := len(b.out); n > 0 && !b.out[n-1].Call {
		b.out[n-1].Content += s
		return
	}
	b.out = append(b.out, Delta{Content: s})
}

// text consumes content from buf up to the next <tool_call> (true when one
// opens; buf then holds what follows it). White space right before a call
// is dropped, and so is white space after a call and at the end of the
// output once a call was made; text that may be the start of <tool_call>
// is held.
func (b *base) text(final bool) bool {
	if b.lead {
		if b.buf = strings.TrimLeft(b.buf, " \t\r\n"); b.buf == "" {
			return false
		}
		b.lead = false
	}
	if i := strings.Index(b.buf, Open); i >= 0 {
		b.content(strings.TrimRight(b.buf[:i], " \t\r\n"))
		b.buf = b.buf[i+len(Open):]
		return true
	}
	if final {
		if b.calls > 0 {
			b.content(strings.TrimRight(b.buf, " \t\r\n"))
		} else {
			b.content(b.buf)
		}
		b.buf = ""
		return false
	}
	k := heldPrefix(b.buf, Open)
	rest := b.buf[:len(b.buf)-k]
	t := strings.TrimRight(rest, " \t\r\n")
	b.content(t)
	b.buf = b.buf[len(t):]
	return false
}

// take returns the deltas made so far.
func (b *base) take() []Delta {
	out := b.out
	b.out = nil
	return out
}

// start begins a call; false once MaxCalls are made.
func (b *base) start(name string) (int, bool) {
	if b.o.MaxCalls > 0 && b.calls >= b.o.MaxCalls {
		b.done = true
		return 0, false
	}
	i := b.calls
	b.calls++
	b.lead = true
	b.out = append(b.out, Delta{Call: true, Index: i, ID: b.o.NewID(), Name: name})
	return i, true
}

func (b *base) args(i int, s string) {
	b.out = append(b.out, Delta{Call: true, Index: i, Arguments: s})
}

// heldPrefix is the length of the longest suffix of s that is a proper
// prefix of tag.
func heldPrefix(s, tag string) int {
	for n := min(len(tag)-1, len(s)); n > 0; n-- {
		if strings.HasSuffix(s, tag[:n]) {
			return n
		}
	}
	return 0
}

// jsonString is s as a JSON string.
func jsonString(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return strings.TrimSuffix(b.String(), "\n")
}

// maxName bounds a call's name (and the text read while looking for its
// end): longer, the <tool_call> was not a call.
const maxName = 256
