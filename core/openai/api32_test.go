package openai_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/model/tokenizer"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
	"github.com/stretchr/testify/require"
)

// post sends a JSON body and decodes the JSON answer.
func post(t *testing.T, url, body string, hdr map[string]string) (*http.Response, map[string]any) {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(b, &out), "%s", b)
	return resp, out
}

func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// GET /v1/models/{id}: the served model, created set (issue 32: 0), and a
// 404 in OpenAI's shape for another id.
func TestModelsByID(t *testing.T) {
	s := start(t, nil, nil)
	ctx := context.Background()
	m, err := s.cli.Models.Get(ctx, "tiny")
	require.NoError(t, err)
	require.Equal(t, "tiny", m.ID)
	require.Equal(t, "model", string(m.Object))
	require.InDelta(t, time.Now().Unix(), m.Created, 300, "created: when the model was loaded")
	require.Equal(t, "glmflash", m.OwnedBy)
	list, err := s.cli.Models.List(ctx)
	require.NoError(t, err)
	require.Equal(t, m.Created, list.Data[0].Created)
	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(m.RawJSON()), &raw))
	require.Equal(t, 4096.0, raw["max_model_len"], "the context limit (the fixture's max_position_embeddings)")
	require.Equal(t, 256.0, raw["vocab_size"], "the fixture's vocabulary")

	_, err = s.cli.Models.Get(ctx, "gpt-4")
	e := apiErr(t, err)
	require.Equal(t, 404, e.StatusCode)
	require.Equal(t, "model_not_found", e.Code)
	require.Equal(t, "model", e.Param)
	require.Equal(t, "invalid_request_error", e.Type)
	// A served name with a slash (org/name, as vLLM's) is one id.
	_, err = s.cli.Models.Get(ctx, "org/tiny")
	require.Equal(t, 404, apiErr(t, err).StatusCode)
}

// The sampling fields through the official client, checked exactly where
// the scheduler implements them today: top_k 1 and sampled is the greedy
// output; stop_token_ids end at the first of them (finish_reason stop, its
// text not emitted).
func TestSamplingFieldsEndToEnd(t *testing.T) {
	s := start(t, nil, nil)
	ctx := context.Background()
	p := chatParams("Hello there", 20)
	p.Logprobs = openai.Bool(true)
	greedy, err := s.cli.Chat.Completions.New(ctx, p)
	require.NoError(t, err)
	want := greedy.Choices[0].Message.Content

	p = chatParams("Hello there", 20)
	p.Temperature = openai.Float(1)
	p.Seed = openai.Int(3)
	res, err := s.cli.Chat.Completions.New(ctx, p, option.WithJSONSet("top_k", 1))
	require.NoError(t, err)
	require.Equal(t, want, res.Choices[0].Message.Content, "top_k 1: only the most likely token")
	res, err = s.cli.Chat.Completions.New(ctx, p)
	require.NoError(t, err)
	require.NotEqual(t, want, res.Choices[0].Message.Content, "without top_k the seed samples another text (else the check above checks nothing)")

	// The token ids (one byte each) of the greedy output.
	var ids []int
	for _, c := range greedy.Choices[0].Logprobs.Content {
		require.Len(t, c.Bytes, 1)
		ids = append(ids, int(c.Bytes[0]))
	}
	k := 5
	first := k
	for i := range k {
		if ids[i] == ids[k] {
			first = i
			break
		}
	}
	p = chatParams("Hello there", 20)
	res, err = s.cli.Chat.Completions.New(ctx, p, option.WithJSONSet("stop_token_ids", []int{ids[k], 255 - ids[k]%2}))
	require.NoError(t, err)
	require.Equal(t, "stop", res.Choices[0].FinishReason)
	var pre []byte
	for _, id := range ids[:first] {
		pre = append(pre, byte(id))
	}
	require.Equal(t, tokenizer.Lossy(pre), res.Choices[0].Message.Content)
	require.Equal(t, int64(first+1), res.Usage.CompletionTokens, "the stop id counts, its text is not emitted")

	// Out of range through the client: a 400 naming the field.
	_, err = s.cli.Chat.Completions.New(ctx, chatParams("x", 4), option.WithJSONSet("min_p", 1.5))
	e := apiErr(t, err)
	require.Equal(t, 400, e.StatusCode)
	require.Equal(t, "min_p", e.Param)
	_, err = s.cli.Chat.Completions.New(ctx, chatParams("x", 4), option.WithJSONSet("logit_bias", map[string]float64{"300": 1}))
	require.Equal(t, `logit_bias["300"]`, apiErr(t, err).Param)

	// store, metadata, user and service_tier change nothing.
	p = chatParams("Hello there", 20)
	p.Store = openai.Bool(true)
	p.Metadata = shared.Metadata{"app": "test"}
	p.User = openai.String("u-1")
	p.ServiceTier = openai.ChatCompletionNewParamsServiceTierAuto
	res, err = s.cli.Chat.Completions.New(ctx, p)
	require.NoError(t, err)
	require.Equal(t, want, res.Choices[0].Message.Content)
	cres, err := s.cli.Completions.New(ctx, openai.CompletionNewParams{Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("abc")},
		MaxTokens: openai.Int(3), User: openai.String("u-2")}, option.WithJSONSet("store", false), option.WithJSONSet("service_tier", "flex"))
	require.NoError(t, err)
	require.Equal(t, int64(3), cres.Usage.CompletionTokens)
}

