package openai

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/sched"
	"github.com/stretchr/testify/require"
)

var testLimits = limits{vocab: 256, context: 4096, defaultMaxTokens: 16}

// checkSampling decodes and checks a chat body (with messages) or a completion
// body (with prompt) as the handlers do.
func checkSampling(t *testing.T, body string) (params, *apiError) {
	t.Helper()
	m := bytesText(t, 256)
	if strings.Contains(body, `"prompt"`) {
		var req completionRequest
		if e := decode(strings.NewReader(body), &req, DefaultMaxBodyBytes); e != nil {
			return params{}, e
		}
		return checkCompletion(context.Background(), &req, m, testLimits, nil)
	}
	var req chatRequest
	if e := decode(strings.NewReader(body), &req, DefaultMaxBodyBytes); e != nil {
		return params{}, e
	}
	return checkChat(context.Background(), &req, m, testLimits, nil)
}

// The sampling fields OpenAI and vLLM clients send become the runtime
// request's fields (issue 32: each was a 400).
func TestSamplingFieldsMapOntoTheRequest(t *testing.T) {
	for _, prefix := range []string{`{"messages":[{"role":"user","content":"hi"}],`, `{"prompt":"hi",`} {
		p, e := checkSampling(t, prefix+`"max_tokens":10,"temperature":0.7,"top_p":0.9,"top_k":5,"min_p":0.05,
			"repetition_penalty":1.3,"presence_penalty":0.5,"frequency_penalty":-0.25,
			"logit_bias":{"7":5,"9":-100,"3":0},"min_tokens":4,"stop_token_ids":[5,6,5],"skip_special_tokens":false}`)
		require.Nil(t, e, prefix)
		r := p.req
		require.Equal(t, 0.7, r.Sampling.Temperature)
		require.Equal(t, 0.9, r.Sampling.TopP)
		require.Equal(t, 5, r.Sampling.TopK)
		require.Equal(t, 0.05, r.Sampling.MinP)
		require.Equal(t, sample.Processing{RepetitionPenalty: 1.3, PresencePenalty: 0.5, FrequencyPenalty: -0.25,
			LogitBias: map[int32]float64{7: 5, 9: -100}}, r.Processing, "a bias of 0 is left out")
		require.NoError(t, r.Processing.Validate(testLimits.vocab))
		require.Equal(t, 4, r.MinTokens)
		require.Equal(t, []int32{5, 6}, r.StopIDs, "repeated ids once")
		require.False(t, p.skipSpecial)
		require.Equal(t, 10, r.MaxTokens)
	}

	// Nothing set: no processing, special tokens skipped (vLLM's default).
	p, e := checkSampling(t, `{"messages":[{"role":"user","content":"hi"}]}`)
	require.Nil(t, e)
	require.False(t, p.req.Processing.Active())
	require.Zero(t, p.req.MinTokens)
	require.Nil(t, p.req.StopIDs)
	require.Zero(t, p.req.Sampling.TopK)
	require.Zero(t, p.req.Sampling.MinP)
	require.True(t, p.skipSpecial)

	// vLLM's top_k -1 is off; a top_k past the vocabulary is the vocabulary.
	p, e = checkSampling(t, `{"prompt":"hi","top_k":-1}`)
	require.Nil(t, e)
	require.Zero(t, p.req.Sampling.TopK)
	p, e = checkSampling(t, `{"prompt":"hi","top_k":100000}`)
	require.Nil(t, e)
	require.Equal(t, testLimits.vocab, p.req.Sampling.TopK)
	// Neutral values are no processing.
	p, e = checkSampling(t, `{"prompt":"hi","repetition_penalty":1,"presence_penalty":0,"frequency_penalty":0,"logit_bias":{"4":0}}`)
	require.Nil(t, e)
	require.False(t, p.req.Processing.Active())
	// min_tokens up to the default max_tokens when none is given.
	p, e = checkSampling(t, `{"prompt":"hi","min_tokens":16}`)
	require.Nil(t, e)
	require.Equal(t, 16, p.req.MinTokens)
}

