// Package grammar compiles structured-output grammars (regular
// expressions, a JSON Schema subset, any JSON object, a choice of strings,
// GLM tool calls) into a byte-level automaton, determinizes it lazily and
// turns each of its states into a mask over a tokenizer's vocabulary, so a
// scheduler can restrict every sampled token (core/sched's Constraint).
//
// Everything is compiled to one form: a byte-level NFA built in
// continuation-passing style (a piece is compiled knowing the state that
// follows it, so shared tails are shared states), from which a DFA is
// determinized on demand (dfa.go). Masks are budget-aware: each NFA state
// knows its shortest distance, in bytes, to acceptance, and a token is
// allowed only when the state it leads to can still accept within the
// tokens left (every single byte being a token of its own).
package grammar

import (
	"errors"
	"fmt"
	"regexp/syntax"
)

// MaxNFAStates bounds one grammar's automaton (a schema or regex that
// needs more is refused as too large).
const MaxNFAStates = 1 << 18

// errTooLarge is what a builder that hits MaxNFAStates reports.
var errTooLarge = fmt.Errorf("the grammar needs more than %d automaton states", MaxNFAStates)

// edge is a byte-range transition.
type edge struct {
	lo, hi byte
	to     int32
}

// nstate is one NFA state: byte edges, epsilon moves, acceptance.
type nstate struct {
	edges  []edge
	eps    []int32
	accept bool
}

// nfa is a byte-level NFA under construction; state 0 accepts.
type nfa struct {
	states []nstate
	err    error                     // sticky: the first failure
	parsed map[string]*syntax.Regexp // regex → its simplified parse
}

func newNFA() *nfa {
	n := &nfa{}
	n.states = append(n.states, nstate{accept: true})
	return n
}

// accept is the accepting state (nothing may follow it).
const acceptState = 0

func (n *nfa) add(s nstate) int32 {
	if len(n.states) >= MaxNFAStates {
		if n.err == nil {
			n.err = errTooLarge
		}
		return acceptState
	}
	n.states = append(n.states, s)
	return int32(len(n.states) - 1)
}

// fail records the first error.
func (n *nfa) fail(err error) {
	if n.err == nil {
		n.err = err
	}
}

// lit is the literal bytes s, then next.
func (n *nfa) lit(s string, next int32) int32 {
	for i := len(s) - 1; i >= 0; i-- {
		next = n.add(nstate{edges: []edge{{s[i], s[i], next}}})
	}
	return next
}

// alt is any of the pieces (each compiled onto next).
func (n *nfa) alt(next int32, pieces ...func(next int32) int32) int32 {
	s := nstate{}
	for _, p := range pieces {
		s.eps = append(s.eps, p(next))
	}
	return n.add(s)
}

// eps is an epsilon state to the given states.
func (n *nfa) eps(to ...int32) int32 { return n.add(nstate{eps: to}) }

// star is zero or more of piece, then next.
func (n *nfa) star(piece func(next int32) int32, next int32) int32 {
	loop := n.add(nstate{})
	body := piece(loop)
	n.states[loop].eps = []int32{body, next}
	return loop
}

// repeat is min..max copies of piece (max < 0: unbounded), then next.
func (n *nfa) repeat(piece func(next int32) int32, min, max int, next int32) int32 {
	tail := next
	if max < 0 {
		tail = n.star(piece, next)
	} else {
		for range max - min {
			if n.err != nil {
				return acceptState
			}
			tail = n.eps(piece(tail), next)
		}
	}
	for range min {
		if n.err != nil {
			return acceptState
		}
		tail = piece(tail)
	}
	return tail
}

// sep is min..max copies of piece separated by the literal s (max < 0:
// unbounded), then next.
func (n *nfa) sep(piece func(next int32) int32, s string, min, max int, next int32) int32 {
	if max == 0 {
		return next
	}
	if max < 0 && min <= 1 {
		// One copy of piece: after it, the separator loops back to it.
		after := n.add(nstate{})
		body := piece(after)
		n.states[after].eps = []int32{n.lit(s, body), next}
		if min == 0 {
			return n.eps(body, next)
		}
		return body
	}
	more := func(next int32) int32 { return n.lit(s, piece(next)) }
	first := min
	if first < 1 {
		first = 1
	}
	rest := n.repeat(more, first-1, max-1, next)
	body := piece(rest)
	if min == 0 {
		return n.eps(body, next)
	}
	return body
}

