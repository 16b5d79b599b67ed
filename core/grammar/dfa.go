package grammar

import (
	"encoding/binary"
	"slices"
)

// MaxDFAStates bounds the states one grammar determinizes (lazily, as
// outputs visit them); past it the cache of states is dropped and rebuilt
// from the states in use, so memory stays bounded whatever the outputs.
const MaxDFAStates = 1 << 14

// dead is the DFA state that accepts nothing.
const dead = int32(-1)

// unknown marks a transition not computed yet.
const unknown = int32(-2)

// dstate is a DFA state: a set of NFA states closed under epsilon moves.
type dstate struct {
	set    []int32
	trans  [256]int32
	dist   int32 // shortest distance to acceptance, in bytes
	accept bool
	final  bool // accepts and has no byte transition: nothing may follow
}

// dfa determinizes an NFA lazily. It is not safe for concurrent use (the
// Grammar that owns it locks).
type dfa struct {
	n         *nfa
	dist      []int32 // per NFA state
	maxStates int     // MaxDFAStates (tests lower it)
	states    []*dstate
	index     map[string]int32
	start     int32
	startSet  []int32

	// scratch
	mark  []uint32
	epoch uint32
	stack []int32
}

func newDFA(n *nfa, start int32) *dfa {
	d := &dfa{n: n, dist: n.distances(), mark: make([]uint32, len(n.states)), maxStates: MaxDFAStates}
	d.index = map[string]int32{}
	d.startSet = d.closure([]int32{start})
	d.start = d.intern(d.startSet)
	return d
}

// reset drops every state but the start (interned again first).
func (d *dfa) reset() {
	d.states = d.states[:0]
	d.index = map[string]int32{}
	d.start = d.intern(d.startSet)
}

// closure is the epsilon closure of seeds, sorted, without the states that
// cannot reach acceptance.
func (d *dfa) closure(seeds []int32) []int32 {
	d.epoch++
	if d.epoch == 0 {
		clear(d.mark)
		d.epoch = 1
	}
	var out []int32
	d.stack = append(d.stack[:0], seeds...)
	for len(d.stack) > 0 {
		s := d.stack[len(d.stack)-1]
		d.stack = d.stack[:len(d.stack)-1]
		if d.mark[s] == d.epoch || d.dist[s] == unreachable {
			continue
		}
		d.mark[s] = d.epoch
		st := &d.n.states[s]
		if len(st.edges) > 0 || st.accept {
			out = append(out, s)
		}
		d.stack = append(d.stack, st.eps...)
	}
	slices.Sort(out)
	return out
}

func key(set []int32) string {
	b := make([]byte, 4*len(set))
	for i, s := range set {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(s))
	}
	return string(b)
}

// intern returns the DFA state of set (dead for the empty set).
func (d *dfa) intern(set []int32) int32 {
	if len(set) == 0 {
		return dead
	}
	k := key(set)
	if id, ok := d.index[k]; ok {
		return id
	}
	ds := &dstate{set: set, dist: unreachable}
	for i := range ds.trans {
		ds.trans[i] = unknown
	}
	edges := false
	for _, s := range set {
		st := &d.n.states[s]
		ds.accept = ds.accept || st.accept
		edges = edges || len(st.edges) > 0
		ds.dist = min(ds.dist, d.dist[s])
	}
	ds.final = ds.accept && !edges
	id := int32(len(d.states))
	d.states = append(d.states, ds)
	d.index[k] = id
	return id
}

// next is the state after byte b from state s.
func (d *dfa) next(s int32, b byte) int32 {
	if s < 0 {
		return dead
	}
	ds := d.states[s]
	if t := ds.trans[b]; t != unknown {
		return t
	}
	var seeds []int32
	for _, ns := range ds.set {
		for _, e := range d.n.states[ns].edges {
			if e.lo <= b && b <= e.hi {
				seeds = append(seeds, e.to)
			}
		}
	}
	t := d.intern(d.closure(seeds))
	ds.trans[b] = t
	return t
}

// full reports whether the state cache is at its bound.
func (d *dfa) full() bool { return len(d.states) >= d.maxStates }
