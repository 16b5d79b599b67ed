package openai_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/serve"
	"github.com/glmflash/glmflash/core/text"
	"github.com/glmflash/glmflash/kernels/parallel"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/chat"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/model/tokenizer"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(parallel.HelperFunc))
}

const fixture = "../../testdata/glm5next-tiny-a/checkpoint"

// The tiny fixture has 256 ids: a bytes-only tokenizer fits it, and a chat
// template without special tokens.
const template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"

type server struct {
	srv    *serve.Server
	cli    openai.Client
	base   string
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, edit func(*config.Config), gate <-chan struct{}) *server {
	t.Helper()
	return startText(t, edit, gate, nil)
}

// startText is start with the text model mk makes of the tokenizer (nil:
// the tokenizer and the test template).
func startText(t *testing.T, edit func(*config.Config), gate <-chan struct{}, mk func(*tokenizer.Tokenizer) *text.Model) *server {
	t.Helper()
	cfg := config.Default()
	cfg.Model.Dir, cfg.Model.Preset = fixture, ""
	cfg.Model.Name = "tiny"
	cfg.Server.GRPCAddr, cfg.Server.HTTPAddr, cfg.Server.MetricsAddr = "127.0.0.1:0", "127.0.0.1:0", ""
	cfg.Server.DrainTimeout = 2 * time.Second
	cfg.Runtime.Slots = 2
	if edit != nil {
		edit(cfg)
	}
	tj, _, err := randckpt.TokenizerFiles(256)
	require.NoError(t, err)
	tk, err := tokenizer.Parse(tj)
	require.NoError(t, err)
	tm, err := chat.Parse([]byte(`{"chat_template": "`+strings.ReplaceAll(template, "\n", `\n`)+`"}`), "")
	require.NoError(t, err)
	txt := &text.Model{Tok: tk, Chat: tm}
	if mk != nil {
		txt = mk(tk)
	}
	srv, err := serve.New(cfg, serve.Options{Log: zerolog.Nop(), Load: func(ctx context.Context) (*serve.LoadedModel, error) {
		if gate != nil {
			<-gate
		}
		ck, err := model.Open(cfg.Model.Dir)
		if err != nil {
			return nil, err
		}
		return &serve.LoadedModel{Config: ck.Config(), Weights: ck, Source: cfg.Model.Dir, Close: ck.Close, Text: txt}, nil
	}})
	require.NoError(t, err)
	require.NoError(t, srv.Listen())
	ctx, cancel := context.WithCancel(context.Background())
	s := &server{srv: srv, cancel: cancel, done: make(chan error, 1), base: "http://" + srv.HTTPAddr()}
	go func() { s.done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-s.done)
	})
	s.cli = openai.NewClient(option.WithBaseURL(s.base+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	if gate == nil {
		<-srv.Ready()
	}
	return s
}

func chatParams(user string, maxTok int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:       "tiny",
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage(user)},
		MaxTokens:   openai.Int(maxTok),
		Temperature: openai.Float(0),
	}
}

