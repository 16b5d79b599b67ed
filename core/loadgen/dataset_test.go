package loadgen

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseJSONL(t *testing.T) {
	in := `{"prompt": "Once upon a time", "output_len": 12}

{"prompt": [1, 2, 3]}
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], "output_len": 4}` + "\r\n"
	got, err := ParseJSONL(strings.NewReader(in), "d.jsonl", 7)
	require.NoError(t, err)
	require.Equal(t, []Request{
		{PromptText: "Once upon a time", OutputLen: 12},
		{PromptIDs: []int32{1, 2, 3}, PromptLen: 3, OutputLen: 7},
		{Messages: []Message{{"system", "Be brief."}, {"user", "Hi"}}, OutputLen: 4},
	}, got)
}

// Every bad line is refused with the file, its line number and what is
// wrong.
func TestParseJSONLErrorsNameTheLine(t *testing.T) {
	good := `{"prompt": "ok"}` + "\n"
	for line, want := range map[string]string{
		`{"prompt": "x", "max_tokens": 3}`: `d.jsonl:2: unknown key "max_tokens" (want prompt or messages, and output_len)`,
		`{"prompt": "x"`:                   "d.jsonl:2: invalid JSON",
		`[1, 2]`:                           "d.jsonl:2: want a JSON object, got JSON array",
		`"text"`:                           "d.jsonl:2: want a JSON object, got JSON string",
		`{}`:                               "d.jsonl:2: prompt or messages: required",
		`{"prompt": null}`:                 "d.jsonl:2: prompt or messages: required",
		`{"prompt": ""}`:                   "d.jsonl:2: prompt: empty",
		`{"prompt": []}`:                   "d.jsonl:2: prompt: empty list of token ids",
		`{"prompt": [1, -2]}`:              "d.jsonl:2: prompt[1]: want a token id (an integer in [0, 2147483647]), got -2",
		`{"prompt": [1.5]}`:                "d.jsonl:2: prompt[0]: want a token id",
		`{"prompt": [3e10]}`:               "d.jsonl:2: prompt[0]: want a token id",
		`{"prompt": ["a"]}`:                "d.jsonl:2: prompt: want a string or a list of token ids (non-negative integers)",
		`{"prompt": 5}`:                    "d.jsonl:2: prompt: want a string or a list of token ids, got JSON number",
		`{"prompt": "x", "messages": []}`:  "d.jsonl:2: prompt and messages: give one of them, not both",
		`{"messages": []}`:                 "d.jsonl:2: messages: empty list",
		`{"messages": {"role": "user"}}`:   "d.jsonl:2: messages: want a list of {role, content} objects, got JSON object",
		`{"messages": [{"role": "user", "content": 3}]}`:         "d.jsonl:2: messages[0]: want {\"role\": string, \"content\": string}",
		`{"messages": [{"content": "x"}]}`:                       "d.jsonl:2: messages[0].role: required",
		`{"messages": [{"role": "u", "name": "x"}]}`:             "d.jsonl:2: messages[0]: want",
		`{"prompt": "x", "output_len": 0}`:                       "d.jsonl:2: output_len: must be in [1, 16777216], got 0",
		`{"prompt": "x", "output_len": 2.5}`:                     "d.jsonl:2: output_len: want an integer",
		`{"prompt": "x", "output_len": "3"}`:                     "d.jsonl:2: output_len: want an integer, got JSON string",
		`{"prompt": "x"} {"prompt": "y"}`:                        "d.jsonl:2: more than one JSON value on the line",
		`{"prompt": "x"} ]`:                                      "d.jsonl:2: trailing data after the JSON object",
		`{"prompt": "x", "prompt": "y", "output_len": 99999999}`: "d.jsonl:2: output_len: must be in [1, 16777216]",
	} {
		_, err := ParseJSONL(strings.NewReader(good+line+"\n"+good), "d.jsonl", 5)
		require.Error(t, err, line)
		require.Contains(t, err.Error(), want, line)
	}
	_, err := ParseJSONL(strings.NewReader("\n  \n"), "d.jsonl", 5)
	require.ErrorContains(t, err, "d.jsonl: no prompts (every line blank)")
	long := `{"prompt": "` + strings.Repeat("a", MaxLineBytes) + `"}`
	_, err = ParseJSONL(strings.NewReader(good+good+long), "d.jsonl", 5)
	require.ErrorContains(t, err, "d.jsonl:3: line longer than 33554432 bytes")
}

// The parser never panics and, when it accepts a file, every request has a
// prompt of one kind and an output length in range.
func FuzzParseJSONL(f *testing.F) {
	for _, s := range []string{
		`{"prompt": "a"}`, `{"prompt": [1,2]}` + "\n" + `{"messages":[{"role":"user","content":"x"}],"output_len":3}`,
		`{"prompt": [1e3]}`, "\n\n", `{"prompt":"x"}{}`, `{"messages":[{"role":"","content":""}]}`, "\xff\xfe",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		reqs, err := ParseJSONL(bytes.NewReader(b), "fuzz", 9)
		if err != nil {
			require.True(t, strings.HasPrefix(err.Error(), "fuzz"), err.Error())
			return
		}
		require.NotEmpty(t, reqs)
		for _, r := range reqs {
			kinds := 0
			if len(r.PromptIDs) > 0 {
				kinds++
				require.Equal(t, len(r.PromptIDs), r.PromptLen)
			}
			if r.PromptText != "" {
				kinds++
			}
			if len(r.Messages) > 0 {
				kinds++
			}
			require.Equal(t, 1, kinds)
			require.True(t, r.OutputLen >= 1 && r.OutputLen <= MaxOutputLen)
		}
	})
}
