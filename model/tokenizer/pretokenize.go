package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// MatchTimeout bounds one search of a Split or Replace regex for its next
// match (regexp2's MatchTimeout; the regex engine backtracks, and a
// pattern such as (a+)+$ is exponential in the length of the text). Real
// tokenizer patterns find a match in microseconds; a search that takes
// longer fails the encoding with an error naming the pattern, as Hugging
// Face tokenizers bounds Oniguruma's retries. The two common patterns
// (fastsplit.go) do not use the regex engine and are linear.
const MatchTimeout = 100 * time.Millisecond

// isWhiteSpace is Unicode White_Space, the meaning of \s in the regex
// engine of Hugging Face tokenizers (Oniguruma) and of Rust's
// char::is_whitespace.
func isWhiteSpace(r rune) bool { return unicode.Is(unicode.White_Space, r) }

// matcher finds the non-overlapping matches of a Split or Replace pattern,
// left to right, as byte offsets.
type matcher interface {
	findAll(e *encoder, s string) [][2]int
}

type literal string

func (l literal) findAll(_ *encoder, s string) [][2]int {
	if l == "" {
		return nil
	}
	var out [][2]int
	for off := 0; ; {
		i := strings.Index(s[off:], string(l))
		if i < 0 {
			return out
		}
		out = append(out, [2]int{off + i, off + i + len(l)})
		off += i + len(l)
	}
}

// regex is a pattern run by the backtracking engine, each search for the
// next match bounded by MatchTimeout and the encoding's context checked
// between matches.
type regex struct {
	re    *regexp2.Regexp
	where string // the field it came from, for errors
}

func newRegex(expr, where string) (regex, error) {
	re, err := regexp2.Compile(expr, regexp2.None)
	if err != nil {
		return regex{}, err
	}
	re.MatchTimeout = MatchTimeout
	return regex{re, where}, nil
}

func (r regex) findAll(e *encoder, s string) [][2]int {
	if s == "" || e.failed() {
		return nil
	}
	runes := []rune(s) // s is valid UTF-8 (Encode makes it so)
	var out [][2]int
	ri, bi, prevEnd := 0, 0, -1 // rune and byte offsets walked so far
	err := r.re.FindRunesMatches(runes, 0, func(m regexp2.MatchView) bool {
		idx, n, _ := m.GroupRange(0)
		if n == 0 && idx == prevEnd {
			return !e.stopped() // an empty match right after a match (as FindAllStringIndex)
		}
		for ; ri < idx; ri++ {
			bi += utf8.RuneLen(runes[ri])
		}
		start := bi
		for ; ri < idx+n; ri++ {
			bi += utf8.RuneLen(runes[ri])
		}
		out = append(out, [2]int{start, bi})
		prevEnd = idx + n
		return !e.stopped()
	})
	if err != nil {
		// The engine's message quotes the whole input: name the pattern.
		e.fail(fmt.Errorf("%w: %s: no match found within %v (a pattern that backtracks catastrophically?)", ErrBudget, r.where, MatchTimeout))
	}
	return out
}

// pattern is a compiled Split or Replace pattern.
type pattern struct{ m matcher }

func (p pattern) replaceAll(e *encoder, s, with string) string {
	ms := p.m.findAll(e, s)
	if len(ms) == 0 {
		return s
	}
	var sb strings.Builder
	prev := 0
	for _, m := range ms {
		sb.WriteString(s[prev:m[0]])
		sb.WriteString(with)
		prev = m[1]
	}
	sb.WriteString(s[prev:])
	return sb.String()
}

func compilePattern(p patternJSON, where string) (pattern, error) {
	switch {
	case p.String != nil && p.Regex != nil:
		return pattern{}, fmt.Errorf("%s: both String and Regex", where)
	case p.String != nil:
		return pattern{literal(*p.String)}, nil
	case p.Regex != nil:
		if m, ok := fastMatcher(*p.Regex); ok {
			return pattern{m}, nil
		}
		re, err := newRegex(*p.Regex, where+".Regex")
		if err != nil {
			return pattern{}, fmt.Errorf("%s.Regex: %v", where, err)
		}
		return pattern{re}, nil
	}
	return pattern{}, fmt.Errorf("%s: want {\"String\": …} or {\"Regex\": …}", where)
}

// span is a piece of the text being pre-tokenized; match marks the pieces
// a pattern matched.
type span struct {
	s     string
	match bool
}

// behavior is how a Split treats the matches (SplitDelimiterBehavior).
type behavior int

const (
	removed behavior = iota
	isolated
	mergedWithPrevious
	mergedWithNext
	contiguous
)

var behaviors = map[string]behavior{
	"Removed": removed, "Isolated": isolated, "MergedWithPrevious": mergedWithPrevious,
	"MergedWithNext": mergedWithNext, "Contiguous": contiguous,
}

