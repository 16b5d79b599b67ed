package chat

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

var sources = map[string]string{
	"qwen3":       "../tokenizer/testdata/qwen3/tokenizer_config.json",
	"deepseek_v3": "../tokenizer/testdata/deepseek_v3/tokenizer_config.json",
	"preset":      "../randckpt/tokenizer_config.json",
}

// The golden renders were made by @huggingface/jinja (tools/oracle/templates.js).
func TestRenderMatchesHuggingFaceJinja(t *testing.T) {
	b, err := os.ReadFile("testdata/golden.json")
	require.NoError(t, err)
	var g struct {
		Cases []struct {
			Template string `json:"template"`
			Messages []struct {
				Message
				ToolCalls []struct {
					ID       string `json:"id"`
					Type     string `json:"type"`
					Function struct {
						Name      string         `json:"name"`
						Arguments map[string]any `json:"arguments"`
					} `json:"function"`
				} `json:"tool_calls"`
			} `json:"messages"`
			Tools               []any          `json:"tools"`
			Kwargs              map[string]any `json:"kwargs"`
			AddGenerationPrompt bool           `json:"add_generation_prompt"`
			Rendered            string         `json:"rendered"`
		} `json:"cases"`
	}
	require.NoError(t, json.Unmarshal(b, &g))
	require.NotEmpty(t, g.Cases)
	tmpls := map[string]*Template{}
	for name, p := range sources {
		cfg, err := os.ReadFile(p)
		require.NoError(t, err)
		tmpls[name], err = Parse(cfg, "")
		require.NoError(t, err, name)
	}
	seen := map[string]int{}
	tools := 0
	for i, c := range g.Cases {
		msgs := make([]Message, len(c.Messages))
		for j, m := range c.Messages {
			msgs[j] = m.Message
			for _, tc := range m.ToolCalls {
				msgs[j].ToolCalls = append(msgs[j].ToolCalls, ToolCall{ID: tc.ID, Type: tc.Type, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
			}
		}
		if c.Tools != nil || c.Kwargs != nil {
			tools++
		}
		got, _, err := tmpls[c.Template].RenderWith(context.Background(), msgs, Options{AddGenerationPrompt: c.AddGenerationPrompt, Tools: c.Tools, Kwargs: c.Kwargs}, nil)
		require.NoError(t, err, "case %d", i)
		require.Equal(t, c.Rendered, got, "case %d (%s, add_generation_prompt=%v)", i, c.Template, c.AddGenerationPrompt)
		seen[c.Template]++
	}
	require.Len(t, seen, len(sources))
	require.NotZero(t, tools, "cases with tools and chat_template_kwargs")
}

func TestTokensAndSources(t *testing.T) {
	cfg, err := os.ReadFile(sources["deepseek_v3"])
	require.NoError(t, err)
	tm, err := Parse(cfg, "")
	require.NoError(t, err)
	require.Equal(t, "<｜begin▁of▁sentence｜>", tm.BOSToken, "an AddedToken object's content")
	require.Equal(t, "<｜end▁of▁sentence｜>", tm.EOSToken)

	// chat_template.jinja wins over tokenizer_config.json.
	tm, err = Parse(cfg, "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}")
	require.NoError(t, err)
	out, err := tm.Render(context.Background(), []Message{{Role: "user", Content: "x"}}, true)
	require.NoError(t, err)
	require.Equal(t, "[user:x]", out)

	// A list of named templates: "default".
	tm, err = Parse([]byte(`{"chat_template":[{"name":"tool_use","template":"T"},{"name":"default","template":"D{{ eos_token }}"}],"eos_token":"</s>"}`), "")
	require.NoError(t, err)
	out, err = tm.Render(context.Background(), nil, false)
	require.NoError(t, err)
	require.Equal(t, "D</s>", out)

	dir := t.TempDir()
	_, err = Load(dir)
	require.ErrorIs(t, err, ErrNoTemplate)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"chat_template": 5}`), 0o644))
	_, err = Load(dir)
	require.ErrorContains(t, err, "chat_template: want a string")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"chat_template": "{% if %}"}`), 0o644))
	_, err = Load(dir)
	require.ErrorContains(t, err, "chat_template")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"eos_token": 5, "chat_template": "x"}`), 0o644))
	_, err = Load(dir)
	require.ErrorContains(t, err, "eos_token")
}

func TestTemplatesCannotReadFilesAndCanRefuse(t *testing.T) {
	_, err := Parse([]byte(`{"chat_template": "{% include '/etc/passwd' %}"}`), "")
	require.ErrorContains(t, err, "cannot read files")
	tm, err := Parse([]byte(`{"chat_template": "{% if messages|length > 1 %}{{ raise_exception('one message only') }}{% endif %}ok"}`), "")
	require.NoError(t, err)
	_, err = tm.Render(context.Background(), []Message{{Role: "user", Content: "a"}, {Role: "user", Content: "b"}}, false)
	require.ErrorContains(t, err, "one message only")
}
