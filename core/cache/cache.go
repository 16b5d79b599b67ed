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
	// Rollback is the open rollback record (Store.Checkpoint), nil when
	// none is open.
	Rollback *Rollback
	// rb is the slot's record buffers, kept between checkpoints.
	rb *Rollback
}

// Rollback is what a checkpointed sequence keeps so that it can be cut
// back to any length from its checkpoint (Store.Truncate): per KDA layer
// the conv window and recurrent state after every position run since the
// checkpoint, and per indexer the raw key and gate rows of every position
// from the start of the pool that was pending at the checkpoint. The
// kernels that advance a sequence write them (Record* methods) while the
// record is open.
type Rollback struct {
	// Base is the sequence length at the checkpoint; Depth bounds the
	// positions that may run after it.
	Base, Depth int
	// IdxBase is the first position of the indexer rows (Base rounded down
	// to a pool boundary).
	IdxBase int
	conv    [][]float32 // per KDA layer: [Depth][conv window]
	state   [][]float32 // per KDA layer: [Depth][recurrent state]
	idxK    [][]float32 // per indexer layer: raw keys from IdxBase, [rows][Dim]
	idxG    [][]float32 // per indexer layer: raw gates from IdxBase
}

// Check refuses a run of n new tokens from position pos0 that would pass
// the record's depth.
func (r *Rollback) Check(pos0, n int) error {
	if pos0+n-r.Base > r.Depth {
		return fmt.Errorf("the rollback record from position %d holds %d positions; %d more from position %d would pass it", r.Base, r.Depth, n, pos0)
	}
	return nil
}

// RecordKDAConv stores layer l's conv window after position pos.
func (r *Rollback) RecordKDAConv(l, pos int, conv []float32) {
	n := len(conv)
	copy(r.conv[l][(pos-r.Base)*n:(pos-r.Base+1)*n], conv)
}

// RecordKDAState stores layer l's recurrent state (or one head's slice of
// it, at offset off) after position pos.
func (r *Rollback) RecordKDAState(l, pos, off int, state []float32, stateLen int) {
	i := pos - r.Base
	copy(r.state[l][i*stateLen+off:i*stateLen+off+len(state)], state)
}

// RecordIndexer stores an indexer layer's raw key and gate rows ([n][Dim])
// of positions pos0.. (appended in order; positions before Base were taken
// at the checkpoint).
func (r *Rollback) RecordIndexer(l, pos0 int, k, g []float32) {
	r.idxK[l] = append(r.idxK[l], k...)
	r.idxG[l] = append(r.idxG[l], g...)
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
	depth  int // rollback depth (0: no checkpoints)
}

// SetRollbackDepth lets slots be checkpointed with records of up to depth
// positions (a verify span's drafts + 1, a drafter's steps); 0 disallows
// checkpoints.
func (s *Store) SetRollbackDepth(depth int) error {
	if depth < 0 {
		return fmt.Errorf("cache: rollback depth must be ≥ 0, got %d", depth)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.depth = depth
	return nil
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

// allocatedLocked refuses a slot that is not allocated.
func (s *Store) allocatedLocked(slot int) error {
	if slot < 0 || slot >= len(s.slots) || !s.used[slot] {
		return fmt.Errorf("cache: slot %d is not allocated", slot)
	}
	return nil
}

// Free releases a slot.
func (s *Store) Free(slot int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return err
	}
	s.used[slot] = false
	s.slots[slot].Rollback = nil
	return nil
}

// Checkpoint opens a rollback record on an allocated slot at its current
// length (replacing an open one): until Truncate, the next Checkpoint or
// Free, the kernels keep what it takes to cut the slot back to any length
// from the checkpoint on, for at most the store's rollback depth of
// positions.
func (s *Store) Checkpoint(slot int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return err
	}
	if s.depth < 1 {
		return fmt.Errorf("cache: the store keeps no rollback records (its rollback depth is 0)")
	}
	q := s.slots[slot]
	c := s.cfg
	if q.rb == nil || q.rb.Depth != s.depth {
		L := len(q.Conv)
		q.rb = &Rollback{Depth: s.depth, conv: make([][]float32, L), state: make([][]float32, L), idxK: make([][]float32, L), idxG: make([][]float32, L)}
		for l := range q.Conv {
			if q.State[l] != nil {
				q.rb.conv[l] = make([]float32, s.depth*len(q.Conv[l]))
				q.rb.state[l] = make([]float32, s.depth*len(q.State[l]))
			}
		}
	}
	r := q.rb
	r.Base = q.Len
	r.IdxBase = q.Len
	if c.IndexKPool > 0 {
		r.IdxBase = q.Len / c.IndexKPool * c.IndexKPool
	}
	for l, ix := range q.Index {
		if ix != nil {
			r.idxK[l] = append(r.idxK[l][:0], ix.PendK...)
			r.idxG[l] = append(r.idxG[l][:0], ix.PendG...)
		}
	}
	q.Rollback = r
	return nil
}