// A client's X-Request-Id is the request's id (the response's id ends with
// it) and is echoed, whole and streamed; without one the server's is
// echoed; a bad one is a 400 naming the header; one in flight a 409.
func TestClientRequestID(t *testing.T) {
	s := start(t, func(c *config.Config) { c.Runtime.Slots = 2 }, nil)
	ctx := context.Background()
	var hr *http.Response
	res, err := s.cli.Chat.Completions.New(ctx, chatParams("x", 2), option.WithHeader("X-Request-Id", "client-id-1"), option.WithResponseInto(&hr))
	require.NoError(t, err)
	require.Equal(t, "chatcmpl-client-id-1", res.ID)
	require.Equal(t, "client-id-1", hr.Header.Get("X-Request-Id"))

	res, err = s.cli.Chat.Completions.New(ctx, chatParams("x", 2), option.WithResponseInto(&hr))
	require.NoError(t, err)
	require.NotEmpty(t, hr.Header.Get("X-Request-Id"))
	require.Equal(t, "chatcmpl-"+hr.Header.Get("X-Request-Id"), res.ID, "the server's own id, echoed")

	cres, err := s.cli.Completions.New(ctx, openai.CompletionNewParams{Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("abc")}, MaxTokens: openai.Int(2)},
		option.WithHeader("X-Request-Id", "c-2"), option.WithResponseInto(&hr))
	require.NoError(t, err)
	require.Equal(t, "cmpl-c-2", cres.ID)
	require.Equal(t, "c-2", hr.Header.Get("X-Request-Id"))

	// A stream holding an id: the same id again is a 409 (Retry-After not
	// set: the client chose the id), another id runs.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st := s.cli.Chat.Completions.NewStreaming(sctx, chatParams("long", 3000), option.WithHeader("X-Request-Id", "held"), option.WithResponseInto(&hr))
	require.True(t, st.Next())
	require.Equal(t, "held", hr.Header.Get("X-Request-Id"))
	require.Equal(t, "chatcmpl-held", st.Current().ID)
	_, err = s.cli.Chat.Completions.New(ctx, chatParams("x", 2), option.WithHeader("X-Request-Id", "held"))
	e := apiErr(t, err)
	require.Equal(t, 409, e.StatusCode)
	require.Equal(t, "duplicate_request_id", e.Code)
	require.Equal(t, "X-Request-Id", e.Param)
	cancel()
	st.Close()

	for id, msg := range map[string]string{
		"has space":              "character 3 is not printable ASCII",
		strings.Repeat("a", 129): "longer than 128 characters",
		"caf\u00e9":              "character 3 is not printable ASCII",
	} {
		r, body := post(t, s.base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":1}`, map[string]string{"X-Request-Id": id})
		require.Equal(t, 400, r.StatusCode, id)
		eb := body["error"].(map[string]any)
		require.Equal(t, "X-Request-Id", eb["param"], id)
		require.Contains(t, eb["message"], msg, id)
	}
}

