package grammar

import (
	"fmt"
	"sync"

	"github.com/glmflash/glmflash/core/sample"
)

// MaxMaskBytes bounds the masks one grammar keeps cached; past it the
// cache is dropped (masks are recomputed as states are visited again).
const MaxMaskBytes = 16 << 20

// Grammar is a compiled grammar bound to a vocabulary: the automaton,
// determinized lazily, and a token mask per state, cached. It is shared by
// every request that uses the same grammar and safe for concurrent use;
// each request follows it with its own Matcher.
type Grammar struct {
	v   *Vocab
	min int // shortest accepted text, in bytes (≥ the tokens it needs)

	mu           sync.Mutex
	d            *dfa
	gen          uint64 // bumped when the DFA's cache is dropped
	masks        map[int32]*maskEntry
	budget       map[[2]int32][]uint32 // (state, limit) → mask
	maskBytes    int
	maxMaskBytes int // MaxMaskBytes (tests lower it)

	// statistics (under mu)
	walks int
}

type maskEntry struct {
	mask     []uint32
	maxAfter int32 // the largest distance after an allowed token
}

// newGrammar determinizes n from start over v.
func newGrammar(n *nfa, start int32, v *Vocab) (*Grammar, error) {
	if n.err != nil {
		return nil, n.err
	}
	d := newDFA(n, start)
	if d.start == dead {
		return nil, errNoMatch
	}
	g := &Grammar{v: v, d: d, masks: map[int32]*maskEntry{}, budget: map[[2]int32][]uint32{}, maxMaskBytes: MaxMaskBytes}
	g.min = int(d.states[d.start].dist)
	return g, nil
}

// MinTokens is the fewest tokens max_tokens must allow for the output to
// complete: the shortest accepted text's length in bytes (each byte being
// a token, this is an upper bound on the tokens it needs; the masks count
// the same way, so an output given this many always completes).
func (g *Grammar) MinTokens() int { return max(g.min, 1) }

// Matcher starts following the grammar: a sched.Constraint for one
// request.
func (g *Grammar) Matcher() *Matcher {
	g.mu.Lock()
	defer g.mu.Unlock()
	return &Matcher{g: g, state: g.d.start, gen: g.gen, set: g.d.states[g.d.start].set}
}

// Restart is a new Matcher of m's grammar at its start
// (sample.Restarter: one per choice of an n > 1 request).
func (m *Matcher) Restart() sample.Constraint { return m.g.Matcher() }

// Walks is how many trie walks computed masks (a cache miss each).
func (g *Grammar) Walks() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.walks
}

// Matcher follows one output through a Grammar: sched.Constraint.
type Matcher struct {
	g     *Grammar
	state int32
	gen   uint64
	set   []int32 // the state's NFA set, to find it again after a drop
	left  int     // the remaining tokens of the last Allow (0: none yet)
	done  bool
}

// cur is m's DFA state in the grammar's current cache (g.mu held).
func (m *Matcher) cur() int32 {
	g := m.g
	if g.d.full() {
		g.d.reset()
		g.gen++
		g.masks, g.budget, g.maskBytes = map[int32]*maskEntry{}, map[[2]int32][]uint32{}, 0
	}
	if m.gen != g.gen {
		m.state, m.gen = g.d.intern(m.set), g.gen
	}
	return m.state
}

// Allow returns the tokens allowed next when remaining tokens may still be
// generated: those after which the grammar can still accept within
// remaining−1 more (and the end-of-sequence ids when it accepts now).
func (m *Matcher) Allow(remaining int) []uint32 {
	g := m.g
	g.mu.Lock()
	defer g.mu.Unlock()
	s := m.cur()
	m.left = remaining
	ds := g.d.states[s]
	e := g.masks[s]
	if e == nil {
		mask, maxAfter := g.walk(s, unreachable-1)
		e = &maskEntry{mask: mask, maxAfter: maxAfter}
		g.keep(func() { g.masks[s] = e }, len(mask))
	}
	limit := int32(min(remaining-1, int(unreachable-1)))
	if limit >= e.maxAfter {
		return e.mask
	}
	// The budget cannot be kept (a caller with fewer tokens than the
	// grammar needs): then every token must bring acceptance closer.
	limit = max(limit, ds.dist-1)
	k := [2]int32{s, limit}
	if mask, ok := g.budget[k]; ok {
		return mask
	}
	mask, _ := g.walk(s, limit)
	if empty(mask) {
		// Only where the state accepts already, without an EOS to end it
		// and no one token to accept again: any continuation.
		mask = e.mask
	}
	g.keep(func() { g.budget[k] = mask }, len(mask))
	return mask
}

