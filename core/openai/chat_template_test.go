package openai_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/text"
	"github.com/glmflash/glmflash/model/chat"
	"github.com/glmflash/glmflash/model/tokenizer"
	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/require"
)

// A chat template that fails its load-time probe no longer makes the
// checkpoint unservable: completions are served, chat requests are
// refused with the template's error, and /v1/models says why.
func TestBrokenTemplateServesCompletions(t *testing.T) {
	_, perr := chat.Parse([]byte(`{"chat_template": "{{ raise_exception('this template is broken') }}"}`), "")
	require.Error(t, perr)
	s := startText(t, nil, nil, func(tk *tokenizer.Tokenizer) *text.Model {
		return &text.Model{Tok: tk, ChatError: perr}
	})
	ctx := context.Background()
	res, err := s.cli.Completions.New(ctx, openai.CompletionNewParams{Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Hello")}, MaxTokens: openai.Int(4), Temperature: openai.Float(0)})
	require.NoError(t, err)
	require.Len(t, res.Choices, 1)

	_, err = s.cli.Chat.Completions.New(ctx, chatParams("Hello", 4))
	var ae *openai.Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, 400, ae.StatusCode)
	require.Contains(t, ae.Message, "this template is broken")

	resp, err := http.Get(s.base + "/v1/models")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var models struct {
		Data []map[string]any `json:"data"`
	}
	require.NoError(t, json.Unmarshal(b, &models))
	require.Len(t, models.Data, 1)
	require.Equal(t, false, models.Data[0]["chat"])
	require.Contains(t, models.Data[0]["chat_template_error"], "this template is broken")
}

// A template bomb in one request is an error for that request; the server
// goes on serving (before the sandbox, the recursion was a fatal Go stack
// overflow that ended every stream).
func TestTemplateBombIsOneRequestsError(t *testing.T) {
	const bomb = `{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{% for x in messages %}{% if x.content == 'boom' %}{{ m(0) }}{% endif %}{{ x.role }}: {{ x.content }}\n{% endfor %}assistant:`
	tm, err := chat.Parse([]byte(`{"chat_template": `+strings.ReplaceAll(quote(bomb), `\\n`, `\n`)+`}`), "")
	require.NoError(t, err)
	s := startText(t, nil, nil, func(tk *tokenizer.Tokenizer) *text.Model { return &text.Model{Tok: tk, Chat: tm} })
	ctx := context.Background()
	_, err = s.cli.Chat.Completions.New(ctx, chatParams("boom", 4))
	var ae *openai.Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, 400, ae.StatusCode)
	require.Contains(t, ae.Message, "nested more than 64 deep")
	res, err := s.cli.Chat.Completions.New(ctx, chatParams("Hello", 4))
	require.NoError(t, err)
	require.NotEmpty(t, res.Choices)
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
