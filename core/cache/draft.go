package cache

import (
	"fmt"
	"sync"
)

// DraftSeq is one sequence's DFlash draft state: per draft layer the K and
// V rows ([Len][Width], row-major: K normed and rotated at its position, V
// as projected) of the context positions the drafter has run. Block rows
// are never kept (z-lab crops them after every draft), so the state holds
// exactly the committed context positions 0..Len−1.
type DraftSeq struct {
	Len  int
	K, V [][]float32 // per draft layer
	// base is the open checkpoint's length, −1 when none is open.
	base int
}

// Append adds layer l's K and V rows (c rows of the store's width) after
// the Len positions held: the kernel writes the rows of a batch's new
// context positions, and the store's Advance counts them once every layer
// has.
func (q *DraftSeq) Append(l int, k, v []float32) {
	q.K[l] = append(q.K[l], k...)
	q.V[l] = append(q.V[l], v...)
}

// DraftStore holds the DFlash drafter's per-sequence K/V state in numbered
// slots: Layers draft layers of Width (kv_heads·head_dim) values per row. It
// is a backend.Store (its length counts context positions), safe for
// concurrent use; a slot's contents belong to whoever allocated it.
type DraftStore struct {
	layers, width int
	mu            sync.Mutex
	slots         []*DraftSeq
	used          []bool
}

// NewDraftStore makes a draft store of max slots for layers draft layers of
// width K/V values per position.
func NewDraftStore(layers, width, max int) (*DraftStore, error) {
	switch {
	case max < 1:
		return nil, fmt.Errorf("cache: need at least one slot, got %d", max)
	case layers < 1:
		return nil, fmt.Errorf("cache: a draft store needs at least one draft layer, got %d", layers)
	case width < 1:
		return nil, fmt.Errorf("cache: a draft store's K/V width must be ≥ 1, got %d", width)
	}
	return &DraftStore{layers: layers, width: width, slots: make([]*DraftSeq, max), used: make([]bool, max)}, nil
}

// Layers is the number of draft layers; Width the K/V values per position.
func (s *DraftStore) Layers() int { return s.layers }

// Width is kv_heads·head_dim, the values of one K (or V) row.
func (s *DraftStore) Width() int { return s.width }

// Capacity is the number of slots.
func (s *DraftStore) Capacity() int { return len(s.slots) }

// InUse counts allocated slots.
func (s *DraftStore) InUse() int {
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
func (s *DraftStore) Alloc() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, u := range s.used {
		if u {
			continue
		}
		s.used[i] = true
		q := s.slots[i]
		if q == nil {
			q = &DraftSeq{K: make([][]float32, s.layers), V: make([][]float32, s.layers)}
			s.slots[i] = q
		}
		q.Len, q.base = 0, -1
		for l := range q.K {
			q.K[l], q.V[l] = q.K[l][:0], q.V[l][:0]
		}
		return i, nil
	}
	return -1, fmt.Errorf("cache: all %d draft slots are in use", len(s.slots))
}

func (s *DraftStore) allocatedLocked(slot int) error {
	if slot < 0 || slot >= len(s.slots) || !s.used[slot] {
		return fmt.Errorf("cache: draft slot %d is not allocated", slot)
	}
	return nil
}

// Free releases a slot.
func (s *DraftStore) Free(slot int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return err
	}
	s.used[slot] = false
	return nil
}

// Len is the number of context positions a slot holds.
func (s *DraftStore) Len(slot int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return 0, err
	}
	return s.slots[slot].Len, nil
}

// Checkpoint opens a rollback record at the slot's length (replacing an
// open one). Draft K/V rows are appended in position order and nothing
// else changes, so the record is the length alone.
func (s *DraftStore) Checkpoint(slot int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return err
	}
	q := s.slots[slot]
	q.base = q.Len
	return nil
}

