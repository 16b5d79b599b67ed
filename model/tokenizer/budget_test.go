package tokenizer

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func mustRegex(expr string) regex {
	r, err := newRegex(expr, "test")
	if err != nil {
		panic(err)
	}
	return r
}

// withSplit is tiny's tokenizer.json with its Split regex replaced.
func withSplit(t testing.TB, expr string) (*Tokenizer, error) {
	t.Helper()
	q, err := json.Marshal(expr)
	require.NoError(t, err)
	const old = `"Regex":" ?[^\\s]+|\\s+"`
	require.Contains(t, tiny(""), old)
	src := strings.Replace(tiny(""), old, `"Regex":`+string(q), 1)
	return Parse([]byte(src))
}

// A pattern that backtracks exponentially ((a+)+$ on "aaa…ab": 2^40
// paths) is an error naming the pattern, not a CPU burnt for ever (the
// old code, with no match timeout, did not return).
func TestCatastrophicSplitPatternIsAnError(t *testing.T) {
	tk, err := withSplit(t, `(a+)+$`)
	require.NoError(t, err)
	text := strings.Repeat("a", 40) + "b"
	start := time.Now()
	_, err = tk.EncodeContext(context.Background(), text, Options{})
	require.ErrorIs(t, err, ErrBudget)
	require.ErrorContains(t, err, "pre_tokenizer.pretokenizers[0].pattern.Regex")
	require.NotContains(t, err.Error(), text, "the error does not quote the prompt")
	// Generous (the budget is MatchTimeout per match, plus the engine's
	// clock granularity): it proves a bound, not a speed.
	require.Less(t, time.Since(start), 20*MatchTimeout)
	// Encode (trusted text) leaves what the pattern did not reach unsplit.
	require.Equal(t, text, tk.Decode(tk.Encode(text, Options{}), false))
}

// EncodeContext stops when the context is done and when the token limit
// is passed, before encoding the rest.
func TestEncodeContextStops(t *testing.T) {
	tk, err := Parse([]byte(tiny("")))
	require.NoError(t, err)
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(fmt.Errorf("the client left"))
	_, err = tk.EncodeContext(ctx, "hello world", Options{})
	require.ErrorContains(t, err, "the client left")

	text := strings.Repeat("hello world<|end|>", 1000)
	n := len(tk.Encode(text, Options{AddSpecial: true}))
	ids, err := tk.EncodeContext(context.Background(), text, Options{MaxTokens: n - 1, AddSpecial: true})
	require.ErrorIs(t, err, ErrTooManyTokens)
	require.Nil(t, ids)
	ids, err = tk.EncodeContext(context.Background(), text, Options{MaxTokens: n, AddSpecial: true})
	require.NoError(t, err)
	require.Equal(t, tk.Encode(text, Options{AddSpecial: true}), ids)
}

// oldMatcher is the added-token matcher before Aho-Corasick (one
// HasPrefix per token with the same first byte, at every position): the
// oracle of the new one. compares counts its HasPrefix calls.
type oldMatcher struct {
	first    [256]bool
	byByte   [256][]*addedToken
	compares int
}

func newOldMatcher(toks []*addedToken) *oldMatcher {
	m := &oldMatcher{}
	for _, t := range toks {
		b := t.content[0]
		m.first[b] = true
		m.byByte[b] = append(m.byByte[b], t)
	}
	for b := range m.byByte {
		sort.SliceStable(m.byByte[b], func(i, j int) bool { return len(m.byByte[b][i].content) > len(m.byByte[b][j].content) })
	}
	return m
}

func (m *oldMatcher) split(out []piece, s string, skipSpecial bool) []piece {
	start := 0
	for i := 0; i < len(s); {
		if !m.first[s[i]] {
			i++
			continue
		}
		var tok *addedToken
		for _, t := range m.byByte[s[i]] {
			m.compares++
			if strings.HasPrefix(s[i:], t.content) {
				tok = t
				break
			}
		}
		if tok == nil {
			i++
			continue
		}
		b, e := i, i+len(tok.content)
		i = e
		if skipSpecial && tok.special {
			continue
		}
		if tok.singleWord {
			before, _ := utf8.DecodeLastRuneInString(s[:b])
			after, _ := utf8.DecodeRuneInString(s[e:])
			if (b > 0 && isWordChar(before)) || (e < len(s) && isWordChar(after)) {
				continue
			}
		}
		if tok.lstrip {
			b = max(len(strings.TrimRightFunc(s[:b], unicode.IsSpace)), start)
		}
		if tok.rstrip {
			e = len(s) - len(strings.TrimLeftFunc(s[e:], unicode.IsSpace))
			i = e
		}
		if start < b {
			out = append(out, piece{s[start:b], -1})
		}
		out = append(out, piece{id: tok.id})
		start = e
	}
	if start < len(s) {
		out = append(out, piece{s[start:], -1})
	}
	return out
}

// randomTokens draws n added tokens over a small alphabet (so that they
// overlap, nest and share prefixes and suffixes), with random flags.
func randomTokens(r *rand.Rand, n int) []*addedToken {
	const alphabet = "ab<|> é"
	runes := []rune(alphabet)
	var toks []*addedToken
	for i := range n {
		var sb strings.Builder
		for range 1 + r.IntN(5) {
			sb.WriteRune(runes[r.IntN(len(runes))])
		}
		toks = append(toks, &addedToken{id: int32(1000 + i), content: sb.String(),
			singleWord: r.IntN(4) == 0, lstrip: r.IntN(4) == 0, rstrip: r.IntN(4) == 0, special: r.IntN(2) == 0})
	}
	return toks
}