// Truncate cuts a checkpointed slot back to n tokens, Base ≤ n ≤ Len, and
// closes its record: MLA latents and indexer rows past n are dropped, a
// pool that a dropped token completed is reopened (its pending raw rows
// restored), and each KDA layer's conv window and recurrent state become
// those after position n−1. A store holding KDA state needs n > Base (the
// state at the checkpoint itself is not kept: a verify span always keeps
// its first token, the last accepted one).
func (s *Store) Truncate(slot, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return err
	}
	q := s.slots[slot]
	r := q.Rollback
	if r == nil {
		return fmt.Errorf("cache: slot %d has no open checkpoint", slot)
	}
	if n < r.Base || n > q.Len {
		return fmt.Errorf("cache: slot %d can be cut back to [%d, %d] tokens, not %d", slot, r.Base, q.Len, n)
	}
	hasKDA := false
	for l := range q.State {
		hasKDA = hasKDA || q.State[l] != nil
	}
	if hasKDA && n == r.Base && q.Len > r.Base {
		return fmt.Errorf("cache: slot %d: the KDA state at the checkpoint (%d tokens) is not kept; keep at least one token after it", slot, r.Base)
	}
	if n < q.Len {
		kp, D := s.cfg.IndexKPool, s.cfg.IndexHeadDim
		for l := range q.Conv {
			if q.State[l] != nil {
				i := n - 1 - r.Base
				nc, ns := len(q.Conv[l]), len(q.State[l])
				copy(q.Conv[l], r.conv[l][i*nc:(i+1)*nc])
				copy(q.State[l], r.state[l][i*ns:(i+1)*ns])
			}
			if q.CKV[l] != nil {
				q.CKV[l] = q.CKV[l][:n*s.cfg.KVLoraRank]
			}
			if ix := q.Index[l]; ix != nil {
				pools := n / kp
				ix.Pools = ix.Pools[:pools*D]
				lo, hi := (pools*kp-r.IdxBase)*D, (n-r.IdxBase)*D
				ix.PendK = append(ix.PendK[:0], r.idxK[l][lo:hi]...)
				ix.PendG = append(ix.PendG[:0], r.idxG[l][lo:hi]...)
				if ix.SharePos >= n {
					ix.Share = ix.Share[:0]
				}
			}
		}
	}
	q.Len = n
	q.Rollback = nil
	return nil
}

