package openai

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/core/text"
	"github.com/glmflash/glmflash/core/toolcall"
	"github.com/glmflash/glmflash/model/chat"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/model/tokenizer"
	"github.com/openai/openai-go/v3"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// presetText is a preset's tokenizer (its GLM added tokens) and chat
// template (GLM-4.5's), with the glm45 parsers.
func presetText(t *testing.T) *text.Model {
	t.Helper()
	tj, cfg, err := randckpt.TokenizerFiles(1024)
	require.NoError(t, err)
	tk, err := tokenizer.Parse(tj)
	require.NoError(t, err)
	tm, err := chat.Parse(cfg, "")
	require.NoError(t, err)
	return &text.Model{Tok: tk, Chat: tm, ToolCallParser: "glm45", ReasoningParser: "glm45"}
}

var presetLimits = limits{vocab: 1024, context: 8192, defaultMaxTokens: 16}

const weatherTool = `{"type": "function", "function": {"name": "get_weather", "description": "The weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}`

// checkBody decodes and checks a chat request as the server does.
func checkBody(t *testing.T, tm *text.Model, body string) (params, *apiError) {
	t.Helper()
	var req chatRequest
	if e := decode(strings.NewReader(body), &req, 1<<20); e != nil {
		return params{}, e
	}
	return checkChat(context.Background(), &req, tm, presetLimits, nil)
}