func TestChatAndCompletions(t *testing.T) {
	s := start(t, nil, nil)
	ctx := context.Background()

	// Non-streaming chat: greedy, so the streaming run must give the same text.
	res, err := s.cli.Chat.Completions.New(ctx, chatParams("Hello there", 24))
	require.NoError(t, err)
	require.Len(t, res.Choices, 1)
	full := res.Choices[0].Message.Content
	require.NotEmpty(t, full)
	require.Equal(t, "length", res.Choices[0].FinishReason)
	require.Equal(t, "assistant", string(res.Choices[0].Message.Role))
	require.True(t, strings.HasPrefix(res.ID, "chatcmpl-"))
	require.NotZero(t, res.Created)
	require.Equal(t, int64(24), res.Usage.CompletionTokens)
	require.Equal(t, int64(len("system: Be brief.\nuser: Hello there\nassistant:")), res.Usage.PromptTokens, "one token per byte")
	require.Equal(t, res.Usage.PromptTokens+24, res.Usage.TotalTokens)

	p := chatParams("Hello there", 24)
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	st := s.cli.Chat.Completions.NewStreaming(ctx, p)
	var sb strings.Builder
	var reason string
	var usage *openai.CompletionUsage
	chunks := 0
	for st.Next() {
		c := st.Current()
		chunks++
		if len(c.Choices) > 0 {
			sb.WriteString(c.Choices[0].Delta.Content)
			if c.Choices[0].FinishReason != "" {
				reason = c.Choices[0].FinishReason
			}
		}
		if c.Usage.TotalTokens > 0 {
			u := c.Usage
			usage = &u
		}
	}
	require.NoError(t, st.Err())
	require.Greater(t, chunks, 3, "streamed in pieces")
	require.Equal(t, full, sb.String())
	require.Equal(t, "length", reason)
	require.NotNil(t, usage)
	require.Equal(t, int64(24), usage.CompletionTokens)

	// A stop string from the middle of the text (several tokens long): the
	// output ends right before it; finish_reason stop.
	r := []rune(full)
	require.Greater(t, len(r), 10)
	stop := string(r[5:8])
	p = chatParams("Hello there", 24)
	p.Stop = openai.ChatCompletionNewParamsStopUnion{OfStringArray: []string{stop, "zzzz-never"}}
	res, err = s.cli.Chat.Completions.New(ctx, p)
	require.NoError(t, err)
	require.Equal(t, full[:strings.Index(full, stop)], res.Choices[0].Message.Content)
	require.Equal(t, "stop", res.Choices[0].FinishReason)
	require.Less(t, res.Usage.CompletionTokens, int64(24))

	// Streaming with the same stop string gives the same text.
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	st = s.cli.Chat.Completions.NewStreaming(ctx, p)
	sb.Reset()
	for st.Next() {
		if c := st.Current(); len(c.Choices) > 0 {
			sb.WriteString(c.Choices[0].Delta.Content)
		}
	}
	require.NoError(t, st.Err())
	require.Equal(t, res.Choices[0].Message.Content, sb.String())

	// Completions: a text prompt and the same prompt as token ids agree.
	prompt := "The quick brown fox"
	cres, err := s.cli.Completions.New(ctx, openai.CompletionNewParams{
		Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
		MaxTokens: openai.Int(12), Temperature: openai.Float(0), Logprobs: openai.Int(3),
	})
	require.NoError(t, err)
	require.Equal(t, int64(len(prompt)), cres.Usage.PromptTokens)
	require.Equal(t, "text_completion", string(cres.Object))
	lp := cres.Choices[0].Logprobs
	require.Len(t, lp.TokenLogprobs, 12)
	require.Len(t, lp.TopLogprobs, 12)
	for i, v := range lp.TokenLogprobs {
		require.LessOrEqual(t, v, 0.0)
		// (keyed by token text: byte tokens that read as U+FFFD share a key)
		require.NotEmpty(t, lp.TopLogprobs[i])
		require.LessOrEqual(t, len(lp.TopLogprobs[i]), 3)
	}
	ids := make([]int64, len(prompt))
	for i := range prompt {
		ids[i] = int64(prompt[i])
	}
	var ctext strings.Builder
	cst := s.cli.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: ids},
		MaxTokens: openai.Int(12), Temperature: openai.Float(0),
	})
	for cst.Next() {
		if c := cst.Current(); len(c.Choices) > 0 {
			ctext.WriteString(c.Choices[0].Text)
		}
	}
	require.NoError(t, cst.Err())
	require.Equal(t, cres.Choices[0].Text, ctext.String())

	// Chat logprobs.
	p = chatParams("Hi", 5)
	p.Logprobs = openai.Bool(true)
	p.TopLogprobs = openai.Int(2)
	res, err = s.cli.Chat.Completions.New(ctx, p)
	require.NoError(t, err)
	require.Len(t, res.Choices[0].Logprobs.Content, 5)
	require.Len(t, res.Choices[0].Logprobs.Content[0].TopLogprobs, 2)

	// Models and health.
	ms, err := s.cli.Models.List(ctx)
	require.NoError(t, err)
	require.Equal(t, "tiny", ms.Data[0].ID)
	hr, err := http.Get(s.base + "/health")
	require.NoError(t, err)
	hr.Body.Close()
	require.Equal(t, 200, hr.StatusCode)
}

func apiErr(t *testing.T, err error) *openai.Error {
	t.Helper()
	var e *openai.Error
	require.True(t, errors.As(err, &e), "%v", err)
	return e
}

