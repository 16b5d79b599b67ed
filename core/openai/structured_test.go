package openai_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/glmflash/glmflash/core/config"
)

const personSchema = `{"type":"object","properties":{"name":{"type":"string","maxLength":8},"age":{"type":"integer"},"tags":{"type":"array","items":{"enum":["a","b","c"]},"maxItems":3},"ok":{"type":"boolean"},"when":{"type":"string","format":"date"}},"required":["name","age"],"additionalProperties":false}`

func compileSchema(t *testing.T, text string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	require.NoError(t, err)
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	require.NoError(t, c.AddResource("s.json", doc))
	s, err := c.Compile("s.json")
	require.NoError(t, err)
	return s
}

// 200 random-weight generations (temperature 1, the tiny fixture's random
// weights) under response_format json_schema: every one parses, validates
// and finishes with stop.
func TestJSONSchemaRandomGenerationsValidate(t *testing.T) {
	s := start(t, func(c *config.Config) { c.Runtime.Slots = 8 }, nil)
	ctx := context.Background()
	var schema map[string]any
	require.NoError(t, json.Unmarshal([]byte(personSchema), &schema))
	sch := compileSchema(t, personSchema)
	const n = 200
	outs := make([]string, n)
	reasons := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			p := chatParams(fmt.Sprintf("person %d", i), int64(60+i%40))
			p.Temperature = openai.Float(1)
			p.Seed = openai.Int(int64(i))
			p.ResponseFormat = openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &openai.ResponseFormatJSONSchemaParam{
				JSONSchema: openai.ResponseFormatJSONSchemaJSONSchemaParam{Name: "person", Schema: schema, Strict: openai.Bool(true)},
			}}
			res, err := s.cli.Chat.Completions.New(ctx, p)
			if err != nil {
				errs[i] = err
				return
			}
			outs[i], reasons[i] = res.Choices[0].Message.Content, res.Choices[0].FinishReason
		}()
	}
	wg.Wait()
	distinct := map[string]bool{}
	for i := range n {
		require.NoError(t, errs[i])
		inst, err := jsonschema.UnmarshalJSON(strings.NewReader(outs[i]))
		require.NoError(t, err, "output %d %q", i, outs[i])
		require.NoError(t, sch.Validate(inst), "output %d %q", i, outs[i])
		require.Equal(t, "stop", reasons[i], "output %d %q", i, outs[i])
		distinct[outs[i]] = true
	}
	require.Greater(t, len(distinct), n/2, "random weights give varied outputs")
}

// post sends a raw JSON body and returns the status and decoded body.
func postTo(t *testing.T, s *server, path, body string) (int, map[string]any) {
	t.Helper()
	res, err := http.Post(s.base+path, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m), "%s", b)
	return res.StatusCode, m
}

func content(m map[string]any, chat bool) (string, string) {
	c := m["choices"].([]any)[0].(map[string]any)
	if chat {
		return c["message"].(map[string]any)["content"].(string), c["finish_reason"].(string)
	}
	return c["text"].(string), c["finish_reason"].(string)
}