// The tool-calling request fields are refused with the field named.
func TestToolFieldsValidated(t *testing.T) {
	tm := presetText(t)
	user := `"messages": [{"role": "user", "content": "hi"}]`
	for _, c := range []struct{ body, param, msg string }{
		{`{` + user + `, "tools": [{"type": "code", "function": {"name": "a"}}]}`, "tools[0].type", `must be "function"`},
		{`{` + user + `, "tools": [{"type": "function"}]}`, "tools[0].function", "required"},
		{`{` + user + `, "tools": [{"type": "function", "function": {"name": "a b"}}]}`, "tools[0].function.name", "letters, digits"},
		{`{` + user + `, "tools": [{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "a"}}]}`, "tools[1].function.name", "given twice"},
		{`{` + user + `, "tools": [{"type": "function", "function": {"name": "a", "parameters": [1]}}]}`, "tools[0].function.parameters", "JSON Schema object"},
		{`{` + user + `, "tool_choice": "auto"}`, "tool_choice", "needs tools"},
		{`{` + user + `, "tools": [` + weatherTool + `], "tool_choice": "any"}`, "tool_choice", `got "any"`},
		{`{` + user + `, "tools": [` + weatherTool + `], "tool_choice": {"type": "function", "function": {"name": "nope"}}}`, "tool_choice.function.name", "not one of the request's tools"},
		{`{` + user + `, "tools": [` + weatherTool + `], "tool_choice": {"type": "fn", "function": {"name": "get_weather"}}}`, "tool_choice.type", `must be "function"`},
		{`{` + user + `, "tools": [` + weatherTool + `], "tool_choice": "required"}`, "tools", "structured output is not available"}, // no grammar compiler here (TestToolChoiceConstrained has one)
		{`{` + user + `, "tools": [` + weatherTool + `], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}`, "tools", "structured output is not available"},
		{`{"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}]}`, "messages[1].tool_call_id", "required"},
		{`{"messages": [{"role": "user", "content": "hi", "tool_call_id": "c"}]}`, "messages[0].tool_call_id", "only tool messages"},
		{`{"messages": [{"role": "user", "content": "hi", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "a", "arguments": "{}"}}]}]}`, "messages[0].tool_calls", "only assistant"},
		{`{"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "a", "arguments": "{nope"}}]}]}`, "messages[0].tool_calls[0].function.arguments", "JSON object in a string"},
		{`{"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "a", "arguments": "[1]"}}]}]}`, "messages[0].tool_calls[0].function.arguments", "got JSON array"},
		{`{"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"arguments": "{}"}}]}]}`, "messages[0].tool_calls[0].function.name", "required"},
		{`{"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "x", "function": {"name": "a"}}]}]}`, "messages[0].tool_calls[0].type", `must be "function"`},
		{`{` + user + `, "chat_template_kwargs": [1]}`, "chat_template_kwargs", "must be an object"},
		{`{` + user + `, "chat_template_kwargs": {"messages": []}}`, "chat_template_kwargs.messages", "set by the server"},
		{`{` + user + `, "chat_template_kwargs": {"a-b": 1}}`, "chat_template_kwargs", "not a template variable name"},
		{`{` + user + `, "chat_template_kwargs": {"deep": ` + strings.Repeat("[", 20) + strings.Repeat("]", 20) + `}}`, "chat_template_kwargs.deep", "nested too deep"},
		{`{` + user + `, "chat_template_kwargs": {` + manyKwargs(33) + `}}`, "chat_template_kwargs", "at most 32"},
		{`{` + user + `, "parallel_tool_calls": "yes"}`, "parallel_tool_calls", "want true or false"},
	} {
		_, e := checkBody(t, tm, c.body)
		require.NotNil(t, e, c.body)
		require.Equal(t, c.param, e.param, c.body)
		require.Contains(t, e.msg, c.msg, c.body)
		require.Equal(t, 400, e.status)
	}

	// parameters nested 60 deep render; 70 deep are refused.
	nest := func(n int) string {
		return `{"type": "function", "function": {"name": "deep", "parameters": ` + strings.Repeat(`{"a": `, n) + `1` + strings.Repeat(`}`, n) + `}}`
	}
	_, e := checkBody(t, tm, `{`+user+`, "tools": [`+nest(60)+`]}`)
	require.Nil(t, e)
	_, e = checkBody(t, tm, `{`+user+`, "tools": [`+nest(70)+`]}`)
	require.NotNil(t, e)
	require.Equal(t, "tools[0].function.parameters", e.param)
	require.Contains(t, e.msg, "nested too deep (at most 64 levels)")

	// tools: [] is no tools; tool_choice "none" with tools parses nothing.
	p, e := checkBody(t, tm, `{`+user+`, "tools": []}`)
	require.Nil(t, e)
	require.Nil(t, p.tools)
	p, e = checkBody(t, tm, `{`+user+`, "tools": [`+weatherTool+`], "tool_choice": "none"}`)
	require.Nil(t, e)
	require.False(t, p.tools.Parses())

	// Without a tool-call parser, tools are refused unless tool_choice is none.
	off := *tm
	off.ToolCallParser = "none"
	_, e = checkBody(t, &off, `{`+user+`, "tools": [`+weatherTool+`]}`)
	require.NotNil(t, e)
	require.Equal(t, "tools", e.param)
	require.Contains(t, e.msg, "model.tool_call_parser is none")
	_, e = checkBody(t, &off, `{`+user+`, "tools": [`+weatherTool+`], "tool_choice": "none"}`)
	require.Nil(t, e)

	// A model without a chat template says so, not that tools are off.
	bare := &text.Model{Tok: tm.Tok}
	_, e = checkBody(t, bare, `{`+user+`, "tools": [`+weatherTool+`]}`)
	require.NotNil(t, e)
	require.Equal(t, "messages", e.param)
	require.Contains(t, e.msg, "no chat template")
}

func manyKwargs(n int) string {
	var parts []string
	for i := range n {
		parts = append(parts, `"k`+strings.Repeat("x", i)+`": 1`)
	}
	return strings.Join(parts, ", ")
}

