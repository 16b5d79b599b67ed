package tokenizer

import (
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
// among those starting at one place, as Hugging Face does (Aho-Corasick,
// LeftmostLongest), in time linear in the text whatever the number of
// tokens: an Aho-Corasick automaton of the reversed contents, run over the
// text from its end, gives at every position the longest token that
// starts there (the longest pattern ending at each position of the
// reversed text), in one pass; the leftmost-longest matches are then read
// off left to right.
type addedMatcher struct {
	toks  []*addedToken
	root  [256]int32       // the root's transitions (0: none)
	edges map[uint64]int32 // (state, byte) → state, below the root
	fail  []int32          // failure link of each state
	out   []int32          // the longest token that is a suffix of the state's path (-1: none)
	depth []int32          // the state's path length
}

func edgeKey(state int32, c byte) uint64 { return uint64(uint32(state))<<8 | uint64(c) }

func (m *addedMatcher) child(state int32, c byte) int32 {
	if state == 0 {
		return m.root[c]
	}
	return m.edges[edgeKey(state, c)]
}

func newAddedMatcher(toks []*addedToken) *addedMatcher {
	if len(toks) == 0 {
		return nil
	}
	m := &addedMatcher{toks: toks, edges: map[uint64]int32{}, fail: []int32{0}, out: []int32{-1}, depth: []int32{0}}
	var children [][]int32 // state → its children, for the breadth-first pass
	children = append(children, nil)
	for ti, t := range toks {
		st := int32(0)
		for i := len(t.content) - 1; i >= 0; i-- {
			c := t.content[i]
			next := m.child(st, c)
			if next == 0 {
				next = int32(len(m.fail))
				m.fail, m.out, m.depth = append(m.fail, 0), append(m.out, -1), append(m.depth, m.depth[st]+1)
				children = append(children, nil)
				children[st] = append(children[st], next)
				if st == 0 {
					m.root[c] = next
				} else {
					m.edges[edgeKey(st, c)] = next
				}
			}
			st = next
		}
		if m.out[st] < 0 { // the first of equal contents wins, as before
			m.out[st] = int32(ti)
		}
	}
	// The byte on the edge into each state, to follow failure links.
	label := make([]byte, len(m.fail))
	for c, s := range m.root {
		if s != 0 {
			label[s] = byte(c)
		}
	}
	for k, s := range m.edges {
		label[s] = byte(k)
	}
	queue := append([]int32(nil), children[0]...)
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		if m.out[s] < 0 {
			m.out[s] = m.out[m.fail[s]] // the longest suffix that is a token
		}
		for _, c := range children[s] {
			f := m.fail[s]
			for {
				if n := m.child(f, label[c]); n != 0 {
					m.fail[c] = n
					break
				}
				if f == 0 {
					m.fail[c] = 0
					break
				}
				f = m.fail[f]
			}
			queue = append(queue, c)
		}
	}
	return m
}

// match is an added token found at a position of the text.
type match struct {
	pos int
	tok *addedToken
}

// longest returns, for every position of s where an added token starts,
// the longest one, in increasing order of position; steps counts the
// automaton's transitions and failure links followed (at most 2·len(s)).
func (m *addedMatcher) longest(s string) (ms []match, steps int) {
	st := int32(0)
	for i := len(s) - 1; i >= 0; i-- {
		c := s[i]
		for {
			steps++
			if n := m.child(st, c); n != 0 {
				st = n
				break
			}
			if st == 0 {
				break
			}
			st = m.fail[st]
		}
		if o := m.out[st]; o >= 0 {
			ms = append(ms, match{i, m.toks[o]})
		}
	}
	for i, j := 0, len(ms)-1; i < j; i, j = i+1, j-1 {
		ms[i], ms[j] = ms[j], ms[i]
	}
	return ms, steps
}

// piece is a part of the text: an added token's id, or text to tokenize.
type piece struct {
	text string
	id   int32 // -1 for text
}

func isWordChar(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) }

// split cuts s at the added tokens it contains (special tokens at s[b:e]
// for which asText holds are left as text), honouring single_word, lstrip and rstrip as
// Hugging Face's AddedVocabulary::find_matches does.
func (m *addedMatcher) split(out []piece, s string, asText func(b, e int) bool) []piece {
	if m == nil {
		return append(out, piece{s, -1})
	}
	ms, _ := m.longest(s)
	start := 0 // end of the last emitted piece
	i := 0     // where the next match may start
	for _, mt := range ms {
		if mt.pos < i {
			continue
		}
		tok := mt.tok
		b, e := mt.pos, mt.pos+len(tok.content)
		i = e // matches never overlap, whatever is done with them
		if tok.special && asText != nil && asText(b, e) {
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
