// Package chat renders a checkpoint's chat template (the Jinja
// "chat_template" of tokenizer_config.json, or chat_template.jinja) into
// the prompt text the model was trained on, as transformers'
// apply_chat_template does: with messages, add_generation_prompt and the
// bos_token / eos_token strings; tools are left empty.
package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/glmflash/glmflash/internal/regular"
	"github.com/nikolalohinski/gonja/v2"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// ErrNoTemplate is returned by Load for a checkpoint without a chat template.
var ErrNoTemplate = errors.New("chat: the checkpoint has no chat template (tokenizer_config.json chat_template or chat_template.jinja)")

// maxConfigBytes bounds tokenizer_config.json and chat_template.jinja.
const maxConfigBytes = 16 << 20

// Message is one turn of a conversation.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Template is a compiled chat template; it is safe for concurrent use.
type Template struct {
	tmpl     *exec.Template
	Source   string // the template text
	BOSToken string // "" when the tokenizer has none
	EOSToken string
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
	t := &Template{}
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
	if _, err := t.Render([]Message{{Role: "user", Content: "hi"}}, true); err != nil {
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
// appends the start of the assistant's turn.
func (t *Template) Render(msgs []Message, addGenerationPrompt bool) (string, error) {
	list := make([]any, len(msgs))
	for i, m := range msgs {
		list[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	out, err := t.tmpl.ExecuteToString(exec.NewContext(map[string]any{
		"messages":              list,
		"add_generation_prompt": addGenerationPrompt,
		"bos_token":             t.BOSToken,
		"eos_token":             t.EOSToken,
		"tools":                 nil,
		"raise_exception":       raiseException,
	}))
	if err != nil {
		return "", fmt.Errorf("chat template: %w", err)
	}
	return out, nil
}

// compile parses a template as transformers does: Jinja with trim_blocks
// and lstrip_blocks. The template can read no files ({% include %} and
// {% extends %} fail).
func compile(src string) (*exec.Template, error) {
	cfg := config.New()
	cfg.TrimBlocks = true
	cfg.LeftStripBlocks = true
	const root = "chat_template"
	ld, err := loaders.NewShiftedLoader(root, bytes.NewReader([]byte(src)), noFiles{})
	if err != nil {
		return nil, err
	}
	return exec.NewTemplate(root, cfg, ld, gonja.DefaultEnvironment)
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
