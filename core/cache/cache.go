// Package cache holds per-sequence model state between forward passes: for
// each KDA layer the raw conv window and the fp32 recurrent state, for each
// DSA layer the post-norm c_kv latents (not expanded K/V) and the indexer's
// pooled keys plus the pending rows of the incomplete pool. Sequences live
// in numbered slots of a Store, which holds the state of a chosen set of
// layers: the trunk's, or the MTP layer's (whose positions are its own).
package cache

import (
	"fmt"
	"sync"

	"github.com/glmflash/glmflash/kernels/indexer"
	"github.com/glmflash/glmflash/model"
)

// Seq is one sequence's state.
type Seq struct {
	// Len is the number of tokens already processed (the next position).
	Len int
	// Per layer index (nil where the store holds no such state for it):
	Conv  [][]float32      // KDA: [3P][K−1] raw pre-conv inputs, oldest first
	State [][]float32      // KDA: [heads][Dk][Dv] recurrent state
	CKV   [][]float32      // DSA: [Len][kv_lora_rank] latents (non-nil, maybe empty, for a held DSA layer)
	Index []*indexer.State // DSA layers with their own indexer
}

// KDA returns layer l's conv window and recurrent state, or an error when
// the sequence holds no KDA state for l.
func (q *Seq) KDA(l int) (conv, state []float32, err error) {
	if l < 0 || l >= len(q.State) || q.State[l] == nil {
		return nil, nil, fmt.Errorf("the cache holds no KDA state for layer %d", l)
	}
	return q.Conv[l], q.State[l], nil
}

// Latents returns layer l's c_kv cache, or an error when the sequence
// holds no MLA state for l.
func (q *Seq) Latents(l int) ([]float32, error) {
	if l < 0 || l >= len(q.CKV) || q.CKV[l] == nil {
		return nil, fmt.Errorf("the cache holds no MLA latents for layer %d", l)
	}
	return q.CKV[l], nil
}

// Indexer returns layer l's indexer state, or an error when the sequence
// holds none for l.
func (q *Seq) Indexer(l int) (*indexer.State, error) {
	if l < 0 || l >= len(q.Index) || q.Index[l] == nil {
		return nil, fmt.Errorf("the cache holds no indexer state for layer %d", l)
	}
	return q.Index[l], nil
}

// Store is a fixed number of sequence slots. It is safe for concurrent use;
// a slot's contents belong to whoever allocated it.
type Store struct {
	cfg    *model.Config
	layers []int
	mu     sync.Mutex
	slots  []*Seq
	used   []bool
}

// NewStore makes a store with max slots holding the state of the given
// layers of cfg (cfg.TrunkLayers() for the trunk, cfg.MTPLayers() for the
// MTP layer), each a trunk or MTP layer index, listed once.
func NewStore(cfg *model.Config, layers []int, max int) (*Store, error) {
	if max < 1 {
		return nil, fmt.Errorf("cache: need at least one slot, got %d", max)
	}
	if err := CheckLayers(cfg, layers); err != nil {
		return nil, err
	}
	return &Store{cfg: cfg, layers: append([]int(nil), layers...), slots: make([]*Seq, max), used: make([]bool, max)}, nil
}

// CheckLayers validates a store's layer list: at least one layer, each a
// trunk or MTP layer of cfg, none twice.
func CheckLayers(cfg *model.Config, layers []int) error {
	if len(layers) == 0 {
		return fmt.Errorf("cache: a store needs at least one layer")
	}
	n := cfg.NumHiddenLayers + max(cfg.NumNextNPredictLayers, 0)
	seen := make(map[int]bool, len(layers))
	for _, l := range layers {
		if l < 0 || l >= n {
			return fmt.Errorf("cache: layer %d is not a layer of the model (%d trunk + %d MTP layers)", l, cfg.NumHiddenLayers, cfg.NumNextNPredictLayers)
		}
		if seen[l] {
			return fmt.Errorf("cache: layer %d is listed twice", l)
		}
		seen[l] = true
	}
	return nil
}

// Layers lists the layers whose state the store holds.
func (s *Store) Layers() []int { return append([]int(nil), s.layers...) }

// Capacity is the number of slots.
func (s *Store) Capacity() int { return len(s.slots) }

// InUse counts allocated slots.
func (s *Store) InUse() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, u := range s.used {
		if u {
			n++
		}
	}
	return n
}

