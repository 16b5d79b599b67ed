package tokenizer

import (
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// The hand-written matchers find exactly the matches of the regex engine.
func FuzzFastSplit(f *testing.F) {
	for _, s := range []string{"Hello world", "it's I'LL 're", " \n\n  x\t\ty  ", "123456 ١٢٣", "a  \r\n\r\n b", "你好，世界！", "x\u3000\u3000y\u0085 ", "'", "' s", "  ...!!\n\nok", "\ufeffa", "😀😀 👍🏽"} {
		f.Add(s)
	}
	res := map[int]regex{1: mustRegex(qwenPattern), 3: mustRegex(llama3Pattern)}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		for digits, re := range res {
			want, got := re.findAll(nil, s), fastSplit{digits}.findAll(nil, s)
			require.True(t, len(want) == len(got), "%q (\\p{N} × %d): %v vs %v", s, digits, want, got)
			for i := range want {
				require.Equal(t, want[i], got[i], "%q (\\p{N} × %d)", s, digits)
			}
		}
	})
}

func TestFastSplitOnCorpus(t *testing.T) {
	re := mustRegex(llama3Pattern)
	for i, s := range corpus(t) {
		want, got := re.findAll(nil, s), fastSplit{3}.findAll(nil, s)
		require.Equal(t, len(want), len(got), "string %d %q", i, s)
		for k := range want {
			require.Equal(t, want[k], got[k], "string %d %q", i, s)
		}
	}
}