// A tool round trip renders through the template: tools in the system
// turn, the assistant's calls in GLM-4.5's format, the results as
// <|observation|> turns; enable_thinking false closes the think block.
func TestToolConversationRenders(t *testing.T) {
	tm := presetText(t)
	body := `{"messages": [
		{"role": "user", "content": "Weather in Beijing?"},
		{"role": "assistant", "content": null, "reasoning_content": "I should call it.", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Beijing\", \"days\": 3}"}}]},
		{"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
	], "tools": [` + weatherTool + `], "parallel_tool_calls": false, "chat_template_kwargs": {"enable_thinking": false}}`
	p, e := checkBody(t, tm, body)
	require.Nil(t, e)
	prompt := tm.Tok.Decode(p.req.Prompt, false)
	require.Contains(t, prompt, `<|system|>
# Tools`)
	require.Contains(t, prompt, `{"function": {"description": "The weather", "name": "get_weather", "parameters": {"properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"], "type": "object"}}, "type": "function"}`)
	require.Contains(t, prompt, "<|assistant|>\n<think>I should call it.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>")
	require.Contains(t, prompt, "<|observation|>\n<tool_response>\nsunny\n</tool_response>")
	require.True(t, strings.HasSuffix(prompt, "<|assistant|>\n<think></think>"), prompt)
	require.False(t, p.promptOpensThink)
	require.False(t, p.tools.Parallel)
	require.Equal(t, "auto", p.tools.Choice.Mode)
	// The tags are one token each (ordinary added tokens).
	id, _ := tm.Tok.TokenID("<tool_call>")
	require.Contains(t, p.req.Prompt, id)

	// A template whose generation prompt opens <think>: the output starts
	// in the reasoning.
	open, err := chat.Parse([]byte(`{"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}<|assistant|><think>"}`), "")
	require.NoError(t, err)
	tm2 := *tm
	tm2.Chat = open
	p, e = checkBody(t, &tm2, `{"messages": [{"role": "user", "content": "hi"}]}`)
	require.Nil(t, e)
	require.True(t, p.promptOpensThink)
}

// scripted runs a response over model output given as text chunks (the
// model's text as the text layer releases it) and returns the body.
func scripted(t *testing.T, p params, chunks []string, reason sched.FinishReason) string {
	t.Helper()
	rec := httptest.NewRecorder()
	o := &response{s: &server{o: Options{Model: "m", Log: zerolog.Nop()}}, w: rec, lv: &Live{}, p: p, chat: true, id: "chatcmpl-x", created: 1}
	o.choices = []*choiceOut{{parse: newChatOut(&o.p)}}
	if p.stream {
		o.event(0, map[string]any{"role": "assistant", "content": ""}, nil, nil)
	}
	for _, c := range chunks {
		o.add(0, &text.Chunk{Text: c})
	}
	o.choices[0].final = &text.Final{Final: &sched.Final{Reason: reason, PromptTokens: 3, CompletionTokens: 9}}
	if e := o.finished(0); e != nil && p.stream { // as read does
		o.sse(errorBody(e))
		o.done()
	} else {
		o.finish()
	}
	require.NoError(t, o.err)
	return rec.Body.String()
}

