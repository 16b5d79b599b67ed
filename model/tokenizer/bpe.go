package tokenizer

import (
	"container/heap"
	"hash/maphash"
	"sync"
)

// bpe is a byte-level BPE model over raw bytes: the vocabulary and merges
// of tokenizer.json, converted from the byte-level alphabet back to bytes
// at load, so that encoding never maps characters.
type bpe struct {
	vocab        map[string]int32   // token bytes → id
	merges       map[uint64]merge   // (left id, right id) → merge
	byteIDs      [256]int32         // the single-byte tokens (-1: absent)
	ignoreMerges bool               // a piece that is a token is that token
	unk          int32              // -1: unknown bytes are dropped
	cache        [cacheShards]shard // piece → ids
	seed         maphash.Seed
}

type merge struct {
	rank int32
	id   int32
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

const (
	cacheShards   = 16
	shardCapacity = 4096
	maxCachedLen  = 256
)

type shard struct {
	mu sync.Mutex
	m  map[string][]int32
}

func (m *bpe) cached(piece string) ([]int32, bool) {
	if len(piece) > maxCachedLen {
		return nil, false
	}
	sh := &m.cache[maphash.String(m.seed, piece)%cacheShards]
	sh.mu.Lock()
	ids, ok := sh.m[piece]
	sh.mu.Unlock()
	return ids, ok
}

func (m *bpe) store(piece string, ids []int32) {
	if len(piece) > maxCachedLen {
		return
	}
	sh := &m.cache[maphash.String(m.seed, piece)%cacheShards]
	sh.mu.Lock()
	if sh.m == nil || len(sh.m) >= shardCapacity {
		sh.m = make(map[string][]int32, 256) // bounded: start over when full
	}
	sh.m[piece] = ids
	sh.mu.Unlock()
}

// symbol is one part of a word being merged: a doubly linked list over a
// slice.
type symbol struct {
	id         int32
	prev, next int
	start, len int // bytes of the piece it covers; len 0 once merged away
}

// candidate is a possible merge of the symbol at pos with its next one.
type candidate struct {
	pos  int
	rank int32
	id   int32
}

type candidates []candidate

func (h candidates) Len() int { return len(h) }
func (h candidates) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos
}
func (h candidates) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *candidates) Push(x any)   { *h = append(*h, x.(candidate)) }
func (h *candidates) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// encode appends the ids of one pre-tokenized piece. Merges apply lowest
// rank first, leftmost first among equal ranks, as in Hugging Face's
// Word::merge_all.
func (m *bpe) encode(out []int32, piece string) []int32 {
	if ids, ok := m.cached(piece); ok {
		return append(out, ids...)
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[piece]; ok {
			m.store(piece, []int32{id})
			return append(out, id)
		}
	}
	syms := make([]symbol, 0, len(piece))
	for i := 0; i < len(piece); i++ {
		id := m.byteIDs[piece[i]]
		if id < 0 {
			if m.unk < 0 {
				continue
			}
			id = m.unk
		}
		n := len(syms)
		syms = append(syms, symbol{id: id, prev: n - 1, next: n + 1, start: i, len: 1})
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	h := make(candidates, 0, len(syms))
	for i := 0; i+1 < len(syms); i++ {
		if mg, ok := m.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			h = append(h, candidate{pos: i, rank: mg.rank, id: mg.id})
		}
	}
	heap.Init(&h)
	for h.Len() > 0 {
		c := heap.Pop(&h).(candidate)
		s := &syms[c.pos]
		if s.len == 0 || s.next < 0 {
			continue
		}
		nx := &syms[s.next]
		if mg, ok := m.merges[pairKey(s.id, nx.id)]; !ok || mg.id != c.id {
			continue // the pair changed since this candidate was queued
		}
		s.id = c.id
		s.len += nx.len
		nx.len = 0
		s.next = nx.next
		if s.next >= 0 {
			syms[s.next].prev = c.pos
			if mg, ok := m.merges[pairKey(s.id, syms[s.next].id)]; ok {
				heap.Push(&h, candidate{pos: c.pos, rank: mg.rank, id: mg.id})
			}
		}
		if s.prev >= 0 {
			if mg, ok := m.merges[pairKey(syms[s.prev].id, s.id)]; ok {
				heap.Push(&h, candidate{pos: s.prev, rank: mg.rank, id: mg.id})
			}
		}
	}
	ids := make([]int32, 0, len(syms))
	for i := 0; i >= 0 && i < len(syms); i = syms[i].next {
		ids = append(ids, syms[i].id)
	}
	m.store(piece, ids)
	return append(out, ids...)
}