func randomText(r *rand.Rand, n int) string {
	runes := []rune("ab<|> éx\n")
	var sb strings.Builder
	for range n {
		sb.WriteRune(runes[r.IntN(len(runes))])
	}
	return sb.String()
}

// The Aho-Corasick matcher cuts text exactly as the old one did, flags
// included, on random token sets and texts.
func TestAddedMatcherMatchesOldOnRandomInputs(t *testing.T) {
	r := rand.New(rand.NewPCG(37, 2))
	for round := range 3000 {
		toks := randomTokens(r, 1+r.IntN(12))
		s := randomText(r, r.IntN(60))
		skip := r.IntN(2) == 0
		want := newOldMatcher(toks).split(nil, s, skip)
		got := newAddedMatcher(toks).split(nil, s, func(int, int) bool { return skip })
		if !slices.Equal(want, got) {
			var cs []string
			for _, tk := range toks {
				cs = append(cs, fmt.Sprintf("%q%+v", tk.content, *tk))
			}
			t.Fatalf("round %d, %q skipSpecial=%v, tokens %v:\n old %v\n new %v", round, s, skip, cs, want, got)
		}
	}
}

func FuzzAddedMatcher(f *testing.F) {
	f.Add(uint64(1), "ab<|>ab")
	f.Add(uint64(2), "<<||>>  é")
	f.Fuzz(func(t *testing.T, seed uint64, s string) {
		r := rand.New(rand.NewPCG(seed, 0))
		toks := randomTokens(r, 1+r.IntN(20))
		for _, skip := range []bool{false, true} {
			require.Equal(t, newOldMatcher(toks).split(nil, s, skip), newAddedMatcher(toks).split(nil, s, func(int, int) bool { return skip }), "%q", s)
		}
	})
}

// manyTokens is 8,192 added tokens that all start with "<|" (the old
// matcher compared each of them at every "<") and a text of 1 MB full of
// near misses and hits.
func manyTokens() ([]*addedToken, string) {
	var toks []*addedToken
	for i := range 8192 {
		toks = append(toks, &addedToken{id: int32(i), content: fmt.Sprintf("<|tok_%05d|>", i), special: true})
	}
	var sb strings.Builder
	for i := 0; sb.Len() < 1<<20; i++ {
		fmt.Fprintf(&sb, "<|tok_%05d| <|tok_%05d|> x ", i%9000, i%8192)
	}
	return toks, sb.String()
}

// Linear: the new matcher takes at most two automaton steps per byte of
// text, whatever the number of tokens; the old one compared thousands of
// tokens per "<" (counted on a 64 KB prefix: more than 100 per byte).
func TestAddedMatcherIsLinear(t *testing.T) {
	toks, text := manyTokens()
	m := newAddedMatcher(toks)
	ms, steps := m.longest(text)
	require.LessOrEqual(t, steps, 2*len(text))
	require.NotEmpty(t, ms)
	old := newOldMatcher(toks)
	prefix := text[:64<<10]
	old.split(nil, prefix, false)
	require.Greater(t, old.compares, 100*len(prefix), "the oracle is quadratic: the comparison is meaningful")
	require.Equal(t, old.split(nil, prefix, false), m.split(nil, prefix, nil))
}

// go test ./model/tokenizer -run '^$' -bench AddedTokens
func BenchmarkAddedTokens(b *testing.B) {
	toks, text := manyTokens()
	m := newAddedMatcher(toks)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		m.split(nil, text, nil)
	}
}

// Any Split pattern, on any text, encodes or fails within a budget: the
// pattern compiles or is refused at load, and EncodeContext returns (ids
// or an error) before the context's deadline has long passed.
func FuzzSplitPattern(f *testing.F) {
	for _, c := range [][2]string{
		{`(a+)+$`, strings.Repeat("a", 30) + "!"},
		{`(x+x+)+y`, strings.Repeat("x", 30)},
		{`(?=(a*)*b)`, "aaaaaaaaaaaaaaaaaaaaaaaaa"},
		{` ?[^\s]+|\s+`, "hello world"},
		{qwenPattern, "it's 123 你好"},
		{`(\w|\d)+\1$`, "1234567890123456789012345678"},
	} {
		f.Add(c[0], c[1])
	}
	f.Fuzz(func(t *testing.T, expr, text string) {
		if len(expr) > 64 || len(text) > 128 {
			return
		}
		tk, err := withSplit(t, expr)
		if err != nil {
			return // refused at load, with the field named
		}
		const budget = 300 * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		start := time.Now()
		_, _ = tk.EncodeContext(ctx, text, Options{MaxTokens: 1 << 12})
		require.Less(t, time.Since(start), budget+4*MatchTimeout, "pattern %q on %q", expr, text)
	})
}

// TextSpans: special tokens inside a span are text, outside they stay
// tokens; a token straddling a span's edge is text.
func TestTextSpans(t *testing.T) {
	tk, err := Parse([]byte(tiny("")))
	require.NoError(t, err)
	text := "<|end|>a<|end|>b<|end|>"
	ids := tk.Encode(text, Options{TextSpans: [][2]int{{8, 15}}})
	require.Equal(t, int32(259), ids[0])
	require.Equal(t, int32(259), ids[len(ids)-1])
	require.Equal(t, 2, strings.Count(fmt.Sprint(ids), "259"), "%v", ids)
	require.Equal(t, text, tk.Decode(ids, false))
	ids = tk.Encode(text, Options{TextSpans: [][2]int{{0, 3}, {20, 21}}})
	require.NotContains(t, ids[:1], int32(259))
	require.Equal(t, 1, strings.Count(fmt.Sprint(ids), "259"), "%v", ids)
	require.True(t, tk.HasSpecialText("x<|end|>"))
	require.False(t, tk.HasSpecialText("x<tool>"), "<tool> is not special")
}