// runes is one UTF-8 encoded rune in [lo, hi] (surrogates excluded), then
// next.
func (n *nfa) runes(ranges [][2]rune, next int32) int32 {
	var seqs [][][2]byte
	for _, r := range ranges {
		seqs = utf8Sequences(seqs, r[0], r[1])
	}
	if len(seqs) == 0 {
		return n.add(nstate{}) // matches nothing
	}
	s := nstate{}
	for _, seq := range seqs {
		to := next
		for i := len(seq) - 1; i >= 1; i-- {
			to = n.add(nstate{edges: []edge{{seq[i][0], seq[i][1], to}}})
		}
		s.edges = append(s.edges, edge{seq[0][0], seq[0][1], to})
	}
	return n.add(s)
}

// utf8Sequences appends the byte-range sequences that encode exactly the
// runes of [lo, hi] (surrogates excluded): each sequence is one range per
// byte of the encoding.
func utf8Sequences(out [][][2]byte, lo, hi rune) [][][2]byte {
	if lo > hi || lo > 0x10FFFF {
		return out
	}
	if hi > 0x10FFFF {
		hi = 0x10FFFF
	}
	// Surrogates are not encodable.
	if lo <= 0xDFFF && hi >= 0xD800 {
		if lo < 0xD800 {
			out = utf8Sequences(out, lo, 0xD7FF)
		}
		if hi > 0xDFFF {
			out = utf8Sequences(out, 0xE000, hi)
		}
		return out
	}
	// One encoded length at a time.
	for _, m := range []rune{0x7F, 0x7FF, 0xFFFF} {
		if lo <= m && m < hi {
			out = utf8Sequences(out, lo, m)
			return utf8Sequences(out, m+1, hi)
		}
	}
	if hi <= 0x7F {
		return append(out, [][2]byte{{byte(lo), byte(hi)}})
	}
	// Split until every continuation byte ranges fully where the leading
	// bytes differ.
	for i := 1; i < 4; i++ {
		m := rune(1)<<(6*i) - 1
		if lo&^m != hi&^m {
			if lo&m != 0 {
				out = utf8Sequences(out, lo, lo|m)
				return utf8Sequences(out, (lo|m)+1, hi)
			}
			if hi&m != m {
				out = utf8Sequences(out, lo, (hi&^m)-1)
				return utf8Sequences(out, hi&^m, hi)
			}
		}
	}
	a, b := encode(lo), encode(hi)
	seq := make([][2]byte, len(a))
	for i := range a {
		seq[i] = [2]byte{a[i], b[i]}
	}
	return append(out, seq)
}

func encode(r rune) []byte {
	switch {
	case r < 0x80:
		return []byte{byte(r)}
	case r < 0x800:
		return []byte{0xC0 | byte(r>>6), 0x80 | byte(r&0x3F)}
	case r < 0x10000:
		return []byte{0xE0 | byte(r>>12), 0x80 | byte(r>>6&0x3F), 0x80 | byte(r&0x3F)}
	}
	return []byte{0xF0 | byte(r>>18), 0x80 | byte(r>>12&0x3F), 0x80 | byte(r>>6&0x3F), 0x80 | byte(r&0x3F)}
}

// unreachable is the distance of a state that cannot accept.
const unreachable = int32(1<<31 - 1)

// distances is each state's shortest distance to acceptance in bytes
// (unreachable when none): a reverse breadth-first search, epsilon moves
// costing nothing (0-1 BFS over a deque).
func (n *nfa) distances() []int32 {
	type rev struct {
		from int32
		w    int32
	}
	in := make([][]rev, len(n.states))
	for i, s := range n.states {
		for _, e := range s.edges {
			in[e.to] = append(in[e.to], rev{int32(i), 1})
		}
		for _, t := range s.eps {
			in[t] = append(in[t], rev{int32(i), 0})
		}
	}
	d := make([]int32, len(n.states))
	for i := range d {
		d[i] = unreachable
	}
	deque := make([]int32, 0, len(n.states))
	for i, s := range n.states {
		if s.accept {
			d[i] = 0
			deque = append(deque, int32(i))
		}
	}
	// 0-1 BFS: a front list for epsilon relaxations, a back one for bytes.
	front := deque
	var back []int32
	for len(front) > 0 || len(back) > 0 {
		if len(front) == 0 {
			front, back = back, front[:0]
		}
		u := front[len(front)-1]
		front = front[:len(front)-1]
		for _, r := range in[u] {
			if nd := d[u] + r.w; nd < d[r.from] {
				d[r.from] = nd
				if r.w == 0 {
					front = append(front, r.from)
				} else {
					back = append(back, r.from)
				}
			}
		}
	}
	return d
}

// errNoMatch is a grammar that accepts nothing.
var errNoMatch = errors.New("the grammar accepts no text")