// Truncate cuts a checkpointed slot back to n positions (checkpoint ≤ n ≤
// Len), dropping every layer's K/V rows past n, and closes the record.
func (s *DraftStore) Truncate(slot, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return err
	}
	q := s.slots[slot]
	if q.base < 0 {
		return fmt.Errorf("cache: draft slot %d has no open checkpoint", slot)
	}
	if n < q.base || n > q.Len {
		return fmt.Errorf("cache: draft slot %d can be cut back to [%d, %d] positions, not %d", slot, q.base, q.Len, n)
	}
	for l := range q.K {
		q.K[l], q.V[l] = q.K[l][:n*s.width], q.V[l][:n*s.width]
	}
	q.Len, q.base = n, -1
	return nil
}

// Copy makes allocated slot dst hold src's K/V rows and length; dst's open
// record is closed. A src with an open checkpoint, and src = dst, are
// refused.
func (s *DraftStore) Copy(src, dst int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(src); err != nil {
		return err
	}
	if err := s.allocatedLocked(dst); err != nil {
		return err
	}
	if src == dst {
		return fmt.Errorf("cache: copying draft slot %d onto itself", src)
	}
	a, b := s.slots[src], s.slots[dst]
	if a.base >= 0 {
		return fmt.Errorf("cache: draft slot %d has an open checkpoint: copy it after Truncate", src)
	}
	for l := range a.K {
		b.K[l] = append(b.K[l][:0], a.K[l]...)
		b.V[l] = append(b.V[l][:0], a.V[l]...)
	}
	b.Len, b.base = a.Len, -1
	return nil
}

// Seq returns an allocated slot's state (the kernels append to it).
func (s *DraftStore) Seq(slot int) (*DraftSeq, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return nil, err
	}
	return s.slots[slot], nil
}

// Advance records n new context positions of a slot once every draft layer
// has appended their rows; a layer holding another count is an error
// naming it (the state is then inconsistent and the slot must be freed).
func (s *DraftStore) Advance(slot, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return err
	}
	q := s.slots[slot]
	for l := range q.K {
		if len(q.K[l]) != (q.Len+n)*s.width || len(q.V[l]) != (q.Len+n)*s.width {
			return fmt.Errorf("cache: draft slot %d layer %d holds %d K and %d V rows, want %d", slot, l, len(q.K[l])/s.width, len(q.V[l])/s.width, q.Len+n)
		}
	}
	q.Len += n
	return nil
}

// Rewind drops what a failed run appended past the slot's length (every
// layer back to Len rows): a run that fails between layers leaves the
// committed state as it was.
func (s *DraftStore) Rewind(slot int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.allocatedLocked(slot) != nil {
		return
	}
	q := s.slots[slot]
	for l := range q.K {
		q.K[l], q.V[l] = q.K[l][:min(len(q.K[l]), q.Len*s.width)], q.V[l][:min(len(q.V[l]), q.Len*s.width)]
	}
}

// ReadDraft copies an allocated slot's state (tests compare it).
func (s *DraftStore) ReadDraft(slot int) (*DraftSeq, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return nil, err
	}
	q := s.slots[slot]
	c := &DraftSeq{Len: q.Len, K: make([][]float32, len(q.K)), V: make([][]float32, len(q.V)), base: -1}
	for l := range q.K {
		c.K[l], c.V[l] = cloneF(q.K[l]), cloneF(q.V[l])
	}
	return c, nil
}

// Bytes is the K/V memory a slot holds.
func (q *DraftSeq) Bytes() int {
	n := 0
	for l := range q.K {
		n += 4 * (cap(q.K[l]) + cap(q.V[l]))
	}
	return n
}

// DraftSlotBytes is the most K/V memory one draft slot holds: positions
// context rows of K and V (float32) in each of layers draft layers of
// width values.
func DraftSlotBytes(layers, width, positions int) int64 {
	return 2 * 4 * int64(layers) * int64(width) * int64(positions)
}