// stream decodes an SSE body with openai-go's chunk type and accumulator.
func stream(t *testing.T, body string) (openai.ChatCompletionAccumulator, []openai.ChatCompletionChunk, string) {
	t.Helper()
	var acc openai.ChatCompletionAccumulator
	var chunks []openai.ChatCompletionChunk
	var reasoning strings.Builder
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(nil, 1<<20)
	done := false
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			done = true
			continue
		}
		var ch openai.ChatCompletionChunk
		require.NoError(t, json.Unmarshal([]byte(line), &ch), line)
		require.True(t, acc.AddChunk(ch), line)
		chunks = append(chunks, ch)
		var raw struct {
			Choices []struct {
				Delta map[string]any `json:"delta"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &raw))
		for _, c := range raw.Choices {
			if r, ok := c.Delta["reasoning_content"].(string); ok {
				reasoning.WriteString(r)
			}
		}
	}
	require.True(t, done)
	return acc, chunks, reasoning.String()
}

// toolParams are the checked params of a chat request with the weather
// tool (tool_choice auto) on the preset's text model.
func toolParams(t *testing.T, extra string) params {
	t.Helper()
	p, e := checkBody(t, presetText(t), `{"messages": [{"role": "user", "content": "Weather?"}], "tools": [`+weatherTool+`]`+extra+`}`)
	require.Nil(t, e)
	return p
}

// What the model would write: reasoning, a sentence, two GLM-4.5 calls.
const modelOut = "\n<think>The user wants weather.</think>\nLet me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"

// A scripted model output comes back as message.tool_calls,
// reasoning_content and finish_reason tool_calls, which openai-go decodes;
// streamed, as delta.reasoning_content and delta.tool_calls (id and name
// first, then the arguments) that openai-go's accumulator joins into the
// same calls, however the text is cut into chunks.
func TestToolCallsOut(t *testing.T) {
	p := toolParams(t, "")
	body := scripted(t, p, []string{modelOut}, sched.FinishStop)
	var res openai.ChatCompletion
	require.NoError(t, json.Unmarshal([]byte(body), &res))
	require.Len(t, res.Choices, 1)
	ch := res.Choices[0]
	require.Equal(t, "tool_calls", ch.FinishReason)
	require.Equal(t, "Let me check.", ch.Message.Content)
	require.Len(t, ch.Message.ToolCalls, 2)
	for i, want := range []string{`{"city":"Beijing","days":3}`, `{"city":"Paris"}`} {
		tc := ch.Message.ToolCalls[i]
		require.Regexp(t, `^call_[0-9a-f]{24}$`, tc.ID)
		require.Equal(t, "function", tc.Type)
		require.Equal(t, "get_weather", tc.Function.Name)
		require.JSONEq(t, want, tc.Function.Arguments)
	}
	var raw struct {
		Choices []struct {
			Message map[string]any `json:"message"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &raw))
	require.Equal(t, "The user wants weather.", raw.Choices[0].Message["reasoning_content"])

	p.stream = true
	for cut := 0; cut <= len(modelOut); cut++ {
		body := scripted(t, p, []string{modelOut[:cut], modelOut[cut:]}, sched.FinishStop)
		acc, chunks, reasoning := stream(t, body)
		require.Equal(t, "The user wants weather.", reasoning, "cut at %d", cut)
		m := acc.Choices[0].Message
		require.Equal(t, "Let me check.", m.Content, "cut at %d", cut)
		require.Len(t, m.ToolCalls, 2, "cut at %d", cut)
		require.Equal(t, "get_weather", m.ToolCalls[1].Function.Name)
		require.JSONEq(t, `{"city":"Beijing","days":3}`, m.ToolCalls[0].Function.Arguments, "cut at %d", cut)
		require.JSONEq(t, `{"city":"Paris"}`, m.ToolCalls[1].Function.Arguments, "cut at %d", cut)
		require.Equal(t, "tool_calls", acc.Choices[0].FinishReason)
		// Each call's first delta carries its id and name.
		seen := map[int64]bool{}
		for _, c := range chunks {
			for _, ch := range c.Choices {
				for _, tc := range ch.Delta.ToolCalls {
					if !seen[tc.Index] {
						require.NotEmpty(t, tc.ID)
						require.Equal(t, "get_weather", tc.Function.Name)
						seen[tc.Index] = true
					}
				}
			}
		}
		require.Len(t, seen, 2)
	}

	// parallel_tool_calls false keeps the first call.
	p = toolParams(t, `, "parallel_tool_calls": false`)
	require.NoError(t, json.Unmarshal([]byte(scripted(t, p, []string{modelOut}, sched.FinishStop)), &res))
	require.Len(t, res.Choices[0].Message.ToolCalls, 1)

	// Cut off by max_tokens: finish_reason stays length.
	require.NoError(t, json.Unmarshal([]byte(scripted(t, p, []string{modelOut[:len(modelOut)-20]}, sched.FinishLength)), &res))
	require.Equal(t, "length", res.Choices[0].FinishReason)

	// tool_choice none: the call text is content.
	p = toolParams(t, `, "tool_choice": "none"`)
	require.NoError(t, json.Unmarshal([]byte(scripted(t, p, []string{modelOut}, sched.FinishStop)), &res))
	require.Empty(t, res.Choices[0].Message.ToolCalls)
	require.Equal(t, "stop", res.Choices[0].FinishReason)
	require.Contains(t, res.Choices[0].Message.Content, "<tool_call>get_weather")
}