// Every sampling field out of range is a 400 naming it.
func TestSamplingFieldErrorsNameTheField(t *testing.T) {
	const chat = `{"messages":[{"role":"user","content":"hi"}],`
	for _, c := range []struct{ body, param, msg string }{
		{`"top_k":-2}`, "top_k", "top_k: must be -1 or 0 (off) or ≥ 1, got -2"},
		{`"top_k":1.5}`, "top_k", "top_k: want an integer, got JSON number 1.5"},
		{`"min_p":1}`, "min_p", "min_p: must be in [0, 1) (0 is off), got 1"},
		{`"min_p":-0.1}`, "min_p", "min_p: must be in [0, 1) (0 is off), got -0.1"},
		{`"repetition_penalty":0}`, "repetition_penalty", "repetition_penalty: must be in (0, 100] (1 is off), got 0"},
		{`"repetition_penalty":101}`, "repetition_penalty", "repetition_penalty: must be in (0, 100] (1 is off), got 101"},
		{`"presence_penalty":2.5}`, "presence_penalty", "presence_penalty: must be in [-2, 2], got 2.5"},
		{`"frequency_penalty":-3}`, "frequency_penalty", "frequency_penalty: must be in [-2, 2], got -3"},
		{`"logit_bias":{"x":1}}`, `logit_bias["x"]`, `logit_bias["x"]: the key must be a token id (a decimal integer), got "x"`},
		{`"logit_bias":{"07":1}}`, `logit_bias["07"]`, `logit_bias["07"]: the key must be a token id (a decimal integer), got "07"`},
		{`"logit_bias":{"256":1}}`, `logit_bias["256"]`, `logit_bias["256"]: token id 256 is outside the vocabulary [0, 256)`},
		{`"logit_bias":{"-1":1}}`, `logit_bias["-1"]`, `logit_bias["-1"]: token id -1 is outside the vocabulary [0, 256)`},
		{`"logit_bias":{"5":100.5}}`, `logit_bias["5"]`, `logit_bias["5"]: the bias must be in [-100, 100], got 100.5`},
		{`"logit_bias":{"5":"a"}}`, "logit_bias", "logit_bias: want a number, got JSON string"},
		{`"logit_bias":[1]}`, "logit_bias", "logit_bias: want an object, got JSON array"},
		{`"min_tokens":-1}`, "min_tokens", "min_tokens: must be in [0, 16] (at most max_tokens, 16), got -1"},
		{`"max_tokens":3,"min_tokens":4}`, "min_tokens", "min_tokens: must be in [0, 3] (at most max_tokens, 3), got 4"},
		{`"stop_token_ids":[1,256]}`, "stop_token_ids[1]", "stop_token_ids[1]: token id 256 is outside the vocabulary [0, 256)"},
		{`"stop_token_ids":"1"}`, "stop_token_ids", "stop_token_ids: want a list, got JSON string"},
		{`"skip_special_tokens":1}`, "skip_special_tokens", "skip_special_tokens: want true or false, got JSON number"},
		{`"n":0}`, "n", "n: must be in [1, 128], got 0"},
	} {
		_, e := checkSampling(t, chat+c.body)
		require.NotNil(t, e, c.body)
		require.Equal(t, 400, e.status, c.body)
		require.Equal(t, c.param, e.param, c.body)
		require.Equal(t, c.msg, e.msg, c.body)
	}
	// More entries than OpenAI's bound, refused before any is looked at.
	var many strings.Builder
	many.WriteString(chat + `"logit_bias":{`)
	for i := range sample.MaxLogitBias + 1 {
		if i > 0 {
			many.WriteByte(',')
		}
		many.WriteString(`"` + strconv.Itoa(i) + `":1`)
	}
	many.WriteString("}}")
	_, e := checkSampling(t, many.String())
	require.NotNil(t, e)
	require.Equal(t, "logit_bias", e.param)
	require.Equal(t, "logit_bias: at most 300 entries, got 301", e.msg)
	_, e = checkSampling(t, chat+`"stop_token_ids":[`+strings.Repeat("1,", sched.MaxStopIDs)+`1]}`)
	require.NotNil(t, e)
	require.Equal(t, "stop_token_ids", e.param)
}

