// Package chat renders a checkpoint's chat template (the Jinja
// "chat_template" of tokenizer_config.json, or chat_template.jinja) into
// the prompt text the model was trained on, as transformers'
// apply_chat_template does: with messages (tool calls, tool results and
// reasoning included), add_generation_prompt, the bos_token / eos_token
// strings, the request's tools and its chat_template_kwargs.
//
// Templates come with checkpoints and are not trusted: they render in a
// sandbox (sandbox.go) that bounds the nesting of macro calls and control
// structures, range, the output and every string a macro or filter makes,
// and the time, and stops when the request's context is done; every
// failure is an error for that rendering only.
package chat

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/glmflash/glmflash/internal/regular"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// ErrNoTemplate is returned by Load for a checkpoint without a chat template.
var ErrNoTemplate = errors.New("chat: the checkpoint has no chat template (tokenizer_config.json chat_template or chat_template.jinja)")

// maxConfigBytes bounds tokenizer_config.json and chat_template.jinja.
const maxConfigBytes = 16 << 20

// Message is one turn of a conversation. The template sees role and
// content always, and name, tool_calls, tool_call_id and reasoning_content
// when they are set (so that "m.reasoning_content is string" is false for
// a message without one).
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
	// Name is the participant's name (OpenAI's "name").
	Name string `json:"name,omitempty"`
	// ToolCalls are an assistant turn's calls.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID is the call a tool message answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// ReasoningContent is an assistant turn's reasoning (nil: none given;
	// templates then look for <think>…</think> in the content).
	ReasoningContent *string `json:"reasoning_content,omitempty"`
}

// ToolCall is one call of an assistant turn, as templates read it:
// tc.id, tc.type, tc.function.name and tc.function.arguments, the
// arguments a mapping (OpenAI sends them as a JSON string; templates
// iterate them with .items(), as vLLM and transformers give them).
type ToolCall struct {
	ID        string         `json:"id"`
	Type      string         `json:"type"`
	Name      string         `json:"name"`
	Arguments map[string]any `json:"arguments"`
}

// Options are what a rendering takes besides the messages.
type Options struct {
	// AddGenerationPrompt appends the start of the assistant's turn.
	AddGenerationPrompt bool
	// Tools are the request's tools, as OpenAI sends them
	// ({"type": "function", "function": {…}}); nil: none (the template
	// sees tools = none).
	Tools []any
	// Kwargs are extra template variables (chat_template_kwargs:
	// enable_thinking …); they cannot replace the variables above
	// (Reserved).
	Kwargs map[string]any
}

// Reserved are the template variables a rendering sets itself, which
// Options.Kwargs cannot replace.
var Reserved = []string{"messages", "add_generation_prompt", "bos_token", "eos_token", "tools", "raise_exception", "range", "lipsum"}

// Template is a compiled chat template; it is safe for concurrent use.
type Template struct {
	tmpl     *exec.Template
	Source   string // the template text
	BOSToken string // "" when the tokenizer has none
	EOSToken string
	limits   Limits
}

// tokConfig is the part of tokenizer_config.json the template needs.
type tokConfig struct {
	ChatTemplate json.RawMessage `json:"chat_template"`
	BOSToken     json.RawMessage `json:"bos_token"`
	EOSToken     json.RawMessage `json:"eos_token"`
}

// tokenString reads a special token that is a string, an AddedToken object
// ({"content": …}) or null.
func tokenString(raw json.RawMessage, field string) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == nil {
		return "", fmt.Errorf("%s: want a string, null or an object with \"content\"", field)
	}
	return *obj.Content, nil
}