// Retry-After comes with every 429 and 503 (issue 32: none).
func TestRetryAfter(t *testing.T) {
	gate := make(chan struct{})
	s := start(t, func(c *config.Config) { c.Runtime.Slots = 1; c.Runtime.MaxQueue = -1 }, gate)
	r, _ := post(t, s.base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":1}`, nil)
	require.Equal(t, 503, r.StatusCode, "loading")
	require.Equal(t, "5", r.Header.Get("Retry-After"))
	hr, _ := get(t, s.base+"/health")
	require.Equal(t, 503, hr.StatusCode)
	require.Equal(t, "5", hr.Header.Get("Retry-After"))
	close(gate)
	<-s.srv.Ready()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := s.cli.Chat.Completions.NewStreaming(ctx, chatParams("long", 3000))
	require.True(t, st.Next())
	r, body := post(t, s.base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":1}`, nil)
	require.Equal(t, 429, r.StatusCode, "%v", body)
	require.Equal(t, "1", r.Header.Get("Retry-After"))
	cancel()
	st.Close()
}

// POST /tokenize and /detokenize in vLLM's shapes: a prompt (with the
// tokenizer's special tokens by default) or messages (rendered as a chat
// request's), the ids, their count, the context limit and on request the
// token strings; /detokenize gives the text back.
func TestTokenizeDetokenize(t *testing.T) {
	s := start(t, nil, nil)
	r, out := post(t, s.base+"/tokenize", `{"model":"tiny","prompt":"Hello"}`, nil)
	require.Equal(t, 200, r.StatusCode, "%v", out)
	require.NotEmpty(t, r.Header.Get("X-Request-Id"))
	require.Equal(t, []any{72.0, 101.0, 108.0, 108.0, 111.0}, out["tokens"], "one byte per token")
	require.Equal(t, 5.0, out["count"])
	require.Equal(t, 4096.0, out["max_model_len"])
	require.Nil(t, out["token_strs"])
	_, out = post(t, s.base+"/tokenize", `{"prompt":"a b","return_token_strs":true,"add_special_tokens":false}`, nil)
	require.Equal(t, []any{"a", "\u0120", "b"}, out["token_strs"], "tokenizer.json's spellings (byte-level: Ġ is a space)")

	// Messages: the ids a chat request with them runs (its usage says how
	// many), and fewer without the generation prompt.
	msgs := `"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello there"}]`
	_, out = post(t, s.base+"/tokenize", `{`+msgs+`}`, nil)
	res, err := s.cli.Chat.Completions.New(context.Background(), chatParams("Hello there", 1))
	require.NoError(t, err)
	require.Equal(t, float64(res.Usage.PromptTokens), out["count"])
	n := out["count"].(float64)
	_, out = post(t, s.base+"/tokenize", `{`+msgs+`,"add_generation_prompt":false}`, nil)
	require.Equal(t, n-float64(len("assistant:")), out["count"])
	ids := out["tokens"].([]any)
	b, err := json.Marshal(ids)
	require.NoError(t, err)
	_, out = post(t, s.base+"/detokenize", `{"model":"tiny","tokens":`+string(b)+`}`, nil)
	require.Equal(t, "system: Be brief.\nuser: Hello there\n", out["prompt"])

	for _, c := range []struct{ path, body, param string }{
		{"/tokenize", `{}`, "prompt"},
		{"/tokenize", `{"prompt":"a",` + msgs + `}`, "messages"},
		{"/tokenize", `{"prompt":["a"]}`, "prompt"},
		{"/tokenize", `{"prompt":"a","add_generation_prompt":true}`, "add_generation_prompt"},
		{"/tokenize", `{` + msgs + `,"continue_final_message":true}`, "continue_final_message"},
		{"/tokenize", `{"messages":[{"role":"wizard","content":"x"}]}`, "messages[0].role"},
		{"/tokenize", `{"prompt":"a","bogus":1}`, "bogus"},
		{"/detokenize", `{}`, "tokens"},
		{"/detokenize", `{"tokens":[1,256]}`, "tokens[1]"},
		{"/detokenize", `{"tokens":[1,-1]}`, "tokens[1]"},
		{"/detokenize", `{"tokens":"ab"}`, "tokens"},
	} {
		r, out := post(t, s.base+c.path, c.body, nil)
		require.Equal(t, 400, r.StatusCode, c.body)
		require.Equal(t, c.param, out["error"].(map[string]any)["param"], c.body)
	}
	r, out = post(t, s.base+"/tokenize", `{"model":"gpt-4","prompt":"a"}`, nil)
	require.Equal(t, 404, r.StatusCode)
	require.Equal(t, "model_not_found", out["error"].(map[string]any)["code"])
}

// /metrics on the HTTP API's port (as vLLM), a stop string's finish counted
// as stop (issue 32: abort); server.http_metrics false leaves it out.
func TestMetricsOnTheHTTPPort(t *testing.T) {
	s := start(t, nil, nil)
	ctx := context.Background()
	full, err := s.cli.Chat.Completions.New(ctx, chatParams("Hello there", 24))
	require.NoError(t, err)
	r := []rune(full.Choices[0].Message.Content)
	require.Greater(t, len(r), 10)
	p := chatParams("Hello there", 24)
	p.Stop = openai.ChatCompletionNewParamsStopUnion{OfString: openai.String(string(r[5:8]))}
	res, err := s.cli.Chat.Completions.New(ctx, p)
	require.NoError(t, err)
	require.Equal(t, "stop", res.Choices[0].FinishReason)
	counts := func() map[string]float64 {
		resp, body := get(t, s.base+"/metrics")
		require.Equal(t, 200, resp.StatusCode)
		out := map[string]float64{}
		for _, l := range strings.Split(body, "\n") {
			if rest, ok := strings.CutPrefix(l, `glmflash_requests_total{status="`); ok {
				st, v, _ := strings.Cut(rest, `"} `)
				f, err := strconv.ParseFloat(v, 64)
				require.NoError(t, err)
				out[st] = f
			}
		}
		return out
	}
	require.Eventually(t, func() bool { return counts()["stop"] == 1 }, 10*time.Second, 10*time.Millisecond, "%v", counts())
	require.Equal(t, 1.0, counts()["length"])
	require.Zero(t, counts()["abort"])

	off := start(t, func(c *config.Config) { c.Server.HTTPMetrics = false }, nil)
	resp, _ := get(t, off.base+"/metrics")
	require.Equal(t, 404, resp.StatusCode)
}

// The Node `openai` package's script (tests/node/openai.test.mjs) against
// the server: make test-node installs the package (npm ci, from the
// committed package-lock.json) and sets GLMFLASH_NODE_TEST=1, which makes a
// missing node or package a failure; elsewhere the test is skipped, saying
// why.
func TestNodeOpenAIPackage(t *testing.T) {
	required := os.Getenv("GLMFLASH_NODE_TEST") == "1"
	skip := func(why string) {
		if required {
			t.Fatal(why)
		}
		t.Skip("SKIPPED: " + why)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		skip("node is not installed (the Node openai script test, tests/node)")
	}
	dir, err := filepath.Abs("../../tests/node")
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai", "package.json")); err != nil {
		skip("the openai npm package is not installed in tests/node: make test-node (npm ci) installs it")
	}
	// the presets' GLM-4.5 chat template (tools, the tool role, thinking)
	// and parsers, on the tiny fixture's weights
	s := startGLM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "openai.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GLMFLASH_BASE_URL="+s.base+"/v1", "GLMFLASH_MODEL=tiny")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "checks passed")
	t.Logf("%s", out)
}

