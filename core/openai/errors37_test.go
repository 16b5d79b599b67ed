package openai

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/core/text"
	"github.com/glmflash/glmflash/model/chat"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/model/tokenizer"
	"github.com/stretchr/testify/require"
)

// A body that is not an object, or a field of the wrong type, is a 400
// whose param and message name the field in JSON's words (issue 37: `[]`
// named no field and a Go type, `stop: 5` no field at all).
func TestDecodeErrorsNameTheField(t *testing.T) {
	for _, c := range []struct{ body, param, msg string }{
		{`[]`, "body", "body: the request must be a JSON object, got JSON array"},
		{` "x"`, "body", "body: the request must be a JSON object, got JSON string"},
		{`null`, "body", "body: the request must be a JSON object, got JSON null"},
		{`{"stop":5}`, "stop", "stop: want a string or a list of strings, got JSON number"},
		{`{"stop":{"a":1}}`, "stop", "stop: want a string or a list of strings, got JSON object"},
		{`{"stop":["a",1]}`, "stop[1]", "stop[1]: want a string, got JSON number"},
		{`{"max_tokens":"9"}`, "max_tokens", "max_tokens: want an integer, got JSON string"},
		{`{"stream":1}`, "stream", "stream: want true or false, got JSON number"},
		{`{"messages":{}}`, "messages", "messages: want a list, got JSON object"},
		{`{"stream_options":{"include_usage":"x"}}`, "stream_options.include_usage", "stream_options.include_usage: want true or false, got JSON string"},
	} {
		var req chatRequest
		e := decode(strings.NewReader(c.body), &req, DefaultMaxBodyBytes)
		require.NotNil(t, e, c.body)
		require.Equal(t, 400, e.status, c.body)
		require.Equal(t, c.param, e.param, c.body)
		require.Equal(t, c.msg, e.msg, c.body)
	}
	var req completionRequest
	require.Nil(t, decode(strings.NewReader(`{"prompt":"x","stop":["a","b"]}`), &req, DefaultMaxBodyBytes))
	require.Equal(t, stopList{"a", "b"}, req.Stop)
	require.Nil(t, decode(strings.NewReader(`{"prompt":"x","stop":"a"}`), &req, DefaultMaxBodyBytes))
	require.Equal(t, stopList{"a"}, req.Stop)
}

// A known path with another method is a 405 with Allow (issue 37: the
// catch-all route answered 404); an unknown path stays a 404.
func TestWrongMethodIs405(t *testing.T) {
	h := New(Options{Model: "m", Live: func() *Live { return nil }})
	for _, c := range []struct{ method, path, allow string }{
		{"GET", "/v1/completions", "POST"},
		{"PUT", "/v1/chat/completions", "POST"},
		{"POST", "/v1/models", "GET, HEAD"},
		{"DELETE", "/health", "GET, HEAD"},
		{"GET", "/tokenize", "POST"},
		{"GET", "/detokenize", "POST"},
		{"POST", "/v1/models/m", "GET, HEAD"},
	} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(c.method, c.path, nil)
		r.Host = "localhost" // the default guard serves a loopback Host only
		h.ServeHTTP(w, r)
		require.Equal(t, http.StatusMethodNotAllowed, w.Code, "%s %s", c.method, c.path)
		require.Equal(t, c.allow, w.Header().Get("Allow"))
		require.Contains(t, w.Body.String(), `"message":"method `+c.method+` is not allowed on `+c.path)
	}
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/v1/nothing", nil)
	r.Host = "localhost"
	h.ServeHTTP(w, r)
	require.Equal(t, 404, w.Code)
}

func bytesText(t *testing.T, vocab int) *text.Model {
	tj, _, err := randckpt.TokenizerFiles(vocab)
	require.NoError(t, err)
	tk, err := tokenizer.Parse(tj)
	require.NoError(t, err)
	tm, err := chat.Parse([]byte(`{"chat_template":"{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"}`), "")
	require.NoError(t, err)
	return &text.Model{Tok: tk, Chat: tm}
}

// Legacy completion logprobs: text_offset is each token's first byte in the
// text, also for tokens that hold part of a UTF-8 sequence (issue 37: they
// advanced by their U+FFFD rendering and pointed past the text).
func TestTextOffsetOfPartialUTF8Tokens(t *testing.T) {
	m := bytesText(t, 256) // token id = byte
	o := &response{lv: &Live{Text: m}, p: params{logprobs: true}}
	txt := "aé€😀b"
	var toks []sched.Token
	for i := 0; i < len(txt); i++ {
		toks = append(toks, sched.Token{ID: int32(txt[i])})
	}
	// in two chunks, split inside a character, as a stream delivers them
	var offs []int
	co := &choiceOut{}
	for _, part := range [][]sched.Token{toks[:3], toks[3:]} {
		lp, ok := o.logprobsOf(co, part)
		require.True(t, ok)
		offs = append(offs, lp.(legacyLogprobs).TextOffset...)
	}
	require.Len(t, offs, len(txt))
	for i, off := range offs {
		require.Equal(t, i, off, "token %d", i)
		require.Less(t, off, len(txt), "token %d points past the text", i)
		if utf8.RuneStart(txt[i]) {
			_, size := utf8.DecodeRuneInString(txt[off:])
			require.Greater(t, size, 0)
		}
	}
}

// A text prompt or a chat the tokenizer turns into an id outside the
// model's vocabulary is an error of the field the client sent (issue 37:
// the runtime named prompt_ids[i]).
func TestTextPromptOutsideVocabulary(t *testing.T) {
	m := bytesText(t, 2000)
	lim := limits{vocab: 256, context: 4096, defaultMaxTokens: 16}
	_, e := checkCompletion(context.Background(), &completionRequest{Prompt: []byte(`"the theory of the thing"`)}, m, lim, nil)
	require.NotNil(t, e)
	require.Equal(t, "prompt", e.param)
	require.Contains(t, e.msg, "prompt: the tokenizer gave token id")
	_, e = checkChat(context.Background(), &chatRequest{Messages: []chatMessage{{Role: "user", Content: []byte(`"the theory of the thing"`)}}}, m, lim, nil)
	require.NotNil(t, e)
	require.Equal(t, "messages", e.param)
	require.Contains(t, e.msg, "outside the model's vocabulary [0, 256)")
}
