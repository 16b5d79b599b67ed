package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/glmflash/glmflash/core/grammar"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/glmflash/glmflash/core/reasoning"
	"github.com/glmflash/glmflash/core/toolcall"
	"github.com/glmflash/glmflash/model/chat"
)

// Bounds of the tool-calling fields.
const (
	maxTools        = 128      // tools in a request
	maxToolCalls    = 128      // tool_calls of one message
	maxKwargs       = 32       // chat_template_kwargs keys
	maxKwargsBytes  = 64 << 10 // chat_template_kwargs as JSON
	maxKwargsDepth  = 16       // nesting of a kwarg's value (and of tool-call arguments)
	maxFunctionName = 64       // OpenAI's bound
)

// functionName is OpenAI's pattern of a function's name.
var functionName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// kwargName is a template variable's name.
var kwargName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// toolParam is one of "tools".
type toolParam struct {
	Type     string `json:"type"`
	Function *struct {
		Name        string          `json:"name"`
		Description *string         `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
		Strict      *bool           `json:"strict"`
	} `json:"function"`
}

// messageToolCall is one of an assistant message's "tool_calls".
type messageToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function *struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// checkTools validates tools, tool_choice and parallel_tool_calls against
// the configured parser (format), and returns the request's tool spec
// (nil without tools) and the tools as the template takes them.
func checkTools(req *chatRequest, format string) (*toolcall.Spec, []any, *apiError) {
	if len(req.Tools) > maxTools {
		return nil, nil, badField("tools", "at most %d tools, got %d", maxTools, len(req.Tools))
	}
	spec := &toolcall.Spec{Parallel: true, Format: format}
	var forTemplate []any
	for i, t := range req.Tools {
		f := fmt.Sprintf("tools[%d]", i)
		if t.Type != "function" {
			return nil, nil, badField(f+".type", `must be "function", got %q`, t.Type)
		}
		if t.Function == nil {
			return nil, nil, badField(f+".function", "required")
		}
		if !functionName.MatchString(t.Function.Name) {
			return nil, nil, badField(f+".function.name", "must be 1 to %d letters, digits, _ or -, got %q", maxFunctionName, t.Function.Name)
		}
		for _, o := range spec.Tools {
			if o.Name == t.Function.Name {
				return nil, nil, badField(f+".function.name", "%q is given twice", o.Name)
			}
		}
		tool := toolcall.Tool{Name: t.Function.Name, Strict: t.Function.Strict != nil && *t.Function.Strict}
		fn := map[string]any{"name": t.Function.Name}
		if t.Function.Description != nil {
			tool.Description = *t.Function.Description
			fn["description"] = tool.Description
		}
		if p := bytes.TrimSpace(t.Function.Parameters); len(p) > 0 && string(p) != "null" {
			if jsonKind(p) != "object" {
				return nil, nil, badField(f+".function.parameters", "must be a JSON Schema object, got JSON %s", jsonKind(p))
			}
			v, err := jsonValue(p, maxKwargsDepth*4)
			if err != nil {
				return nil, nil, badField(f+".function.parameters", "%v", err)
			}
			tool.Parameters = p
			fn["parameters"] = v
		}
		if t.Function.Strict != nil {
			fn["strict"] = *t.Function.Strict
		}
		spec.Tools = append(spec.Tools, tool)
		forTemplate = append(forTemplate, map[string]any{"type": "function", "function": fn})
	}
	choice, e := toolChoice(req.ToolChoice, spec.Tools)
	if e != nil {
		return nil, nil, e
	}
	spec.Choice = choice
	if req.ParallelToolCalls != nil {
		spec.Parallel = *req.ParallelToolCalls
	}
	if len(spec.Tools) == 0 {
		return nil, nil, nil
	}
	if choice.Mode != toolcall.ChoiceNone && (format == "" || format == toolcall.FormatNone) {
		return nil, nil, badField("tools", "this server reads no tool calls (model.tool_call_parser is none); send tool_choice \"none\" or no tools")
	}
	return spec, forTemplate, nil
}

// toolChoice reads tool_choice: "none", "auto", "required" or
// {"type": "function", "function": {"name": …}} naming one of tools; by
// default auto with tools, none without.
func toolChoice(raw json.RawMessage, tools []toolcall.Tool) (toolcall.Choice, *apiError) {
	def := toolcall.Choice{Mode: toolcall.ChoiceNone}
	if len(tools) > 0 {
		def.Mode = toolcall.ChoiceAuto
	}
	if len(raw) == 0 || string(raw) == "null" {
		return def, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		switch s {
		case toolcall.ChoiceNone:
			return toolcall.Choice{Mode: s}, nil
		case toolcall.ChoiceAuto, toolcall.ChoiceRequired:
			if len(tools) == 0 {
				return def, badField("tool_choice", "%q needs tools", s)
			}
			return toolcall.Choice{Mode: s}, nil
		}
		return def, badField("tool_choice", `must be "none", "auto", "required" or {"type": "function", "function": {"name": …}}, got %q`, s)
	}
	var obj struct {
		Type     string `json:"type"`
		Function *struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(&obj); err != nil {
		return def, badField("tool_choice", `must be "none", "auto", "required" or {"type": "function", "function": {"name": …}} (%v)`, err)
	}
	if obj.Type != "function" {
		return def, badField("tool_choice.type", `must be "function", got %q`, obj.Type)
	}
	if obj.Function == nil || obj.Function.Name == "" {
		return def, badField("tool_choice.function.name", "required")
	}
	if !slices.ContainsFunc(tools, func(t toolcall.Tool) bool { return t.Name == obj.Function.Name }) {
		return def, badField("tool_choice.function.name", "%q is not one of the request's tools", obj.Function.Name)
	}
	return toolcall.Choice{Mode: toolcall.ChoiceFunction, Name: obj.Function.Name}, nil
}

// constrainTools enforces tool_choice "required" or a named function by
// constrained decoding: the output is one call (several with
// parallel_tool_calls) of the allowed tools in the parser's format, the
// arguments under each tool's parameters schema, reasoning (after, open)
// first where the template leaves room for it. A structured output beside
// it is refused.
func constrainTools(spec *toolcall.Spec, p *params, lv *Live, maxTokField, after, open string, st *structured) *apiError {
	if _, field, ok, e := st.spec(); e != nil {
		return e
	} else if ok {
		return badField(field, "not with tool_choice %q (the output is a tool call)", choiceName(spec.Choice))
	}
	tc := grammar.ToolCallSpec{Parallel: spec.Parallel, Format: spec.Format}
	for _, t := range spec.Allowed() {
		tc.Tools = append(tc.Tools, grammar.ToolSpec{Name: t.Name, Parameters: t.Parameters})
	}
	gs, err := grammar.ToolCallsSpec(tc)
	if err != nil {
		return badField("tools", "%v", err)
	}
	gs.After, gs.AfterOpen = after, open
	return compileInto(p, lv, gs, "tools", maxTokField)
}

func choiceName(c toolcall.Choice) string {
	if c.Mode == toolcall.ChoiceFunction {
		return "function " + c.Name
	}
	return c.Mode
}

// checkKwargs reads chat_template_kwargs: an object of at most maxKwargs
// template variables (identifiers, not a variable the server sets), at
// most maxKwargsBytes, values nested at most maxKwargsDepth deep.
func checkKwargs(raw json.RawMessage) (map[string]any, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if len(raw) > maxKwargsBytes {
		return nil, badField("chat_template_kwargs", "larger than %d bytes", maxKwargsBytes)
	}
	if k := jsonKind(raw); k != "object" {
		return nil, badField("chat_template_kwargs", "must be an object, got JSON %s", k)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, badField("chat_template_kwargs", "%v", err)
	}
	if len(m) > maxKwargs {
		return nil, badField("chat_template_kwargs", "at most %d variables, got %d", maxKwargs, len(m))
	}
	out := make(map[string]any, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		f := "chat_template_kwargs." + k
		if !kwargName.MatchString(k) {
			return nil, badField("chat_template_kwargs", "%q is not a template variable name (letters, digits and _, at most 64)", k)
		}
		if slices.Contains(chat.Reserved, k) {
			return nil, badField(f, "is set by the server (reserved: %s)", strings.Join(chat.Reserved, ", "))
		}
		v, err := jsonValue(m[k], maxKwargsDepth)
		if err != nil {
			return nil, badField(f, "%v", err)
		}
		out[k] = v
	}
	return out, nil
}

// jsonValue decodes JSON for a template: objects as maps, lists, strings,
// booleans, null, integers as int64 and other numbers as float64; nesting
// deeper than depth is refused.
func jsonValue(raw []byte, depth int) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return numbers(v, depth, depth)
}

func numbers(v any, depth, limit int) (any, error) {
	if depth < 0 {
		return nil, fmt.Errorf("nested too deep (at most %d levels)", limit)
	}
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i, nil
		}
		f, err := x.Float64()
		if err != nil {
			return nil, fmt.Errorf("the number %s is out of range", x)
		}
		return f, nil
	case map[string]any:
		for k, e := range x {
			n, err := numbers(e, depth-1, limit)
			if err != nil {
				return nil, err
			}
			x[k] = n
		}
	case []any:
		for i, e := range x {
			n, err := numbers(e, depth-1, limit)
			if err != nil {
				return nil, err
			}
			x[i] = n
		}
	}
	return v, nil
}

// messageTools reads a message's tool fields into m: an assistant's
// tool_calls (arguments a JSON object in a string), a tool message's
// tool_call_id (required), reasoning_content.
func messageTools(f string, in chatMessage, m *chat.Message) *apiError {
	m.Name = in.Name
	if len(in.ToolCalls) > 0 && in.Role != "assistant" {
		return badField(f+".tool_calls", "only assistant messages have tool calls")
	}
	if in.ReasoningContent != nil && in.Role != "assistant" {
		return badField(f+".reasoning_content", "only assistant messages have reasoning")
	}
	if in.ToolCallID != "" && in.Role != "tool" {
		return badField(f+".tool_call_id", "only tool messages answer a tool call")
	}
	if in.Role == "tool" && in.ToolCallID == "" {
		return badField(f+".tool_call_id", "required in a tool message (the id of the call it answers)")
	}
	if len(in.ToolCalls) > maxToolCalls {
		return badField(f+".tool_calls", "at most %d tool calls, got %d", maxToolCalls, len(in.ToolCalls))
	}
	m.ToolCallID, m.ReasoningContent = in.ToolCallID, in.ReasoningContent
	for j, tc := range in.ToolCalls {
		g := fmt.Sprintf("%s.tool_calls[%d]", f, j)
		if tc.Type != "" && tc.Type != "function" {
			return badField(g+".type", `must be "function", got %q`, tc.Type)
		}
		if tc.Function == nil {
			return badField(g+".function", "required")
		}
		if tc.Function.Name == "" {
			return badField(g+".function.name", "required")
		}
		args := map[string]any{}
		if strings.TrimSpace(tc.Function.Arguments) != "" {
			v, err := jsonValue([]byte(tc.Function.Arguments), maxKwargsDepth)
			if err != nil {
				return badField(g+".function.arguments", "must be a JSON object in a string: %v", err)
			}
			obj, ok := v.(map[string]any)
			if !ok {
				return badField(g+".function.arguments", "must be a JSON object in a string, got JSON %s", jsonKind([]byte(tc.Function.Arguments)))
			}
			args = obj
		}
		m.ToolCalls = append(m.ToolCalls, chat.ToolCall{ID: tc.ID, Type: "function", Name: tc.Function.Name, Arguments: args})
	}
	return nil
}

// chatOut parses a chat's output: reasoning, then content and tool calls.
type chatOut struct {
	think *reasoning.Parser // nil: no reasoning parser
	tools toolcall.Parser   // nil: no tool calls parsed
}

// outPiece is one piece of parsed output.
type outPiece struct {
	reasoning string
	delta     toolcall.Delta // content or a piece of a call
}

func newChatOut(p *params) *chatOut {
	o := &chatOut{}
	if p.reasoningFormat != "" && p.reasoningFormat != reasoning.FormatNone {
		o.think = reasoning.New(p.promptOpensThink)
	}
	if p.tools.Parses() {
		opt := toolcall.Options{Tools: p.tools.Tools}
		if !p.tools.Parallel {
			opt.MaxCalls = 1
		}
		o.tools, _ = toolcall.New(p.tools.Format, opt) // Format checked by the configuration
	}
	return o
}

func (o *chatOut) feed(s string, final bool) []outPiece {
	var out []outPiece
	content := s
	if o.think != nil {
		var r, c string
		if final {
			r0, c0 := o.think.Feed(s)
			r1, c1 := o.think.Flush()
			r, c = r0+r1, c0+c1
		} else {
			r, c = o.think.Feed(s)
		}
		if r != "" {
			out = append(out, outPiece{reasoning: r})
		}
		content = c
	}
	if o.tools == nil {
		if content != "" {
			out = append(out, outPiece{delta: toolcall.Delta{Content: content}})
		}
		return out
	}
	ds := o.tools.Feed(content)
	if final {
		ds = append(ds, o.tools.Flush()...)
	}
	for _, d := range ds {
		out = append(out, outPiece{delta: d})
	}
	return out
}
