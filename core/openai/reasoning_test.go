package openai

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/glmflash/glmflash/core/grammar"
	"github.com/glmflash/glmflash/core/reasoning"
	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/core/toolcall"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/model/tokenizer"
)

func byteLive(t *testing.T) *Live {
	t.Helper()
	tj, _, err := randckpt.TokenizerFiles(256)
	require.NoError(t, err)
	tk, err := tokenizer.Parse(tj)
	require.NoError(t, err)
	v, err := grammar.NewVocab(tk, 256, nil)
	require.NoError(t, err)
	return &Live{Grammar: grammar.NewCompiler(v)}
}

// feed gives a constraint text byte by byte (the byte tokenizer's ids).
func feed(c sched.Constraint, text string) (done bool, err error) {
	for i := range len(text) {
		c.Allow(200)
		if done, err = c.Accept(int32(text[i])); err != nil || done {
			return done, err
		}
	}
	return false, nil
}

// With the reasoning parser on, a constrained chat reply may reason first:
// after a prompt that opened <think>, up to </think>; where the prompt left
// the reply open, in an optional <think>…</think> block; not at all where
// the prompt closed it (thinking off) or without a parser.
func TestStructuredOutputAfterReasoning(t *testing.T) {
	lv := byteLive(t)
	g := reasoning.FormatGLM45
	cases := []struct {
		prompt, format string
		ok, bad        []string
	}{
		{"<|assistant|><think>", g, []string{"let me think</think>{}"}, nil}, // "{}" alone is still reasoning
		{"<|assistant|>", g, []string{"{}", "<think>hmm</think>{}"}, []string{"hmm</think>{}"}},
		{"<|assistant|><think></think>\n", g, []string{"{}"}, []string{"<think>"}},
		{"<|assistant|>", reasoning.FormatNone, []string{"{}"}, []string{"<think>"}},
		{"<|assistant|>", "", []string{"{}"}, []string{"<think>"}},
	}
	st := structured{ResponseFormat: &responseFormat{Type: "json_object"}}
	for _, c := range cases {
		after, open := reasoningBefore(c.prompt, c.format)
		for _, text := range c.ok {
			p := params{req: sched.Request{MaxTokens: 100}}
			require.Nil(t, st.constrain(&p, lv, "max_tokens", after, open))
			done, err := feed(p.req.Constraint, text)
			require.NoError(t, err, "%q %q: %q", c.prompt, c.format, text)
			require.True(t, done, "%q %q: %q completes the output", c.prompt, c.format, text)
		}
		for _, text := range c.bad {
			p := params{req: sched.Request{MaxTokens: 100}}
			require.Nil(t, st.constrain(&p, lv, "max_tokens", after, open))
			_, err := feed(p.req.Constraint, text)
			require.Error(t, err, "%q %q: %q", c.prompt, c.format, text)
		}
	}
	p := params{req: sched.Request{MaxTokens: 9}}
	e := st.constrain(&p, lv, "max_completion_tokens", reasoning.Close, "")
	require.NotNil(t, e)
	require.Equal(t, "max_completion_tokens", e.param, "{} after </think> needs 10 tokens")
}

// tool_choice required or a named function is a tool-call grammar over
// the allowed tools, in the parser's format; a response_format beside it
// is refused.
func TestToolChoiceConstrained(t *testing.T) {
	lv := byteLive(t)
	weather := json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city","days"]}`)
	tools := []toolcall.Tool{{Name: "get_weather", Parameters: weather}, {Name: "now"}}
	for _, c := range []struct {
		spec    toolcall.Spec
		ok, bad string
	}{
		{toolcall.Spec{Tools: tools, Choice: toolcall.Choice{Mode: toolcall.ChoiceRequired}, Format: toolcall.FormatGLM45},
			"<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>", "hello"},
		{toolcall.Spec{Tools: tools, Choice: toolcall.Choice{Mode: toolcall.ChoiceFunction, Name: "now"}, Format: toolcall.FormatGLM45},
			"<tool_call>now\n</tool_call>", "<tool_call>get_weather"},
		{toolcall.Spec{Tools: tools, Choice: toolcall.Choice{Mode: toolcall.ChoiceRequired}, Format: toolcall.FormatJSON},
			`<tool_call>{"name":"get_weather","arguments":{"city":"Paris","days":2}}</tool_call>`, `<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}`},
	} {
		p := params{req: sched.Request{MaxTokens: 300}}
		require.Nil(t, constrainTools(&c.spec, &p, lv, "max_tokens", "", "", &structured{}))
		done, err := feed(p.req.Constraint, c.ok)
		require.NoError(t, err, c.ok)
		require.True(t, done, "%q completes the output", c.ok)
		p = params{req: sched.Request{MaxTokens: 300}}
		require.Nil(t, constrainTools(&c.spec, &p, lv, "max_tokens", "", "", &structured{}))
		_, err = feed(p.req.Constraint, c.bad)
		require.Error(t, err, c.bad)
	}
	spec := toolcall.Spec{Tools: tools, Choice: toolcall.Choice{Mode: toolcall.ChoiceRequired}, Format: toolcall.FormatGLM45}
	p := params{req: sched.Request{MaxTokens: 300}}
	e := constrainTools(&spec, &p, lv, "max_tokens", "", "", &structured{ResponseFormat: &responseFormat{Type: "json_object"}})
	require.NotNil(t, e)
	require.Equal(t, "response_format", e.param)
}
