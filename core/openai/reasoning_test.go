package openai

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/glmflash/glmflash/core/grammar"
	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/model/tokenizer"
)

// With Live.ReasoningEnd set, a chat reply's structured output may follow
// free reasoning up to the end tag, unless the prompt already closed it
// (thinking off: the prompt ends "<think></think>").
func TestStructuredOutputAfterReasoning(t *testing.T) {
	tj, _, err := randckpt.TokenizerFiles(256)
	require.NoError(t, err)
	tk, err := tokenizer.Parse(tj)
	require.NoError(t, err)
	v, err := grammar.NewVocab(tk, 256, nil)
	require.NoError(t, err)
	lv := &Live{Grammar: grammar.NewCompiler(v), ReasoningEnd: "</think>"}
	require.Equal(t, "</think>", reasoningOpen("<|assistant|>", lv))
	require.Equal(t, "", reasoningOpen("<|assistant|><think></think>\n", lv))
	require.Equal(t, "", reasoningOpen("<|assistant|>", &Live{}))

	feed := func(c sched.Constraint, text string) (done bool, err error) {
		for i := range len(text) {
			c.Allow(100)
			if done, err = c.Accept(int32(text[i])); err != nil || done {
				return done, err
			}
		}
		return false, nil
	}
	st := structured{ResponseFormat: &responseFormat{Type: "json_object"}}
	p := params{req: sched.Request{MaxTokens: 100}}
	require.Nil(t, st.constrain(&p, lv, "max_tokens", reasoningOpen("<|assistant|>", lv)))
	done, err := feed(p.req.Constraint, "let me think</think>{}")
	require.NoError(t, err)
	require.True(t, done, "the object after the reasoning completes the output")

	p = params{req: sched.Request{MaxTokens: 100}}
	require.Nil(t, st.constrain(&p, lv, "max_tokens", reasoningOpen("<think></think>", lv)))
	_, err = feed(p.req.Constraint, "let me think")
	require.Error(t, err, "thinking off: the output is the object from its first byte")

	p = params{req: sched.Request{MaxTokens: 9}}
	e := st.constrain(&p, lv, "max_completion_tokens", "</think>")
	require.NotNil(t, e)
	require.Equal(t, "max_completion_tokens", e.param, "{} after </think> needs 10 tokens")
}
