package tokenizer

import (
	"testing"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
	"github.com/stretchr/testify/require"
)

// The hand-written matchers find exactly the matches of the regex engine.
func FuzzFastSplit(f *testing.F) {
	for _, s := range []string{"Hello world", "it's I'LL 're", " \n\n  x\t\ty  ", "123456 ١٢٣", "a  \r\n\r\n b", "你好，世界！", "x\u3000\u3000y\u0085 ", "'", "' s", "  ...!!\n\nok", "\ufeffa", "😀😀 👍🏽"} {
		f.Add(s)
	}
	res := map[int]regex{1: {regexp2.MustCompile(qwenPattern, regexp2.None)}, 3: {regexp2.MustCompile(llama3Pattern, regexp2.None)}}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		for digits, re := range res {
			want, got := re.findAll(s), fastSplit{digits}.findAll(s)
			require.True(t, len(want) == len(got), "%q (\\p{N} × %d): %v vs %v", s, digits, want, got)
			for i := range want {
				require.Equal(t, want[i], got[i], "%q (\\p{N} × %d)", s, digits)
			}
		}
	})
}

func TestFastSplitOnCorpus(t *testing.T) {
	re := regex{regexp2.MustCompile(llama3Pattern, regexp2.None)}
	for i, s := range corpus(t) {
		want, got := re.findAll(s), fastSplit{3}.findAll(s)
		require.Equal(t, len(want), len(got), "string %d %q", i, s)
		for k := range want {
			require.Equal(t, want[k], got[k], "string %d %q", i, s)
		}
	}
}