// Parse reads tokenizer_config.json; jinjaFile, when not empty, is the text
// of chat_template.jinja, which takes precedence over chat_template.
func Parse(tokenizerConfig []byte, jinjaFile string) (*Template, error) {
	var c tokConfig
	if len(tokenizerConfig) > 0 {
		if err := json.Unmarshal(tokenizerConfig, &c); err != nil {
			return nil, fmt.Errorf("tokenizer_config.json: %v", err)
		}
	}
	t := &Template{limits: DefaultLimits}
	var err error
	if t.BOSToken, err = tokenString(c.BOSToken, "tokenizer_config.json: bos_token"); err != nil {
		return nil, err
	}
	if t.EOSToken, err = tokenString(c.EOSToken, "tokenizer_config.json: eos_token"); err != nil {
		return nil, err
	}
	src := jinjaFile
	if src == "" && len(c.ChatTemplate) > 0 && string(c.ChatTemplate) != "null" {
		if err := json.Unmarshal(c.ChatTemplate, &src); err != nil {
			// A list of named templates: use "default".
			var named []struct {
				Name     string `json:"name"`
				Template string `json:"template"`
			}
			if err := json.Unmarshal(c.ChatTemplate, &named); err != nil {
				return nil, fmt.Errorf("tokenizer_config.json: chat_template: want a string or a list of {name, template}")
			}
			for _, n := range named {
				if n.Name == "default" {
					src = n.Template
				}
			}
			if src == "" {
				return nil, fmt.Errorf("tokenizer_config.json: chat_template: no template named \"default\"")
			}
		}
	}
	if src == "" {
		return nil, ErrNoTemplate
	}
	if t.tmpl, err = compile(src); err != nil {
		return nil, fmt.Errorf("chat_template: %w", err)
	}
	t.Source = src
	// A template that cannot render a plain conversation is refused now,
	// not on the first request.
	if _, err := t.Render(context.Background(), []Message{{Role: "user", Content: "hi"}}, true); err != nil {
		return nil, fmt.Errorf("chat_template: rendering a one-message conversation: %w", err)
	}
	return t, nil
}

