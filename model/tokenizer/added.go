package tokenizer

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is an entry of tokenizer.json's added_tokens: text that is
// always one token, never split by the model.
type addedToken struct {
	id                         int32
	content                    string
	singleWord, lstrip, rstrip bool
	normalized, special        bool
}

// addedMatcher finds added tokens in text, leftmost first and longest
// among those starting at one place (Hugging Face uses Aho-Corasick with
// LeftmostLongest).
type addedMatcher struct {
	first  [256]bool
	byByte [256][]*addedToken // by first byte, longest content first
}

func newAddedMatcher(toks []*addedToken) *addedMatcher {
	if len(toks) == 0 {
		return nil
	}
	m := &addedMatcher{}
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

// piece is a part of the text: an added token's id, or text to tokenize.
type piece struct {
	text string
	id   int32 // -1 for text
}

func isWordChar(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) }

// split cuts s at the added tokens it contains (skipSpecial: special
// tokens are left as text), honouring single_word, lstrip and rstrip as
// Hugging Face's AddedVocabulary::find_matches does.
func (m *addedMatcher) split(out []piece, s string, skipSpecial bool) []piece {
	if m == nil {
		return append(out, piece{s, -1})
	}
	start := 0 // end of the last emitted piece
	for i := 0; i < len(s); {
		if !m.first[s[i]] {
			i++
			continue
		}
		var tok *addedToken
		for _, t := range m.byByte[s[i]] {
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
		i = e // matches never overlap, whatever is done with them
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
