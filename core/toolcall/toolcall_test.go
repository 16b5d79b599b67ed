package toolcall

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

var weather = Tool{Name: "get_weather", Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"},"note":{"type":["string","null"]},"tags":{"type":"array"}}}`)}

// parse feeds out in pieces and returns the content and calls, with ids
// numbered in order.
func parse(t *testing.T, format string, max int, pieces ...string) (string, []Call, []Delta) {
	t.Helper()
	n := 0
	p, err := New(format, Options{Tools: []Tool{weather}, MaxCalls: max, NewID: func() string { n++; return fmt.Sprintf("call_%d", n) }})
	require.NoError(t, err)
	var ds []Delta
	for _, s := range pieces {
		ds = append(ds, p.Feed(s)...)
	}
	ds = append(ds, p.Flush()...)
	content, calls := Collect(ds)
	return content, calls, ds
}

type tcase struct {
	name    string
	max     int
	out     string
	content string
	calls   []Call
}

// The format of the brief and of GLM-4.5's template (a newline after the
// name and each tag), and GLM-4.7's (none).
const glmTwo = "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>\n<tool_call>get_weather<arg_key>city</arg_key><arg_value> Paris, \"FR\" </arg_value></tool_call>"

var glmCases = []tcase{
	{"two calls", 0, glmTwo, "Let me check.", []Call{
		{"call_1", "get_weather", `{"city":"Beijing","days":3}`},
		{"call_2", "get_weather", `{"city":" Paris, \"FR\" "}`},
	}},
	{"parallel off", 1, glmTwo, "Let me check.", []Call{{"call_1", "get_weather", `{"city":"Beijing","days":3}`}}},
	{"no arguments", 0, "<tool_call>now</tool_call>", "", []Call{{"call_1", "now", `{}`}}},
	{"JSON values and not", 0, "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>three</arg_value>\n<arg_key>tags</arg_key>\n<arg_value>[\"a\", 1]</arg_value>\n<arg_key>note</arg_key>\n<arg_value>42</arg_value>\n<arg_key>other</arg_key>\n<arg_value>{\"x\": null}</arg_value>\n</tool_call>", "",
		[]Call{{"call_1", "get_weather", `{"days":"three","tags":["a",1],"note":"42","other":{"x":null}}`}}},
	{"an unknown tool: values as JSON", 0, "<tool_call>other<arg_key>n</arg_key><arg_value>1.5</arg_value><arg_key>s</arg_key><arg_value>hi</arg_value></tool_call>", "", []Call{{"call_1", "other", `{"n":1.5,"s":"hi"}`}}},
	{"plain text", 0, "No tools needed: 2 < 3 and <tool is a word.", "No tools needed: 2 < 3 and <tool is a word.", nil},
	{"text after a call", 0, "<tool_call>now</tool_call>\nDone.\n", "Done.", []Call{{"call_1", "now", `{}`}}},
	{"cut inside the name: content", 0, "Hi <tool_call>get_wea", "Hi<tool_call>get_wea", nil},
	{"cut inside a value: the call closed", 0, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3", "", []Call{{"call_1", "get_weather", `{"city":"Beijing"}`}}},
	{"not a name: content", 0, "<tool_call><b>bold</b>", "<tool_call><b>bold</b>", nil},
	{"stray text between arguments", 0, "<tool_call>now\nxx <arg_key>a</arg_key><arg_value>1</arg_value> yy<arg_key>b</arg_key>zz<arg_value>2</arg_value></tool_call>", "", []Call{{"call_1", "now", `{"a":1}`}}}, // b: text between key and value, dropped (as vLLM's regex)
	{"white space only", 0, "  \n", "  \n", nil},
	{"unicode", 0, "天気<tool_call>get_weather<arg_key>city</arg_key><arg_value>北京 😀</arg_value></tool_call>", "天気", []Call{{"call_1", "get_weather", `{"city":"北京 😀"}`}}},
}

var jsonCases = []tcase{
	{"two calls", 0, "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Beijing\", \"days\": 3}}\n</tool_call>\n<tool_call>{\"name\":\"now\"}</tool_call>", "Checking.", []Call{
		{"call_1", "get_weather", `{"city":"Beijing","days":3}`},
		{"call_2", "now", `{}`},
	}},
	{"parallel off", 1, "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call><tool_call>{\"name\":\"b\"}</tool_call>", "", []Call{{"call_1", "a", `{}`}}},
	{"arguments as a string, parameters", 0, "<tool_call>{\"name\":\"a\",\"arguments\":\"{\\\"x\\\": 1}\"}</tool_call><tool_call>{\"name\":\"b\",\"parameters\":{\"y\":[2]}}</tool_call>", "", []Call{{"call_1", "a", `{"x":1}`}, {"call_2", "b", `{"y":[2]}`}}},
	{"not JSON: content", 0, "<tool_call>get_weather city=x</tool_call>", "<tool_call>get_weather city=x</tool_call>", nil},
	{"arguments not an object: content", 0, "<tool_call>{\"name\":\"a\",\"arguments\":[1]}</tool_call>", "<tool_call>{\"name\":\"a\",\"arguments\":[1]}</tool_call>", nil},
	{"cut off: content", 0, "<tool_call>{\"name\":\"a\"", "<tool_call>{\"name\":\"a\"", nil},
	{"plain text", 0, "a <tool b", "a <tool b", nil},
}

func TestGLM45(t *testing.T) { runCases(t, FormatGLM45, glmCases) }
func TestJSON(t *testing.T)  { runCases(t, FormatJSON, jsonCases) }

func runCases(t *testing.T, format string, cases []tcase) {
	for _, c := range cases {
		content, calls, ds := parse(t, format, c.max, c.out)
		require.Equal(t, c.content, content, c.name)
		require.Equal(t, c.calls, calls, c.name)
		for _, call := range calls {
			require.True(t, json.Valid([]byte(call.Arguments)), "%s: %s", c.name, call.Arguments)
		}
		// A call's first delta has its id and name, and no arguments.
		seen := map[int]bool{}
		for _, d := range ds {
			if d.Call && !seen[d.Index] {
				require.NotEmpty(t, d.ID, c.name)
				require.NotEmpty(t, d.Name, c.name)
				require.Empty(t, d.Arguments, c.name)
				seen[d.Index] = true
			}
		}
	}
}

// Cut in two at every byte, and byte by byte, the output parses as whole.
func TestSplitAnywhere(t *testing.T) {
	for format, cases := range map[string][]tcase{FormatGLM45: glmCases, FormatJSON: jsonCases} {
		for _, c := range cases {
			for i := 0; i <= len(c.out); i++ {
				content, calls, _ := parse(t, format, c.max, c.out[:i], c.out[i:])
				require.Equal(t, c.content, content, "%s %s cut at %d", format, c.name, i)
				require.Equal(t, c.calls, calls, "%s %s cut at %d", format, c.name, i)
			}
			var pieces []string
			for i := range len(c.out) {
				pieces = append(pieces, c.out[i:i+1])
			}
			content, calls, _ := parse(t, format, c.max, pieces...)
			require.Equal(t, c.content, content, "%s %s byte by byte", format, c.name)
			require.Equal(t, c.calls, calls, "%s %s byte by byte", format, c.name)
		}
	}
}

// A GLM call streams: its name as soon as it is whole, then each argument
// as its value closes.
func TestGLMStreamsIncrementally(t *testing.T) {
	p, err := New(FormatGLM45, Options{Tools: []Tool{weather}, NewID: func() string { return "call_x" }})
	require.NoError(t, err)
	require.Equal(t, []Delta{{Content: "Hi"}}, p.Feed("Hi\n<tool_call>get_weather\n<arg_"))
	require.Equal(t, []Delta{{Call: true, ID: "call_x", Name: "get_weather"}}, p.Feed("key>city</arg_key>\n<arg_value>Bei"))
	require.Equal(t, []Delta{{Call: true, Arguments: `{"city":"Beijing"`}}, p.Feed("jing</arg_value>\n"))
	require.Equal(t, []Delta{{Call: true, Arguments: "}"}}, p.Feed("</tool_call>"))
	require.Empty(t, p.Flush())
}

func TestSpecAndCheck(t *testing.T) {
	s := &Spec{Tools: []Tool{weather, {Name: "now"}}, Choice: Choice{Mode: ChoiceFunction, Name: "now"}, Format: FormatGLM45}
	require.True(t, s.Constrained())
	require.Equal(t, []Tool{{Name: "now"}}, s.Allowed())
	s.Choice = Choice{Mode: ChoiceRequired}
	require.Len(t, s.Allowed(), 2)
	require.True(t, s.Parses())
	s.Choice = Choice{Mode: ChoiceAuto}
	require.False(t, s.Constrained())
	s.Choice = Choice{Mode: ChoiceNone}
	require.False(t, s.Parses())
	require.False(t, (*Spec)(nil).Parses())
	require.NoError(t, Check("json"))
	require.ErrorContains(t, Check("hermes"), `"hermes" is not a tool-call parser (have none, glm45, json)`)
	_, err := New("none", Options{})
	require.Error(t, err)
	require.Regexp(t, `^call_[0-9a-f]{24}$`, NewID())
}

// Any output parses without a panic, to valid JSON arguments, the same
// whole and cut in two.
func FuzzParsers(f *testing.F) {
	for _, c := range append(append([]tcase{}, glmCases...), jsonCases...) {
		f.Add(c.out, uint(len(c.out)/2))
	}
	f.Fuzz(func(t *testing.T, out string, cut uint) {
		at := int(cut % uint(len(out)+1))
		for _, format := range []string{FormatGLM45, FormatJSON} {
			c1, k1, _ := parse(t, format, 0, out)
			c2, k2, _ := parse(t, format, 0, out[:at], out[at:])
			require.Equal(t, c1, c2)
			require.Equal(t, k1, k2)
			for _, k := range k1 {
				require.True(t, json.Valid([]byte(k.Arguments)), k.Arguments)
			}
		}
	})
}

// The text between <tool_call> and the first argument is bounded (a call
// whose name part is longer is content), the same whole and in pieces.
func TestLongNamePart(t *testing.T) {
	long := "<tool_call>now\n" + fmt.Sprintf("%300s", "") + "x<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>"
	c1, k1, _ := parse(t, FormatGLM45, 0, long)
	c2, k2, _ := parse(t, FormatGLM45, 0, long[:200], long[200:])
	require.Equal(t, c1, c2)
	require.Equal(t, k1, k2)
	require.Empty(t, k1)
	require.Contains(t, c1, "<tool_call>now")
}