// Load reads dir/tokenizer_config.json and dir/chat_template.jinja (either
// may be absent); ErrNoTemplate when neither has a template.
func Load(dir string) (*Template, error) {
	read := func(name string) ([]byte, error) {
		b, err := regular.ReadFile(filepath.Join(dir, name), maxConfigBytes)
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return b, err
	}
	cfg, err := read("tokenizer_config.json")
	if err != nil {
		return nil, err
	}
	j, err := read("chat_template.jinja")
	if err != nil {
		return nil, err
	}
	t, err := Parse(cfg, string(j))
	if err != nil && !errors.Is(err, ErrNoTemplate) {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return t, err
}

// Render returns the prompt text of a conversation; addGenerationPrompt
// appends the start of the assistant's turn. It stops with an error when
// ctx is done or the template passes a limit of the sandbox
// (DefaultLimits).
func (t *Template) Render(ctx context.Context, msgs []Message, addGenerationPrompt bool) (string, error) {
	out, _, err := t.RenderMarked(ctx, msgs, addGenerationPrompt, nil)
	return out, err
}

// Span is a byte range [Start, End) of a rendered prompt.
type Span struct{ Start, End int }

// Sentinels marking a message's content while it renders: Unicode
// noncharacters, never in text a template writes, and replaced with
// U+FFFD in the content they mark.
const (
	openMark  = "\ufdd0"
	closeMark = "\ufdd1"
)

// ErrMarks means the template transformed a marked content so that where
// it ends up in the prompt is lost.
var ErrMarks = errors.New("chat template: a user or tool message's content was transformed by the template, so its special-token text cannot be kept as text")

// RenderMarked renders as Render does, and also returns where the content
// of the user and tool messages for which mark returns true ended up in
// the prompt (mark nil: none), so that the caller can encode special-token
// text there as text while the template's own special tokens stay real.
// Leading and trailing white space of a marked content stays outside the
// marks, so that templates that trim it render as before; a template that
// drops or cuts a marked content is ErrMarks.
func (t *Template) RenderMarked(ctx context.Context, msgs []Message, addGenerationPrompt bool, mark func(string) bool) (string, []Span, error) {
	return t.RenderWith(ctx, msgs, Options{AddGenerationPrompt: addGenerationPrompt}, mark)
}

// RenderWith is RenderMarked with the request's tools and template
// variables. A kwarg named like a variable of Reserved is an error.
func (t *Template) RenderWith(ctx context.Context, msgs []Message, o Options, mark func(string) bool) (string, []Span, error) {
	list := make([]any, len(msgs))
	marked := false
	for i, m := range msgs {
		c := m.Content
		if mark != nil && (m.Role == "user" || m.Role == "tool") && mark(c) {
			c = strings.NewReplacer(openMark, "\ufffd", closeMark, "\ufffd").Replace(c)
			core := strings.TrimSpace(c)
			at := strings.Index(c, core)
			c = c[:at] + openMark + core + closeMark + c[at+len(core):]
			marked = true
		}
		list[i] = messageData(m, c)
	}
	data := map[string]any{}
	for k, v := range o.Kwargs {
		if slices.Contains(Reserved, k) {
			return "", nil, fmt.Errorf("chat template variable %q is set by the server and cannot be given", k)
		}
		data[k] = v
	}
	var tools any // none, not an empty list: "if tools" is false either way
	if o.Tools != nil {
		tools = o.Tools
	}
	maps.Copy(data, map[string]any{
		"messages":              list,
		"add_generation_prompt": o.AddGenerationPrompt,
		"bos_token":             t.BOSToken,
		"eos_token":             t.EOSToken,
		"tools":                 tools,
		"raise_exception":       raiseException,
	})
	out, err := t.render(ctx, data)
	if err != nil {
		return "", nil, err
	}
	if !marked {
		return out, nil, nil
	}
	return unmark(out)
}

// messageData is a message as the template sees it, with content c.
func messageData(m Message, c string) map[string]any {
	d := map[string]any{"role": m.Role, "content": c}
	if m.Name != "" {
		d["name"] = m.Name
	}
	if m.ToolCallID != "" {
		d["tool_call_id"] = m.ToolCallID
	}
	if m.ReasoningContent != nil {
		d["reasoning_content"] = *m.ReasoningContent
	}
	if len(m.ToolCalls) > 0 {
		calls := make([]any, len(m.ToolCalls))
		for i, tc := range m.ToolCalls {
			args := tc.Arguments
			if args == nil {
				args = map[string]any{}
			}
			typ := tc.Type
			if typ == "" {
				typ = "function"
			}
			calls[i] = map[string]any{"id": tc.ID, "type": typ, "function": map[string]any{"name": tc.Name, "arguments": args}}
		}
		d["tool_calls"] = calls
	}
	return d
}

// unmark removes the marks from a rendered prompt and returns the spans
// they enclosed.
func unmark(s string) (string, []Span, error) {
	var sb strings.Builder
	var spans []Span
	open := -1
	for {
		i := strings.IndexAny(s, openMark+closeMark)
		if i < 0 {
			break
		}
		sb.WriteString(s[:i])
		isOpen := strings.HasPrefix(s[i:], openMark)
		switch {
		case isOpen && open < 0:
			open = sb.Len()
		case !isOpen && open >= 0:
			spans = append(spans, Span{open, sb.Len()})
			open = -1
		default:
			return "", nil, ErrMarks
		}
		s = s[i+len(openMark):] // both marks are 3 bytes
	}
	if open >= 0 {
		return "", nil, ErrMarks
	}
	sb.WriteString(s)
	return sb.String(), spans, nil
}

// compileTimeout bounds parsing a template: gonja's lexer blocks for ever
// on some malformed input ("{%\ufffd0.\ufffd": a send on a channel no one
// reads), and a template comes from a file.
var compileTimeout = 10 * time.Second

// compile parses a template as transformers does: Jinja with trim_blocks
// and lstrip_blocks, in the sandbox's environment. The template can read
// no files ({% include %}, {% import %}, {% extends %} fail). A parse that
// does not finish within compileTimeout is an error (its goroutine, blocked
// in gonja, is abandoned: it holds no CPU).
func compile(src string) (*exec.Template, error) {
	type result struct {
		t   *exec.Template
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- result{nil, fmt.Errorf("the template parser failed: %v", p)}
			}
		}()
		t, err := compileNow(src)
		done <- result{t, err}
	}()
	timer := time.NewTimer(compileTimeout)
	defer timer.Stop()
	select {
	case r := <-done:
		return r.t, r.err
	case <-timer.C:
		return nil, fmt.Errorf("the template parser did not finish within %v (malformed template)", compileTimeout)
	}
}

func compileNow(src string) (*exec.Template, error) {
	cfg := config.New()
	cfg.TrimBlocks = true
	cfg.LeftStripBlocks = true
	const root = "chat_template"
	ld, err := loaders.NewShiftedLoader(root, bytes.NewReader([]byte(src)), noFiles{})
	if err != nil {
		return nil, err
	}
	t, err := exec.NewTemplate(root, cfg, ld, sandboxEnvironment())
	if err != nil {
		return nil, err
	}
	rewriteMultiply(t.Root())
	return t, nil
}

// noFiles is a template loader that loads nothing.
type noFiles struct{}

func (noFiles) Read(path string) (io.Reader, error) {
	return nil, fmt.Errorf("chat templates cannot read files (%q)", path)
}
func (noFiles) Resolve(path string) (string, error) {
	return "", fmt.Errorf("chat templates cannot read files (%q)", path)
}
func (noFiles) Inherit(string) (loaders.Loader, error) { return noFiles{}, nil }

// raiseException is the function templates call to refuse a conversation
// (transformers provides it).
func raiseException(msg string) (string, error) {
	return "", fmt.Errorf("the template refused the conversation: %s", msg)
}