// json_object, vLLM's guided_regex / guided_choice / guided_json and
// structured_outputs, on chat and completions.
func TestStructuredOutputKinds(t *testing.T) {
	s := start(t, nil, nil)
	chat := `{"model":"tiny","messages":[{"role":"user","content":"go"}],"temperature":1,"seed":%d,"max_tokens":80,%s}`
	comp := `{"model":"tiny","prompt":"go","temperature":1,"seed":%d,"max_tokens":80,%s}`
	date := regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}$`)
	for seed := range 10 {
		for _, c := range []struct {
			path, body string
			chat       bool
			check      func(string) bool
		}{
			{"/v1/chat/completions", fmt.Sprintf(chat, seed, `"response_format":{"type":"json_object"}`), true, func(o string) bool {
				var m map[string]any
				return json.Unmarshal([]byte(o), &m) == nil
			}},
			{"/v1/completions", fmt.Sprintf(comp, seed, `"guided_regex":"[0-9]{4}-[0-9]{2}-[0-9]{2}"`), false, date.MatchString},
			{"/v1/chat/completions", fmt.Sprintf(chat, seed, `"guided_choice":["red","green","blue"]`), true, func(o string) bool { return o == "red" || o == "green" || o == "blue" }},
			{"/v1/completions", fmt.Sprintf(comp, seed, `"guided_json":{"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":2}`), false, func(o string) bool {
				var a []int
				return json.Unmarshal([]byte(o), &a) == nil && len(a) == 2
			}},
			{"/v1/chat/completions", fmt.Sprintf(chat, seed, `"guided_json":"{\"type\":\"boolean\"}"`), true, func(o string) bool { return o == "true" || o == "false" }},
			{"/v1/chat/completions", fmt.Sprintf(chat, seed, `"structured_outputs":{"choice":["x","y"]}`), true, func(o string) bool { return o == "x" || o == "y" }},
			{"/v1/completions", fmt.Sprintf(comp, seed, `"structured_outputs":{"regex":"(ab|cd)+"}`), false, regexp.MustCompile(`^(ab|cd)+$`).MatchString},
			{"/v1/chat/completions", fmt.Sprintf(chat, seed, `"response_format":{"type":"text"}`), true, func(string) bool { return true }},
		} {
			code, m := postTo(t, s, c.path, c.body)
			require.Equal(t, 200, code, "%s: %v", c.body, m)
			out, reason := content(m, c.chat)
			require.True(t, c.check(out), "%s: output %q", c.body, out)
			if !strings.Contains(c.body, `"text"`) {
				require.Equal(t, "stop", reason, "%s: output %q", c.body, out)
			}
		}
	}
}

func TestStructuredOutputErrors(t *testing.T) {
	s := start(t, nil, nil)
	chat := `{"model":"tiny","messages":[{"role":"user","content":"go"}],"max_tokens":%d,%s}`
	for _, c := range []struct {
		max        int
		extra      string
		param, msg string
	}{
		{50, `"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"integer","minimum":1}}}`, "response_format.json_schema.schema", `"minimum" is not supported`},
		{50, `"response_format":{"type":"json_schema","json_schema":{"name":"x y","schema":{}}}`, "response_format.json_schema.name", "letters, digits"},
		{50, `"response_format":{"type":"json_schema"}`, "response_format.json_schema", "required"},
		{50, `"response_format":{"type":"yaml"}`, "response_format.type", `unknown type "yaml"`},
		{50, `"response_format":{"type":"json_object","bogus":1}`, "bogus", "unknown field"},
		{5, `"response_format":{"type":"json_schema","json_schema":{"name":"p","schema":` + personSchema + `}}`, "max_tokens", "needs at least 19 tokens"},
		{50, `"guided_regex":"a\\bb"`, "guided_regex", "word boundary"},
		{50, `"guided_choice":[]`, "guided_choice", "non-empty"},
		{50, `"guided_json":[1]`, "guided_json", "JSON Schema object"},
		{50, `"guided_regex":"a","guided_choice":["b"]`, "guided_choice", "only one structured output constraint"},
		{50, `"structured_outputs":{}`, "structured_outputs", "one of json, regex or choice"},
		{50, `"guided_json":{"$defs":{"n":{"type":"object","properties":{"n":{"$ref":"#/$defs/n"}}}},"$ref":"#/$defs/n"}`, "guided_json", "recursive"},
	} {
		code, m := postTo(t, s, "/v1/chat/completions", fmt.Sprintf(chat, c.max, c.extra))
		require.Equal(t, 400, code, "%s: %v", c.extra, m)
		e := m["error"].(map[string]any)
		require.Equal(t, c.param, e["param"], "%s: %v", c.extra, e)
		require.Contains(t, e["message"], c.msg, "%s", c.extra)
	}
	// max_completion_tokens is named when it is the limit given.
	code, m := postTo(t, s, "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"go"}],"max_completion_tokens":1,"response_format":{"type":"json_object"}}`)
	require.Equal(t, 400, code)
	require.Equal(t, "max_completion_tokens", m["error"].(map[string]any)["param"])
}

// openai-go's json_object request and a streamed json_schema reply.
func TestStructuredOutputStreams(t *testing.T) {
	s := start(t, nil, nil)
	p := chatParams("go", 60)
	p.Temperature = openai.Float(1)
	p.Seed = openai.Int(3)
	p.ResponseFormat = openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &openai.ResponseFormatJSONObjectParam{}}
	st := s.cli.Chat.Completions.NewStreaming(context.Background(), p, option.WithJSONSet("seed", 3))
	var sb bytes.Buffer
	reason := ""
	for st.Next() {
		if c := st.Current(); len(c.Choices) > 0 {
			sb.WriteString(c.Choices[0].Delta.Content)
			if c.Choices[0].FinishReason != "" {
				reason = c.Choices[0].FinishReason
			}
		}
	}
	require.NoError(t, st.Err())
	var m map[string]any
	require.NoError(t, json.Unmarshal(sb.Bytes(), &m), "%q", sb.String())
	require.Equal(t, "stop", reason)
}

// TestStructuredOutputChoices: n > 1 with a constraint gives every choice
// its own (sample.Restarter): each choice parses, and the sampled choices
// differ.
func TestStructuredOutputChoices(t *testing.T) {
	s := start(t, nil, nil)
	body := `{"model":"tiny","messages":[{"role":"user","content":"go"}],"temperature":1,"seed":7,"max_tokens":80,"n":2,` +
		`"response_format":{"type":"json_schema","json_schema":{"name":"pt","schema":{"type":"object","properties":{"x":{"type":"integer"},"tag":{"type":"string","maxLength":8}},"required":["x","tag"],"additionalProperties":false}}}}`
	code, m := postTo(t, s, "/v1/chat/completions", body)
	require.Equal(t, 200, code, "%v", m)
	choices := m["choices"].([]any)
	require.Len(t, choices, 2)
	seen := map[string]bool{}
	for i, c := range choices {
		msg := c.(map[string]any)["message"].(map[string]any)
		out, _ := msg["content"].(string)
		var v struct {
			X   *int    `json:"x"`
			Tag *string `json:"tag"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &v), "choice %d: %q", i, out)
		require.True(t, v.X != nil && v.Tag != nil && utf8.RuneCountInString(*v.Tag) <= 8, "choice %d: %q", i, out)
		require.Equal(t, "stop", c.(map[string]any)["finish_reason"], "choice %d", i)
		seen[out] = true
	}
	require.Greater(t, len(seen), 1, "two sampled choices, one output: %v", seen)
}