func empty(mask []uint32) bool {
	for _, w := range mask {
		if w != 0 {
			return false
		}
	}
	return true
}

// keep stores a mask of n words through put, dropping the caches first
// when they would exceed MaxMaskBytes.
func (g *Grammar) keep(put func(), n int) {
	if g.maskBytes+4*n > g.maxMaskBytes {
		g.masks, g.budget, g.maskBytes = map[int32]*maskEntry{}, map[[2]int32][]uint32{}, 0
	}
	g.maskBytes += 4 * n
	put()
}

// walk computes state s's mask: the tokens whose bytes lead from s to a
// state at distance ≤ limit from acceptance (the EOS ids when s accepts),
// by a depth-first walk of the vocabulary's trie beside the DFA; maxAfter
// is the largest such distance.
func (g *Grammar) walk(s int32, limit int32) (mask []uint32, maxAfter int32) {
	g.walks++
	v, d := g.v, g.d
	mask = make([]uint32, sample.AllowWords(v.size))
	if d.states[s].accept {
		for _, e := range v.eos {
			mask[e/32] |= 1 << (e % 32)
		}
	}
	type frame struct {
		node, state int32
		depth       int32
	}
	stack := []frame{{0, s, 0}}
	maxLen := int32(v.maxLen)
	for len(stack) > 0 {
		f := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for k := v.first[f.node]; k < v.first[f.node+1]; k++ {
			kid := v.kids[k]
			ns := d.next(f.state, kid.b)
			if ns == dead {
				continue
			}
			dist := d.states[ns].dist
			if dist-(maxLen-f.depth-1) > limit {
				continue // no token below gets within the limit
			}
			if dist <= limit {
				for _, t := range v.toks[v.tfirst[kid.node]:v.tfirst[kid.node+1]] {
					mask[t/32] |= 1 << (t % 32)
				}
				if v.tfirst[kid.node] < v.tfirst[kid.node+1] {
					maxAfter = max(maxAfter, dist)
				}
			}
			if v.first[kid.node] < v.first[kid.node+1] {
				stack = append(stack, frame{kid.node, ns, f.depth + 1})
			}
		}
	}
	return mask, maxAfter
}

// Accept advances past tok, which the last mask allowed; done says the
// output is complete: the grammar accepts and nothing may follow (or the
// last Allow's budget leaves no token after this one, or the vocabulary
// has no end-of-sequence id to end it later), or tok is an end-of-sequence
// id the grammar accepted.
func (m *Matcher) Accept(tok int32) (done bool, err error) {
	g := m.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if m.done {
		return true, fmt.Errorf("grammar: token %d after the output completed", tok)
	}
	s := m.cur()
	if tok < 0 || int(tok) >= g.v.size {
		return false, fmt.Errorf("grammar: token %d is outside the vocabulary", tok)
	}
	for _, e := range g.v.eos {
		if e == tok {
			if !g.d.states[s].accept {
				return false, fmt.Errorf("grammar: end of sequence (token %d) before the output is complete", tok)
			}
			m.done = true
			return true, nil
		}
	}
	b := g.v.bytes[tok]
	if b == nil {
		return false, fmt.Errorf("grammar: token %d (special or empty) is not allowed", tok)
	}
	for _, c := range b {
		if s = g.d.next(s, c); s == dead {
			return false, fmt.Errorf("grammar: token %d (%q) does not continue the output", tok, b)
		}
	}
	ds := g.d.states[s]
	m.state, m.set = s, ds.set
	m.done = ds.final || (ds.accept && (m.left == 1 || len(g.v.eos) == 0))
	return m.done, nil
}

// Accepting reports whether the output so far is complete (the grammar
// accepts it).
func (m *Matcher) Accepting() bool {
	g := m.g
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.d.states[m.cur()].accept
}
