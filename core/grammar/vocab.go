package grammar

import (
	"fmt"
	"slices"
)

// Tokens is what a vocabulary needs of a tokenizer (model/tokenizer's
// Tokenizer has these).
type Tokens interface {
	VocabSize() int
	Bytes(id int32) []byte
	IsSpecial(id int32) bool
}

// Vocab is a vocabulary as a grammar sees it: each token's bytes in a
// trie, the end-of-sequence ids, and the model's vocabulary size (logits
// rows may be wider than the tokenizer). Special added tokens other than
// EOS are never allowed; added tokens that are not special count as their
// text. It is immutable and safe for concurrent use.
type Vocab struct {
	size   int // the model's vocabulary (mask width)
	eos    []int32
	bytes  [][]byte // id → its bytes (nil: never allowed)
	maxLen int

	// trie: node i's children are kids[first[i]:first[i+1]], sorted by
	// byte; the tokens that end at node i are toks[tfirst[i]:tfirst[i+1]].
	first  []int32
	kids   []trieKid
	tfirst []int32
	toks   []int32
}

type trieKid struct {
	b    byte
	node int32
}

// NewVocab builds the vocabulary of a model whose logits have size rows
// from its tokenizer and end-of-sequence ids. It refuses a vocabulary
// without a token for each single byte (byte-level BPE has them all: the
// budget relies on them). Without an end-of-sequence id (a test fixture),
// an output ends as soon as its grammar accepts.
func NewVocab(t Tokens, size int, eos []int32) (*Vocab, error) {
	if size < t.VocabSize() {
		return nil, fmt.Errorf("grammar: the model's vocabulary (%d) is smaller than the tokenizer's (%d)", size, t.VocabSize())
	}
	v := &Vocab{size: size, bytes: make([][]byte, size)}
	for _, e := range eos {
		if e < 0 || int(e) >= size {
			return nil, fmt.Errorf("grammar: end-of-sequence id %d is outside the vocabulary [0, %d)", e, size)
		}
		if !slices.Contains(v.eos, e) {
			v.eos = append(v.eos, e)
		}
	}
	var single [256]bool
	for id := range int32(t.VocabSize()) {
		b := t.Bytes(id)
		if len(b) == 0 || t.IsSpecial(id) || slices.Contains(v.eos, id) {
			continue
		}
		v.bytes[id] = b
		v.maxLen = max(v.maxLen, len(b))
		if len(b) == 1 {
			single[b[0]] = true
		}
	}
	for c, ok := range single {
		if !ok {
			return nil, fmt.Errorf("grammar: the vocabulary has no token for the single byte 0x%02x (a byte-level vocabulary has one for each)", c)
		}
	}
	v.build()
	return v, nil
}

// Size is the mask width in tokens.
func (v *Vocab) Size() int { return v.size }

// build lays the trie out breadth-first.
func (v *Vocab) build() {
	type tmp struct {
		kids map[byte]int32
		toks []int32
	}
	nodes := []tmp{{kids: map[byte]int32{}}}
	for id, b := range v.bytes {
		if b == nil {
			continue
		}
		n := int32(0)
		for _, c := range b {
			k, ok := nodes[n].kids[c]
			if !ok {
				k = int32(len(nodes))
				nodes = append(nodes, tmp{kids: map[byte]int32{}})
				nodes[n].kids[c] = k
			}
			n = k
		}
		nodes[n].toks = append(nodes[n].toks, int32(id))
	}
	// Renumber depth-first so a walk reads memory in order.
	order := make([]int32, len(nodes)) // old → new
	var seq []int32
	var visit func(int32)
	visit = func(n int32) {
		order[n] = int32(len(seq))
		seq = append(seq, n)
		bs := make([]int, 0, len(nodes[n].kids))
		for c := range nodes[n].kids {
			bs = append(bs, int(c))
		}
		slices.Sort(bs)
		for _, c := range bs {
			visit(nodes[n].kids[byte(c)])
		}
	}
	visit(0)
	v.first = make([]int32, len(seq)+1)
	v.tfirst = make([]int32, len(seq)+1)
	for i, old := range seq {
		v.first[i] = int32(len(v.kids))
		v.tfirst[i] = int32(len(v.toks))
		bs := make([]int, 0, len(nodes[old].kids))
		for c := range nodes[old].kids {
			bs = append(bs, int(c))
		}
		slices.Sort(bs)
		for _, c := range bs {
			v.kids = append(v.kids, trieKid{byte(c), order[nodes[old].kids[byte(c)]]})
		}
		v.toks = append(v.toks, nodes[old].toks...)
	}
	v.first[len(seq)] = int32(len(v.kids))
	v.tfirst[len(seq)] = int32(len(v.toks))
}