// splitBy cuts s at a matcher's matches as Hugging Face's
// NormalizedString::split does, appending the pieces to out.
func splitBy(e *encoder, out []string, s string, find func(*encoder, string) [][2]int, invert bool, b behavior) []string {
	if s == "" {
		return out
	}
	if b == isolated { // the common case: every match and every gap is a piece
		prev := 0
		for _, m := range find(e, s) {
			if prev != m[0] {
				out = append(out, s[prev:m[0]])
			}
			if m[0] != m[1] {
				out = append(out, s[m[0]:m[1]])
			}
			prev = m[1]
		}
		if prev != len(s) {
			out = append(out, s[prev:])
		}
		return out
	}
	var spans []span
	prev := 0
	for _, m := range find(e, s) {
		if prev != m[0] {
			spans = append(spans, span{s[prev:m[0]], invert})
		}
		spans = append(spans, span{s[m[0]:m[1]], !invert})
		prev = m[1]
	}
	if prev != len(s) {
		spans = append(spans, span{s[prev:], invert})
	}
	var merged []span
	switch b {
	case isolated:
		for _, sp := range spans {
			merged = append(merged, span{sp.s, false})
		}
	case removed:
		merged = spans
	case contiguous:
		prevMatch := false
		for _, sp := range spans {
			if sp.match == prevMatch && len(merged) > 0 {
				merged[len(merged)-1].s += sp.s
			} else {
				merged = append(merged, span{sp.s, false})
			}
			prevMatch = sp.match
		}
	case mergedWithPrevious:
		prevMatch := false
		for _, sp := range spans {
			if sp.match && !prevMatch && len(merged) > 0 {
				merged[len(merged)-1].s += sp.s
			} else {
				merged = append(merged, span{sp.s, false})
			}
			prevMatch = sp.match
		}
	case mergedWithNext:
		prevMatch := false
		for i := len(spans) - 1; i >= 0; i-- {
			sp := spans[i]
			if sp.match && !prevMatch && len(merged) > 0 {
				merged[len(merged)-1].s = sp.s + merged[len(merged)-1].s
			} else {
				merged = append(merged, span{sp.s, false})
			}
			prevMatch = sp.match
		}
		for i, j := 0, len(merged)-1; i < j; i, j = i+1, j-1 {
			merged[i], merged[j] = merged[j], merged[i]
		}
	}
	for _, sp := range merged {
		if !sp.match && sp.s != "" {
			out = append(out, sp.s)
		}
	}
	return out
}

// preStep is one pre-tokenizer: it cuts each piece into smaller ones.
type preStep func(e *encoder, out []string, piece string) []string

// gpt2Pattern is the ByteLevel pre-tokenizer's own regex (use_regex).
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// parsePreTokenizer returns the steps of a pre-tokenizer; the ByteLevel
// step (which must be last) is reported by sawByteLevel, and its byte
// mapping is done by the model.
func parsePreTokenizer(raw json.RawMessage, where string) (steps []preStep, sawByteLevel bool, err error) {
	if isNull(raw) {
		return nil, false, nil
	}
	typ, err := typeOf(raw, where)
	if err != nil {
		return nil, false, err
	}
	switch typ {
	case "Sequence":
		var v struct {
			Type          string            `json:"type"`
			PreTokenizers []json.RawMessage `json:"pretokenizers"`
		}
		if err := strict(raw, &v, where); err != nil {
			return nil, false, err
		}
		for i, p := range v.PreTokenizers {
			if sawByteLevel {
				return nil, false, fmt.Errorf("%s.pretokenizers[%d]: a step after ByteLevel is not supported", where, i)
			}
			s, bl, err := parsePreTokenizer(p, fmt.Sprintf("%s.pretokenizers[%d]", where, i))
			if err != nil {
				return nil, false, err
			}
			steps = append(steps, s...)
			sawByteLevel = bl
		}
		return steps, sawByteLevel, nil
	case "Split":
		var v struct {
			Type     string      `json:"type"`
			Pattern  patternJSON `json:"pattern"`
			Behavior string      `json:"behavior"`
			Invert   bool        `json:"invert"`
		}
		if err := strict(raw, &v, where); err != nil {
			return nil, false, err
		}
		p, err := compilePattern(v.Pattern, where+".pattern")
		if err != nil {
			return nil, false, err
		}
		b, ok := behaviors[v.Behavior]
		if !ok {
			return nil, false, fmt.Errorf("%s.behavior: unknown %q (have Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)", where, v.Behavior)
		}
		return []preStep{func(e *encoder, out []string, piece string) []string {
			return splitBy(e, out, piece, p.m.findAll, v.Invert, b)
		}}, false, nil
	case "Digits":
		var v struct {
			Type             string `json:"type"`
			IndividualDigits bool   `json:"individual_digits"`
		}
		if err := strict(raw, &v, where); err != nil {
			return nil, false, err
		}
		b := contiguous
		if v.IndividualDigits {
			b = isolated
		}
		return []preStep{func(e *encoder, out []string, piece string) []string {
			return splitBy(e, out, piece, findRunes(func(r rune) bool { return r >= '0' && r <= '9' }), false, b)
		}}, false, nil
	case "ByteLevel":
		var v struct {
			Type           string `json:"type"`
			AddPrefixSpace bool   `json:"add_prefix_space"`
			TrimOffsets    bool   `json:"trim_offsets"`
			UseRegex       *bool  `json:"use_regex"`
		}
		if err := strict(raw, &v, where); err != nil {
			return nil, false, err
		}
		if v.AddPrefixSpace {
			steps = append(steps, func(_ *encoder, out []string, piece string) []string {
				if !strings.HasPrefix(piece, " ") {
					piece = " " + piece
				}
				return append(out, piece)
			})
		}
		if v.UseRegex == nil || *v.UseRegex {
			re, err := newRegex(gpt2Pattern, where+" (ByteLevel's regex)")
			if err != nil {
				return nil, false, err
			}
			steps = append(steps, func(e *encoder, out []string, piece string) []string {
				return splitBy(e, out, piece, re.findAll, false, isolated)
			})
		}
		return steps, true, nil
	}
	return nil, false, fmt.Errorf("%s.type: unsupported pre-tokenizer %q (have Sequence, Split, Digits, ByteLevel)", where, typ)
}

// findRunes matches every single character for which f holds.
func findRunes(f func(rune) bool) func(*encoder, string) [][2]int {
	return func(_ *encoder, s string) [][2]int {
		var out [][2]int
		for i, r := range s {
			if f(r) {
				n := len(string(r))
				out = append(out, [2]int{i, i + n})
			}
		}
		return out
	}
}
