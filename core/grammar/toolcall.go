package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// ToolCallSpec is the grammar of a forced tool call (tool_choice
// "required" or a named function) in the GLM-4.5 format:
//
//	<tool_call>get_weather
//	<arg_key>city</arg_key>
//	<arg_value>Beijing</arg_value>
//	<arg_key>days</arg_key>
//	<arg_value>3</arg_value>
//	</tool_call>
//
// The name comes right after <tool_call> and a newline; each argument is a
// key line and a value line, in the parameters schema's property order
// (the required ones always, the others optionally); a string value is
// raw text without '<' (an enum's strings raw), any other value compact
// JSON constrained by the property's schema. With Parallel, one or more
// calls follow one another, each after a newline (the first one may have
// one too, as the released GLM-4.5 template renders every call after
// one); else exactly one.
//
// With Format "json" each call is instead
// <tool_call>{"name":"get_weather","arguments":{…}}</tool_call>, the
// arguments compact JSON under the parameters schema (any object without
// one).
type ToolCallSpec struct {
	Tools    []ToolSpec `json:"tools"`
	Parallel bool       `json:"parallel"`
	Format   string     `json:"format,omitempty"` // "glm45" (or empty) or "json"
}

// ToolSpec is one function: its name and parameters (a JSON Schema of an
// object, or empty for none).
type ToolSpec struct {
	Name       string          `json:"name"`
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// MaxTools bounds a ToolCallSpec's functions.
const MaxTools = 128

// ToolCallsSpec is the Spec of a tool-call grammar (the text is the JSON
// of tc).
func ToolCallsSpec(tc ToolCallSpec) (Spec, error) {
	b, err := json.Marshal(tc)
	if err != nil {
		return Spec{}, err
	}
	return Spec{Kind: ToolCalls, Text: string(b)}, nil
}

func (n *nfa) toolCalls(tc ToolCallSpec, next int32) int32 {
	if len(tc.Tools) == 0 {
		n.fail(fmt.Errorf("tools: at least one function is needed"))
		return next
	}
	if len(tc.Tools) > MaxTools {
		n.fail(fmt.Errorf("tools: at most %d functions, got %d", MaxTools, len(tc.Tools)))
		return next
	}
	for i, t := range tc.Tools {
		if t.Name == "" || strings.ContainsAny(t.Name, "<>\n") {
			n.fail(fmt.Errorf("tools[%d].name: %q must be non-empty, without '<', '>' or a newline", i, t.Name))
			return next
		}
	}
	if tc.Format != "" && tc.Format != "glm45" && tc.Format != "json" {
		n.fail(fmt.Errorf("format: %q is not a tool-call format (glm45, json)", tc.Format))
		return next
	}
	call := func(next int32) int32 {
		ps := make([]func(int32) int32, len(tc.Tools))
		for i, t := range tc.Tools {
			path := fmt.Sprintf("tools[%d].parameters", i)
			if tc.Format == "json" {
				ps[i] = func(next int32) int32 {
					return n.lit(`<tool_call>{"name":`+quote(t.Name)+`,"arguments":`, n.jsonArgs(t, path, n.lit("}</tool_call>", next)))
				}
				continue
			}
			ps[i] = func(next int32) int32 {
				return n.lit("<tool_call>"+t.Name+"\n", n.toolArgs(t, path, n.lit("</tool_call>", next)))
			}
		}
		return n.alt(next, ps...)
	}
	// The released template renders each call after a newline
	// ('\n<tool_call>' + name): the first one may have it too.
	first := func(body int32) int32 { return n.eps(body, n.lit("\n", body)) }
	if tc.Parallel {
		return first(n.sep(call, "\n", 1, -1, next))
	}
	return first(call(next))
}

func (n *nfa) toolArgs(t ToolSpec, path string, next int32) int32 {
	raw := bytes.TrimSpace(t.Parameters)
	if len(raw) == 0 || string(raw) == "null" {
		return next
	}
	if len(raw) > MaxSchemaBytes {
		n.fail(fmt.Errorf("%s: %d bytes, at most %d", path, len(raw), MaxSchemaBytes))
		return next
	}
	root, err := decodeSchema(raw)
	if err != nil {
		n.fail(fmt.Errorf("%s: %v", path, err))
		return next
	}
	c := &schemaCompiler{n: n, root: root}
	if o := only(root, "type", "properties", "required", "additionalProperties"); o != "" {
		n.fail(fmt.Errorf("%s.%s: not supported in a function's parameters", path, o))
		return next
	}
	if ty, ok := root["type"]; ok && string(bytes.TrimSpace(ty)) != `"object"` {
		n.fail(fmt.Errorf("%s.type: a function's parameters must be an object", path))
		return next
	}
	pr, ok := root["properties"]
	if !ok {
		return next
	}
	keys, err := orderedKeys(pr)
	if err != nil {
		n.fail(fmt.Errorf("%s.properties: %v", path, err))
		return next
	}
	var props map[string]json.RawMessage
	_ = json.Unmarshal(pr, &props) // orderedKeys read it
	var required []string
	if r, ok := root["required"]; ok {
		if err := json.Unmarshal(r, &required); err != nil {
			n.fail(fmt.Errorf("%s.required: must be an array of property names", path))
			return next
		}
	}
	for _, r := range required {
		if _, ok := props[r]; !ok {
			n.fail(fmt.Errorf("%s.required: names %q, which properties does not declare", path, r))
			return next
		}
	}
	tail := next
	for i := len(keys) - 1; i >= 0; i-- {
		k := keys[i]
		if strings.Contains(k, "<") {
			n.fail(fmt.Errorf("%s.properties: the name %q holds '<'", path, k))
			return next
		}
		arg := n.lit("<arg_key>"+k+"</arg_key>\n<arg_value>",
			c.argValue(props[k], path+".properties."+k, n.lit("</arg_value>\n", tail)))
		if slices.Contains(required, k) {
			tail = arg
		} else {
			tail = n.eps(arg, tail)
		}
	}
	return tail
}

// noLT keeps the runes of a raw tool-call string value ('<' would start a
// tag).
func noLT(ranges [][2]rune) [][2]rune { return subtract(ranges, [2]rune{'<', '<'}) }

// argValue is one argument's value: raw text for a string schema, compact
// JSON otherwise.
func (c *schemaCompiler) argValue(raw json.RawMessage, path string, next int32) int32 {
	s, err := decodeSchema(raw)
	if err != nil {
		return c.fail(path, "%v", err)
	}
	types, err := typesOf(s)
	if err != nil {
		return c.fail(path+".type", "%v", err)
	}
	if len(types) != 1 || types[0] != "string" {
		return c.schema(raw, path, next)
	}
	if o := only(s, "type", "enum", "minLength", "maxLength", "pattern"); o != "" {
		return c.fail(path+"."+o, "not supported in a tool call's string argument")
	}
	if e, ok := s["enum"]; ok {
		var vals []string
		if err := json.Unmarshal(e, &vals); err != nil || len(vals) == 0 {
			return c.fail(path+".enum", "must be a non-empty array of strings")
		}
		ps := make([]func(int32) int32, len(vals))
		for i, v := range vals {
			if strings.Contains(v, "<") {
				return c.fail(fmt.Sprintf("%s.enum[%d]", path, i), "holds '<'")
			}
			ps[i] = func(next int32) int32 { return c.n.lit(v, next) }
		}
		return c.n.alt(next, ps...)
	}
	if p, ok := s["pattern"]; ok {
		var re string
		if err := json.Unmarshal(p, &re); err != nil {
			return c.fail(path+".pattern", "must be a string")
		}
		return c.n.regex(re, noLT, next)
	}
	minL, ok1 := c.count(s, "minLength", path, 0)
	maxL, ok2 := c.count(s, "maxLength", path, -1)
	if !ok1 || !ok2 {
		return next
	}
	char := func(next int32) int32 { return c.n.runes(noLT([][2]rune{{0, 0x10FFFF}}), next) }
	return c.n.repeat(char, minL, maxL, next)
}

// jsonArgs is a JSON call's arguments: an object under the parameters
// schema (any object without one).
func (n *nfa) jsonArgs(t ToolSpec, path string, next int32) int32 {
	raw := bytes.TrimSpace(t.Parameters)
	if len(raw) == 0 || string(raw) == "null" {
		return n.jsonObject(ObjectDepth, next)
	}
	if len(raw) > MaxSchemaBytes {
		n.fail(fmt.Errorf("%s: %d bytes, at most %d", path, len(raw), MaxSchemaBytes))
		return next
	}
	root, err := decodeSchema(raw)
	if err != nil {
		n.fail(fmt.Errorf("%s: %v", path, err))
		return next
	}
	if ty, ok := root["type"]; ok && string(bytes.TrimSpace(ty)) != `"object"` {
		n.fail(fmt.Errorf("%s.type: a function's parameters must be an object", path))
		return next
	}
	c := &schemaCompiler{n: n, root: root}
	return c.schema(raw, path, next)
}