// Alloc reserves a free slot with an empty sequence.
func (s *Store) Alloc() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, u := range s.used {
		if !u {
			s.used[i] = true
			if s.slots[i] == nil {
				s.slots[i] = s.newSeq()
			} else {
				s.slots[i].reset()
			}
			return i, nil
		}
	}
	return -1, fmt.Errorf("cache: all %d slots are in use", len(s.slots))
}

// Free releases a slot.
func (s *Store) Free(slot int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if slot < 0 || slot >= len(s.slots) || !s.used[slot] {
		return fmt.Errorf("cache: slot %d is not allocated", slot)
	}
	s.used[slot] = false
	return nil
}

// Len is the number of tokens an allocated slot has processed.
func (s *Store) Len(slot int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if slot < 0 || slot >= len(s.slots) || !s.used[slot] {
		return 0, fmt.Errorf("cache: slot %d is not allocated", slot)
	}
	return s.slots[slot].Len, nil
}

// Advance records that an allocated slot processed n more tokens. Lengths
// change only under the store's lock (here and in Alloc): a scheduler may
// read them (Len) while a step that advances them executes.
func (s *Store) Advance(slot, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if slot < 0 || slot >= len(s.slots) || !s.used[slot] {
		return fmt.Errorf("cache: slot %d is not allocated", slot)
	}
	s.slots[slot].Len += n
	return nil
}

// Seq returns an allocated slot's sequence.
func (s *Store) Seq(slot int) (*Seq, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if slot < 0 || slot >= len(s.slots) || !s.used[slot] {
		return nil, fmt.Errorf("cache: slot %d is not allocated", slot)
	}
	return s.slots[slot], nil
}

func (s *Store) newSeq() *Seq {
	c := s.cfg
	L := c.NumHiddenLayers + c.NumNextNPredictLayers
	q := &Seq{Conv: make([][]float32, L), State: make([][]float32, L), CKV: make([][]float32, L), Index: make([]*indexer.State, L)}
	for _, l := range s.layers {
		switch {
		case c.IsKDA(l):
			P := c.KDAProjDim()
			q.Conv[l] = make([]float32, 3*P*(c.LinearConvKernelDim-1))
			q.State[l] = make([]float32, c.LinearNumHeads*c.LinearHeadDim*c.LinearHeadDim)
		case c.IsDSA(l):
			q.CKV[l] = []float32{}
			if c.HasOwnIndexer(l) {
				q.Index[l] = &indexer.State{}
			}
		}
	}
	return q
}

func (q *Seq) reset() {
	q.Len = 0
	for l := range q.Conv {
		clear(q.Conv[l])
		clear(q.State[l])
		if q.CKV[l] != nil {
			q.CKV[l] = q.CKV[l][:0]
		}
		if q.Index[l] != nil {
			q.Index[l].Reset()
		}
	}
}

// Bytes estimates the state's memory footprint.
func (q *Seq) Bytes() int {
	n := 0
	for l := range q.Conv {
		n += 4 * (len(q.Conv[l]) + len(q.State[l]) + cap(q.CKV[l]))
		if ix := q.Index[l]; ix != nil {
			n += 4 * (cap(ix.Pools) + cap(ix.PendK) + cap(ix.PendG))
		}
	}
	return n
}

// SlotBytes bounds the memory of one slot holding tokens tokens: the fixed
// KDA state plus, per token, the MLA latents of every DSA layer and the
// indexer keys of every layer with its own indexer (append growth may add
// up to as much again). Servers check slots × SlotBytes(context) against
// the machine before they accept a configuration.
func SlotBytes(cfg *model.Config, tokens int) int64 {
	return LayerSlotBytes(cfg, cfg.TrunkLayers(), tokens)
}

// LayerSlotBytes is SlotBytes for a store of the given layers (the MTP
// layer's: cfg.MTPLayers()).
func LayerSlotBytes(cfg *model.Config, layers []int, tokens int) int64 {
	var fixed, perToken int64
	for _, l := range layers {
		if cfg.IsKDA(l) {
			P := int64(cfg.KDAProjDim())
			fixed += 3 * P * int64(cfg.LinearConvKernelDim-1)
			fixed += int64(cfg.LinearNumHeads) * int64(cfg.LinearHeadDim) * int64(cfg.LinearHeadDim)
			continue
		}
		perToken += int64(cfg.KVLoraRank)
		if cfg.HasOwnIndexer(l) {
			perToken += int64(cfg.IndexHeadDim) // pooled keys (at most one per token)
		}
	}
	return 4 * (fixed + perToken*int64(tokens))
}