// The OpenAI fields that change nothing here are accepted and ignored (as
// vLLM does), within OpenAI's bounds; unknown fields stay refused by name.
func TestIgnoredFieldsAccepted(t *testing.T) {
	const chat = `{"messages":[{"role":"user","content":"hi"}],`
	base, e := checkSampling(t, chat+`"max_tokens":3,"seed":1}`)
	require.Nil(t, e)
	p, e := checkSampling(t, chat+`"max_tokens":3,"seed":1,"store":true,"metadata":{"app":"x","k":""},"user":"u-1","service_tier":"flex"}`)
	require.Nil(t, e)
	require.Equal(t, base.req, p.req, "nothing changes")
	p, e = checkSampling(t, `{"prompt":"hi","max_tokens":3,"seed":1,"store":false,"metadata":null,"service_tier":"auto"}`)
	require.Nil(t, e)
	for _, c := range []struct{ body, param string }{
		{`"store":"yes"}`, "store"},
		{`"metadata":{"a":1}}`, "metadata"},
		{`"metadata":[]}`, "metadata"},
		{`"metadata":{` + strings.TrimSuffix(strings.Repeat(`"k":"v",`, 1), ",") + `,"k2":"v","k3":"v","k4":"v","k5":"v","k6":"v","k7":"v","k8":"v","k9":"v","k10":"v","k11":"v","k12":"v","k13":"v","k14":"v","k15":"v","k16":"v","k17":"v"}}`, "metadata"},
		{`"metadata":{"` + strings.Repeat("k", 65) + `":"v"}}`, "metadata"},
		{`"metadata":{"k":"` + strings.Repeat("v", 513) + `"}}`, `metadata["k"]`},
		{`"user":"` + strings.Repeat("u", 513) + `"}`, "user"},
		{`"service_tier":"Fast!"}`, "service_tier"},
		{`"service_tier":""}`, "service_tier"},
		{`"service_tier":3}`, "service_tier"},
		{`"stor":true}`, "stor"},
	} {
		_, e := checkSampling(t, chat+c.body)
		require.NotNil(t, e, c.body)
		require.Equal(t, 400, e.status, c.body)
		require.Equal(t, c.param, e.param, c.body)
	}
}

// The runtime's refusals name this API's fields (the runtime speaks the
// gRPC API's spelling), so a refusal of a field the API mapped names the
// field the client sent.
func TestRuntimeFieldsInTheAPISpelling(t *testing.T) {
	for _, c := range []struct {
		field string
		chat  bool
		want  string
	}{
		{"sampling.top_p", false, "top_p"},
		{"sampling.min_p", true, "min_p"},
		{"stop_ids", false, "stop_token_ids"},
		{"stop_ids[3]", true, "stop_token_ids[3]"},
		{"prompt_ids[2]", false, "prompt[2]"},
		{"prompt_ids[2]", true, "messages"},
		{"min_tokens", true, "min_tokens"},
		{"presence_penalty", true, "presence_penalty"},
		{"logit_bias", false, "logit_bias"},
		{"logit_bias[7]", false, `logit_bias["7"]`},
		{"max_tokens", false, "max_tokens"},
	} {
		require.Equal(t, c.want, apiField(c.field, c.chat), c.field)
	}
	e := submitError(&sched.InvalidError{Field: "logit_bias[9]", Msg: "must be in [-100, 100], got 200"}, false)
	require.Equal(t, 400, e.status)
	require.Equal(t, `logit_bias["9"]`, e.param)
	require.Equal(t, `logit_bias["9"]: must be in [-100, 100], got 200`, e.msg)
}
