package reasoning

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// split feeds out in the given pieces and returns the reasoning and the
// content, whole.
func split(opened bool, pieces ...string) (string, string) {
	p := New(opened)
	var r, c string
	for _, s := range pieces {
		a, b := p.Feed(s)
		r, c = r+a, c+b
	}
	a, b := p.Flush()
	return r + a, c + b
}

var cases = []struct {
	name      string
	opened    bool
	out       string
	reasoning string
	content   string
}{
	{"block then answer", false, "\n<think>Let me see.\nOK.</think>\nThe answer is 4.", "Let me see.\nOK.", "The answer is 4."},
	{"no block", false, "Just an answer <think>not reasoning</think>", "", "Just an answer <think>not reasoning</think>"},
	{"opened by the prompt", true, "hmm</think>\n\nDone", "hmm", "Done"},
	{"opened, never closed", true, "still thinking <", "still thinking <", ""},
	{"block never closed", false, "<think>cut off", "cut off", ""},
	{"empty block (thinking off)", false, "<think></think>answer", "", "answer"},
	{"only white space", false, " \n", "", " \n"},
	{"a cut tag at the end", false, "<thi", "", "<thi"},
	{"text like a tag", false, "<thinking>x", "", "<thinking>x"},
	{"a later block is content", false, "<think>a</think>b<think>c</think>", "a", "b<think>c</think>"},
	{"nothing after the block", false, "<think>a</think>\n", "a", ""},
	{"a close tag inside the answer", false, "a</think>b", "", "a</think>b"},
	{"unicode", false, "<think>思考 😀</think>答え", "思考 😀", "答え"},
	{"empty", false, "", "", ""},
}

func TestWhole(t *testing.T) {
	for _, c := range cases {
		r, ct := split(c.opened, c.out)
		require.Equal(t, c.reasoning, r, c.name)
		require.Equal(t, c.content, ct, c.name)
	}
}

// Every way of cutting the output in two, and byte by byte, gives the
// whole output's split.
func TestSplitAnywhere(t *testing.T) {
	for _, c := range cases {
		for i := 0; i <= len(c.out); i++ {
			r, ct := split(c.opened, c.out[:i], c.out[i:])
			require.Equal(t, c.reasoning, r, "%s cut at %d", c.name, i)
			require.Equal(t, c.content, ct, "%s cut at %d", c.name, i)
		}
		var bytes []string
		for i := range len(c.out) {
			bytes = append(bytes, c.out[i:i+1])
		}
		r, ct := split(c.opened, bytes...)
		require.Equal(t, c.reasoning, r, "%s byte by byte", c.name)
		require.Equal(t, c.content, ct, "%s byte by byte", c.name)
	}
}

// Text is released as soon as no tag can be pending in it.
func TestReleasesEarly(t *testing.T) {
	p := New(false)
	r, c := p.Feed("<think>abc")
	require.Equal(t, "abc", r)
	require.Empty(t, c)
	r, _ = p.Feed("de</thi")
	require.Equal(t, "de", r)
	r, c = p.Feed("nk> x")
	require.Empty(t, r)
	require.Equal(t, "x", c)
	_, c = p.Feed(" <think>")
	require.Equal(t, " <think>", c)
}

func TestPromptOpensAndCheck(t *testing.T) {
	require.True(t, PromptOpens("<|assistant|><think>"))
	require.True(t, PromptOpens("<|assistant|>\n<think>\n"))
	require.False(t, PromptOpens("<|assistant|>\n<think></think>"))
	require.False(t, PromptOpens("<|assistant|>"))
	require.NoError(t, Check("glm45"))
	require.NoError(t, Check("none"))
	require.ErrorContains(t, Check("deepseek"), `"deepseek" is not a reasoning parser (have none, glm45)`)
}

// Any output splits without a panic, the same whole and cut in two, and
// nothing is lost but the white space the rules drop.
func FuzzSplit(f *testing.F) {
	for _, c := range cases {
		f.Add(c.out, uint(len(c.out)/2), c.opened)
	}
	f.Fuzz(func(t *testing.T, out string, cut uint, opened bool) {
		at := int(cut % uint(len(out)+1))
		r1, c1 := split(opened, out)
		r2, c2 := split(opened, out[:at], out[at:])
		require.Equal(t, r1, r2)
		require.Equal(t, c1, c2)
		require.LessOrEqual(t, len(r1)+len(c1), len(out))
	})
}