// The logits processors through the official client, now that the
// scheduler applies them, checked exactly: logit_bias +100 forces a token
// and −100 bans the greedy pick; min_tokens holds a stop id off; a
// repetition penalty of 100 under greedy repeats no token of the prompt or
// the output; presence and frequency penalties change the greedy output.
func TestProcessingFieldsEndToEnd(t *testing.T) {
	s := start(t, nil, nil)
	ctx := context.Background()
	greedyIDs := func(res *openai.ChatCompletion) []int {
		var ids []int
		for _, c := range res.Choices[0].Logprobs.Content {
			require.Len(t, c.Bytes, 1)
			ids = append(ids, int(c.Bytes[0]))
		}
		return ids
	}
	p := chatParams("Hello there", 16)
	p.Logprobs = openai.Bool(true)
	base, err := s.cli.Chat.Completions.New(ctx, p)
	require.NoError(t, err)
	ids := greedyIDs(base)

	res, err := s.cli.Chat.Completions.New(ctx, p, option.WithJSONSet("logit_bias", map[string]float64{"65": 100}))
	require.NoError(t, err)
	require.Equal(t, strings.Repeat("A", 16), res.Choices[0].Message.Content, "+100 forces id 65 (A)")

	res, err = s.cli.Chat.Completions.New(ctx, p, option.WithJSONSet("logit_bias", map[string]float64{strconv.Itoa(ids[0]): -100}))
	require.NoError(t, err)
	require.NotEqual(t, ids[0], greedyIDs(res)[0], "−100 bans the greedy first token")

	// min_tokens with the greedy output's first token as a stop id: without
	// it the request stops at once; with it, not before 6 tokens, none of
	// which is that id.
	res, err = s.cli.Chat.Completions.New(ctx, p, option.WithJSONSet("stop_token_ids", []int{ids[0]}))
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Usage.CompletionTokens)
	require.Equal(t, "stop", res.Choices[0].FinishReason)
	res, err = s.cli.Chat.Completions.New(ctx, p, option.WithJSONSet("stop_token_ids", []int{ids[0]}), option.WithJSONSet("min_tokens", 6))
	require.NoError(t, err)
	require.GreaterOrEqual(t, res.Usage.CompletionTokens, int64(6))
	got := greedyIDs(res)
	for i := range 6 {
		require.NotEqual(t, ids[0], got[i], "token %d", i)
	}

	// repetition_penalty 100: no token of the prompt or of the output so far
	// is the greedy pick while another is left.
	tk, err := s.cli.Chat.Completions.New(ctx, chatParams("Hello there", 1))
	require.NoError(t, err)
	prompt := "system: Be brief.\nuser: Hello there\nassistant:"
	require.Equal(t, int64(len(prompt)), tk.Usage.PromptTokens)
	res, err = s.cli.Chat.Completions.New(ctx, p, option.WithJSONSet("repetition_penalty", 100))
	require.NoError(t, err)
	seen := map[int]bool{}
	for i := range len(prompt) {
		seen[int(prompt[i])] = true
	}
	for i, id := range greedyIDs(res) {
		require.False(t, seen[id], "token %d (id %d) repeats", i, id)
		seen[id] = true
	}

	for _, field := range []string{"presence_penalty", "frequency_penalty"} {
		p := chatParams("Hello there", 40)
		long, err := s.cli.Chat.Completions.New(ctx, p)
		require.NoError(t, err)
		res, err := s.cli.Chat.Completions.New(ctx, p, option.WithJSONSet(field, 2))
		require.NoError(t, err)
		require.NotEqual(t, long.Choices[0].Message.Content, res.Choices[0].Message.Content, field)
		distinct := func(s string) int {
			m := map[rune]bool{}
			for _, r := range s {
				m[r] = true
			}
			return len(m)
		}
		require.GreaterOrEqual(t, distinct(res.Choices[0].Message.Content), distinct(long.Choices[0].Message.Content), "%s 2 repeats no more", field)
	}
}

