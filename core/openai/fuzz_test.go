package openai

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/text"
	"github.com/glmflash/glmflash/model/chat"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/model/tokenizer"
	"github.com/stretchr/testify/require"
)

// Any body gets a checked request or a 4xx naming what is wrong, never a
// panic or a request the runtime would refuse.
func FuzzRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stop":["\n"],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"logprobs":true,"top_logprobs":3,"seed":-1}`,
		`{"model":"m","prompt":"hello","max_tokens":3,"logprobs":2,"temperature":0.5,"top_p":0.9}`,
		`{"prompt":[1,2,3],"n":1}`, `{"prompt":[1,2,3],"n":3}`, `{"prompt":[1],"n":0}`, `{"messages":[{"role":"user","content":"x"}],"n":129}`, `{"prompt":[[1,2]]}`, `{"prompt":["a","b"]}`, `{"prompt":null}`,
		`{"messages":[{"role":"assistant","content":null}]}`, `[]`, `{`, `{"max_tokens":1e400}`,
		`{"prompt":"x","top_k":3,"min_p":0.1,"repetition_penalty":1.1,"presence_penalty":1,"frequency_penalty":-1,"logit_bias":{"5":-100},"min_tokens":2,"stop_token_ids":[1],"skip_special_tokens":false}`,
		`{"messages":[{"role":"user","content":"x"}],"store":true,"metadata":{"a":"b"},"user":"u","service_tier":"auto"}`,
	} {
		f.Add(s)
	}
	tj, _, err := randckpt.TokenizerFiles(256)
	require.NoError(f, err)
	tk, err := tokenizer.Parse(tj)
	require.NoError(f, err)
	tm, err := chat.Parse([]byte(`{"chat_template":"{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"}`), "")
	require.NoError(f, err)
	m := &text.Model{Tok: tk, Chat: tm}
	lim := limits{vocab: 256, context: 4096, defaultMaxTokens: 16}
	f.Fuzz(func(t *testing.T, body string) {
		var p params
		var e *apiError
		if strings.Contains(body, `"prompt"`) {
			var req completionRequest
			if e = decode(strings.NewReader(body), &req, DefaultMaxBodyBytes); e == nil {
				p, e = checkCompletion(context.Background(), &req, m, lim, nil)
			}
		} else {
			var req chatRequest
			if e = decode(strings.NewReader(body), &req, DefaultMaxBodyBytes); e == nil {
				p, e = checkChat(context.Background(), &req, m, lim, nil)
			}
		}
		if e != nil {
			require.True(t, e.status >= 400 && e.status < 500, "%d %s", e.status, e.msg)
			require.NotEmpty(t, e.msg)
			return
		}
		r := p.req
		require.NotEmpty(t, r.Prompt)
		require.GreaterOrEqual(t, r.MaxTokens, 1)
		require.LessOrEqual(t, len(r.Prompt)+r.MaxTokens, lim.context)
		require.NoError(t, r.Sampling.Validate())
		require.True(t, r.N >= 1 && r.N <= maxChoices, "n = %d", r.N)
		require.NoError(t, r.Processing.Validate(lim.vocab))
		require.True(t, r.MinTokens >= 0 && r.MinTokens <= r.MaxTokens)
		for _, id := range r.StopIDs {
			require.True(t, id >= 0 && int(id) < lim.vocab)
		}
		for _, id := range r.Prompt {
			require.True(t, id >= 0 && int(id) < lim.vocab)
		}
	})
}

// Any body to /tokenize or /detokenize gets a JSON answer: 200 with the
// ids (each in the vocabulary, count their number) or the text, else a
// 4xx naming what is wrong; never a panic or a 5xx.
func FuzzTokenize(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"hello"}`, `{"prompt":"a b","add_special_tokens":false,"return_token_strs":true}`,
		`{"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false}`,
		`{"messages":[{"role":"user","content":"hi"}],"continue_final_message":true}`,
		`{"tokens":[1,2,300]}`, `{"tokens":[104,105]}`, `{"prompt":"x","messages":[]}`, `{}`, `[]`, `{"prompt":7}`,
	} {
		f.Add(s)
	}
	tj, _, err := randckpt.TokenizerFiles(256)
	require.NoError(f, err)
	tk, err := tokenizer.Parse(tj)
	require.NoError(f, err)
	tm, err := chat.Parse([]byte(`{"chat_template":"{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"}`), "")
	require.NoError(f, err)
	lv := &Live{Text: &text.Model{Tok: tk, Chat: tm}, Vocab: 256, Context: 4096, DefaultMaxTokens: 16}
	h := New(Options{Model: "m", Live: func() *Live { return lv }})
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range []string{"/tokenize", "/detokenize"} {
			w := httptest.NewRecorder()
			r := httptest.NewRequest("POST", path, strings.NewReader(body))
			r.Host = "localhost"
			r.Header.Set("Content-Type", "application/json")
			h.ServeHTTP(w, r)
			var out map[string]any
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &out), "%s", w.Body.String())
			if w.Code != 200 {
				require.True(t, w.Code >= 400 && w.Code < 500, "%d %s", w.Code, w.Body.String())
				continue
			}
			if path == "/detokenize" {
				require.IsType(t, "", out["prompt"])
				continue
			}
			ids := out["tokens"].([]any)
			require.Equal(t, float64(len(ids)), out["count"])
			for _, id := range ids {
				require.True(t, id.(float64) >= 0 && id.(float64) < 256)
			}
		}
	})
}