// Copy makes allocated slot dst hold what allocated slot src holds: its
// length, every KDA layer's conv window and recurrent state, every DSA
// layer's latents, every indexer's pools, pending rows and saved
// selection. dst's buffers are reused and its open rollback record, if
// any, is closed; src is unchanged. A src with an open rollback record is
// refused (its record belongs to a speculative step in flight), as is
// src = dst.
func (s *Store) Copy(src, dst int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(src); err != nil {
		return err
	}
	if err := s.allocatedLocked(dst); err != nil {
		return err
	}
	if src == dst {
		return fmt.Errorf("cache: copying slot %d onto itself", src)
	}
	a, b := s.slots[src], s.slots[dst]
	if a.Rollback != nil {
		return fmt.Errorf("cache: slot %d has an open checkpoint: copy it after its Truncate", src)
	}
	b.Len = a.Len
	b.Rollback = nil
	for l := range a.Conv {
		copy(b.Conv[l], a.Conv[l])
		copy(b.State[l], a.State[l])
		if a.CKV[l] != nil {
			b.CKV[l] = append(b.CKV[l][:0], a.CKV[l]...)
		}
		if x := a.Index[l]; x != nil {
			y := b.Index[l]
			y.Pools = append(y.Pools[:0], x.Pools...)
			y.PendK = append(y.PendK[:0], x.PendK...)
			y.PendG = append(y.PendG[:0], x.PendG...)
			y.Share = append(y.Share[:0], x.Share...)
			y.SharePos = x.SharePos
		}
	}
	return nil
}

// Len is the number of tokens an allocated slot has processed.
func (s *Store) Len(slot int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return 0, err
	}
	return s.slots[slot].Len, nil
}

// Advance records that an allocated slot processed n more tokens. Lengths
// change only under the store's lock (here and in Alloc): a scheduler may
// read them (Len) while a step that advances them executes.
func (s *Store) Advance(slot, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return err
	}
	s.slots[slot].Len += n
	return nil
}

// Seq returns an allocated slot's sequence.
func (s *Store) Seq(slot int) (*Seq, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return nil, err
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
			q.Conv[l] = make([]float32, c.KDAConvLen())
			q.State[l] = make([]float32, c.KDAStateLen())
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
	q.Rollback = nil
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

// Bytes is the memory the store's slots hold now (Seq.Bytes summed over
// every slot, free ones too: their buffers are kept for reuse).
func (s *Store) Bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, q := range s.slots {
		if q != nil {
			n += int64(q.Bytes())
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
			fixed += int64(cfg.KDAConvLen() + cfg.KDAStateLen())
			continue
		}
		perToken += int64(cfg.KVLoraRank)
		if cfg.HasOwnIndexer(l) {
			perToken += int64(cfg.IndexHeadDim) // pooled keys (at most one per token)
		}
	}
	return 4 * (fixed + perToken*int64(tokens))
}

// ReadState returns a deep copy of an allocated slot's state (its open
// rollback record left out): what tests compare across runs and backends.
func (s *Store) ReadState(slot int) (*Seq, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return nil, err
	}
	return s.slots[slot].Clone(), nil
}

// Clone deep-copies the sequence's state (without its rollback record).
func (q *Seq) Clone() *Seq {
	c := &Seq{Len: q.Len, Conv: make([][]float32, len(q.Conv)), State: make([][]float32, len(q.State)),
		CKV: make([][]float32, len(q.CKV)), Index: make([]*indexer.State, len(q.Index))}
	for l := range q.Conv {
		c.Conv[l] = cloneF(q.Conv[l])
		c.State[l] = cloneF(q.State[l])
		c.CKV[l] = cloneF(q.CKV[l])
		if ix := q.Index[l]; ix != nil {
			c.Index[l] = &indexer.State{Pools: cloneF(ix.Pools), PendK: cloneF(ix.PendK), PendG: cloneF(ix.PendG),
				Share: append([]int32(nil), ix.Share...), SharePos: ix.SharePos}
		}
	}
	return c
}

func cloneF(x []float32) []float32 {
	if x == nil {
		return nil
	}
	return append([]float32{}, x...)
}

// RollbackSlotBytes bounds one slot's rollback record of depth positions
// for a store of the given layers: per KDA layer depth conv windows and
// recurrent states, per indexer the raw key and gate rows of kpool−1+depth
// positions.
func RollbackSlotBytes(cfg *model.Config, layers []int, depth int) int64 {
	var n int64
	for _, l := range layers {
		if cfg.IsKDA(l) {
			n += int64(depth) * int64(cfg.KDAConvLen()+cfg.KDAStateLen())
		} else if cfg.HasOwnIndexer(l) {
			n += 2 * int64(cfg.IndexKPool-1+depth) * int64(cfg.IndexHeadDim)
		}
	}
	return 4 * n
}