// Without tools the output is content and reasoning; with the parser off
// (model.reasoning_parser none) <think> stays in the content.
func TestReasoningOut(t *testing.T) {
	tm := presetText(t)
	p, e := checkBody(t, tm, `{"messages": [{"role": "user", "content": "hi"}]}`)
	require.Nil(t, e)
	out := "<think>hmm</think>\n\nHello <think>"
	var res openai.ChatCompletion
	require.NoError(t, json.Unmarshal([]byte(scripted(t, p, []string{out}, sched.FinishStop)), &res))
	require.Equal(t, "Hello <think>", res.Choices[0].Message.Content)
	require.Equal(t, "stop", res.Choices[0].FinishReason)
	p.stream = true
	for cut := range len(out) + 1 {
		acc, _, r := stream(t, scripted(t, p, []string{out[:cut], out[cut:]}, sched.FinishStop))
		require.Equal(t, "hmm", r)
		require.Equal(t, "Hello <think>", acc.Choices[0].Message.Content)
	}
	off := *tm
	off.ReasoningParser = "none"
	p, e = checkBody(t, &off, `{"messages": [{"role": "user", "content": "hi"}]}`)
	require.Nil(t, e)
	body := scripted(t, p, []string{out}, sched.FinishStop)
	require.NoError(t, json.Unmarshal([]byte(body), &res))
	require.Equal(t, out, res.Choices[0].Message.Content)
	require.NotContains(t, body, "reasoning_content")
}

// What the template renders of an assistant turn, the parsers read back:
// the reasoning, the content and the calls (string parameters raw, others
// JSON, by the tools' schemas).
func TestTemplateParserRoundTrip(t *testing.T) {
	tm := presetText(t)
	const tools = `[{"type": "function", "function": {"name": "book", "parameters": {"type": "object", "properties": {
		"title": {"type": "string"}, "code": {"type": "string"}, "n": {"type": "integer"}, "ok": {"type": "boolean"},
		"tags": {"type": "array"}, "where": {"type": "object"}, "price": {"type": "number"}}}}},
		{"type": "function", "function": {"name": "now"}}]`
	calls := []struct{ name, args string }{
		{"book", `{"title": "  Dune: <Part> \"Two\"\nline 2", "code": "42", "n": 3, "ok": true, "tags": ["a", {"b": null}], "where": {"city": "北京"}, "price": 9.5}`},
		{"now", `{}`},
	}
	var tcs []string
	for i, c := range calls {
		arg, _ := json.Marshal(c.args)
		tcs = append(tcs, `{"id": "call_`+string(rune('a'+i))+`", "type": "function", "function": {"name": "`+c.name+`", "arguments": `+string(arg)+`}}`)
	}
	body := `{"messages": [{"role": "user", "content": "Book it."},
		{"role": "assistant", "content": "Booking now.", "reasoning_content": "Two calls.", "tool_calls": [` + strings.Join(tcs, ", ") + `]},
		{"role": "user", "content": "ok?"}], "tools": ` + tools + `}`
	var req chatRequest
	require.Nil(t, decode(strings.NewReader(body), &req, 1<<20))
	msgs, e := chatMessages(req.Messages)
	require.Nil(t, e)
	spec, forTemplate, e := checkTools(&req, "glm45")
	require.Nil(t, e)
	// The assistant turn as the last message (its reasoning is kept).
	prompt, _, err := tm.Chat.RenderWith(context.Background(), msgs[:2], chat.Options{Tools: forTemplate}, nil)
	require.NoError(t, err)
	i := strings.LastIndex(prompt, "<|assistant|>")
	require.Positive(t, i)
	turn := prompt[i+len("<|assistant|>"):]
	require.Contains(t, turn, "<arg_key>title</arg_key>\n<arg_value>  Dune: <Part> \"Two\"\nline 2</arg_value>")

	p := &params{tools: spec, reasoningFormat: "glm45"}
	for cut := 0; cut <= len(turn); cut += 7 {
		out := newChatOut(p)
		pieces := append(out.feed(turn[:cut], false), out.feed(turn[cut:], true)...)
		var r strings.Builder
		var ds []toolcall.Delta
		for _, pc := range pieces {
			r.WriteString(pc.reasoning)
			if pc.reasoning == "" {
				ds = append(ds, pc.delta)
			}
		}
		content, got := toolcall.Collect(ds)
		require.Equal(t, "Two calls.", r.String())
		require.Equal(t, "Booking now.", content)
		require.Len(t, got, len(calls))
		for j, c := range calls {
			require.Equal(t, c.name, got[j].Name)
			require.JSONEq(t, c.args, got[j].Arguments, "call %d, cut at %d", j, cut)
		}
	}
}