// /tokenize of messages renders them as a chat request does, with its tools
// and chat_template_kwargs (vLLM's TokenizeChatRequest): the count is the
// chat request's prompt_tokens, and the tools and enable_thinking change it.
func TestTokenizeWithTools(t *testing.T) {
	s := startGLM(t)
	tool := `{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}`
	msgs := `"messages":[{"role":"user","content":"Weather in Beijing?"}]`
	count := func(body string) float64 {
		r, out := post(t, s.base+"/tokenize", body, nil)
		require.Equal(t, 200, r.StatusCode, "%v", out)
		return out["count"].(float64)
	}
	plain := count(`{` + msgs + `}`)
	withTools := count(`{` + msgs + `,"tools":[` + tool + `]}`)
	noThink := count(`{` + msgs + `,"tools":[` + tool + `],"chat_template_kwargs":{"enable_thinking":false}}`)
	require.Greater(t, withTools, plain, "the template writes the tools into the system turn")
	require.NotEqual(t, withTools, noThink, "enable_thinking false ends the prompt with <think></think>")
	res, err := s.cli.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: "tiny", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Weather in Beijing?")}, MaxTokens: openai.Int(1),
	}, option.WithJSONSet("tools", []any{json.RawMessage(tool)}))
	require.NoError(t, err)
	require.Equal(t, withTools, float64(res.Usage.PromptTokens))

	for _, c := range []struct{ body, param string }{
		{`{` + msgs + `,"tools":[{"type":"code"}]}`, "tools[0].type"},
		{`{` + msgs + `,"chat_template_kwargs":[1]}`, "chat_template_kwargs"},
		{`{"prompt":"a","tools":[` + tool + `]}`, "tools"},
		{`{"prompt":"a","chat_template_kwargs":{}}`, "chat_template_kwargs"},
	} {
		r, out := post(t, s.base+"/tokenize", c.body, nil)
		require.Equal(t, 400, r.StatusCode, c.body)
		require.Equal(t, c.param, out["error"].(map[string]any)["param"], c.body)
	}
}