func TestErrors(t *testing.T) {
	s := start(t, nil, nil)
	ctx := context.Background()
	p := chatParams("x", 4)
	p.Model = "gpt-4"
	_, err := s.cli.Chat.Completions.New(ctx, p)
	e := apiErr(t, err)
	require.Equal(t, 404, e.StatusCode)
	require.Equal(t, "model_not_found", e.Code)

	p = chatParams("x", 4)
	p.Temperature = openai.Float(3)
	_, err = s.cli.Chat.Completions.New(ctx, p)
	e = apiErr(t, err)
	require.Equal(t, 400, e.StatusCode)
	require.Equal(t, "temperature", e.Param)

	for n, msg := range map[int64]string{0: "must be in [1, 128]", 129: "must be in [1, 128]", 3: "runtime.max_running"} {
		p = chatParams("x", 4)
		p.N = openai.Int(n)
		_, err = s.cli.Chat.Completions.New(ctx, p)
		e = apiErr(t, err)
		require.Equal(t, 400, e.StatusCode, "n = %d", n)
		require.Equal(t, "n", e.Param)
		require.Contains(t, e.Message, msg)
	}

	p = chatParams("x", 5000)
	_, err = s.cli.Chat.Completions.New(ctx, p)
	require.Equal(t, "max_tokens", apiErr(t, err).Param)

	_, err = s.cli.Completions.New(ctx, openai.CompletionNewParams{Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{1, 999}}})
	require.Equal(t, "prompt[1]", apiErr(t, err).Param)

	for body, param := range map[string]string{
		`{"model":"tiny","messages":[{"role":"user","content":"x"}],"bogus":1}`:        "bogus",
		`{"model":"tiny","messages":[{"role":"wizard","content":"x"}]}`:                "messages[0].role",
		`{"model":"tiny","messages":[{"role":"user","content":"x"}],"max_tokens":"9"}`: "max_tokens",
		`{"model":"tiny","messages":[{"role":"user","content":"x"}],"stop":["a",""]}`:  "stop[1]",
		`{"model":"tiny","messages":[]}`:                                               "messages",
		`{"model":"tiny","messages":[{"role":"user","content":"x"}],"top_logprobs":2}`: "top_logprobs",
	} {
		resp, err := http.Post(s.base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, 400, resp.StatusCode, body)
		require.Contains(t, string(b), `"param":"`+param+`"`, body)
	}
}

// A client that goes away mid-stream frees its slot: with one slot, the
// next request runs.
func TestCancelFreesTheSlot(t *testing.T) {
	s := start(t, func(c *config.Config) { c.Runtime.Slots = 1; c.Runtime.MaxQueue = -1 }, nil)
	ctx, cancel := context.WithCancel(context.Background())
	st := s.cli.Chat.Completions.NewStreaming(ctx, chatParams("long", 3000))
	require.True(t, st.Next())
	require.True(t, st.Next())
	rt := s.srv.Runtime()
	_, running := rt.InFlight()
	require.Equal(t, 1, running)

	// The slot is held and no request may wait: 429.
	_, err := s.cli.Chat.Completions.New(context.Background(), chatParams("x", 2))
	require.Equal(t, 429, apiErr(t, err).StatusCode)

	cancel()
	st.Close()
	require.Eventually(t, func() bool { w, r := rt.InFlight(); return w+r == 0 }, 30*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return s.srv.Engine().Store().InUse() == 0 }, 30*time.Second, time.Millisecond)
	res, err := s.cli.Chat.Completions.New(context.Background(), chatParams("x", 2))
	require.NoError(t, err)
	require.Equal(t, int64(2), res.Usage.CompletionTokens)
}

func TestLoading503(t *testing.T) {
	gate := make(chan struct{})
	s := start(t, nil, gate)
	_, err := s.cli.Chat.Completions.New(context.Background(), chatParams("x", 2))
	require.Equal(t, 503, apiErr(t, err).StatusCode)
	hr, err := http.Get(s.base + "/health")
	require.NoError(t, err)
	hr.Body.Close()
	require.Equal(t, 503, hr.StatusCode)
	close(gate)
	<-s.srv.Ready()
}

// startGLM is startText on the tiny fixture's weights with the presets'
// GLM-4.5 chat template (tools, the tool role, thinking) and the glm45
// tool-call and reasoning parsers.
func startGLM(t *testing.T) *server {
	t.Helper()
	cfg, err := os.ReadFile("../../model/randckpt/tokenizer_config.json")
	require.NoError(t, err)
	tm, err := chat.Parse(cfg, "")
	require.NoError(t, err)
	return startText(t, nil, nil, func(tk *tokenizer.Tokenizer) *text.Model {
		return &text.Model{Tok: tk, Chat: tm, ToolCallParser: "glm45", ReasoningParser: "glm45"}
	})
}
