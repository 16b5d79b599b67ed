package cuda

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/cache"
	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// DraftStore is a DFlash drafter's K/V state in device memory (the device
// twin of cache.DraftStore): per draft layer a K and a V cache of
// [slots][maxPositions][width] floats (width = kv_heads·head_dim; K normed
// and rotated at its position, V as projected), fp32 in both precisions as
// the trunk's MLA latents are. A slot's length counts the context positions
// the drafter has run (glmf_dflash_prep appends a batch's context rows at
// L…L+c−1, the batch's commit advances the length); block rows are never
// kept. Checkpoint and Truncate move only the length: rows are appended in
// position order and nothing else changes, so a record is its length.
type DraftStore struct {
	b      *Backend
	id     uint64 // unique per process (with Store's): graphs are keyed by it
	layers int
	width  int
	maxPos int
	mu     sync.Mutex
	used   []bool
	lens   []int
	ckpt   []int // open checkpoint's length per slot, −1 when none
	k, v   []kc.DevicePtr
	bufs   []sized
}

// NewDraftStore allocates o.Slots slots of a DFlash drafter's K/V state
// for layers draft layers of width values a row, o.MaxPositions context
// positions a slot (backend.DraftStorer). o.Rollback is not needed (a
// checkpoint is a length): any value ≥ 0 is accepted.
func (b *Backend) NewDraftStore(layers, width int, o backend.StoreOptions) (backend.Store, error) {
	switch {
	case o.Slots < 1:
		return nil, fmt.Errorf("cuda: need at least one draft slot, got %d", o.Slots)
	case o.MaxPositions < 1:
		return nil, fmt.Errorf("cuda: a draft store needs a positive context limit, got %d", o.MaxPositions)
	case layers < 1:
		return nil, fmt.Errorf("cuda: a draft store needs at least one draft layer, got %d", layers)
	case width < 1:
		return nil, fmt.Errorf("cuda: a draft store's K/V width must be ≥ 1, got %d", width)
	case o.Rollback < 0:
		return nil, fmt.Errorf("cuda: rollback depth must be ≥ 0, got %d", o.Rollback)
	}
	s := &DraftStore{b: b, id: storeIDs.Add(1), layers: layers, width: width, maxPos: o.MaxPositions,
		used: make([]bool, o.Slots), lens: make([]int, o.Slots), ckpt: make([]int, o.Slots)}
	for i := range s.ckpt {
		s.ckpt[i] = -1
	}
	n := 4 * s.slotStride() * int64(o.Slots)
	err := b.dev.Do(func() error {
		for l := 0; l < 2*layers; l++ {
			p, err := b.dev.Alloc(n)
			if err != nil {
				return fmt.Errorf("cuda: allocating the draft cache (%d slots × %d positions × %d layers): %w", o.Slots, o.MaxPositions, layers, err)
			}
			s.bufs = append(s.bufs, sized{p, n})
			b.sh.caches.Add(n)
			if l < layers {
				s.k = append(s.k, p)
			} else {
				s.v = append(s.v, p)
			}
		}
		return nil
	})
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// slotStride is the floats of one slot in one layer's K (or V) cache.
func (s *DraftStore) slotStride() int64 { return int64(s.maxPos) * int64(s.width) }

// Layers is the number of draft layers; Width the K/V values a row.
func (s *DraftStore) Layers() int { return s.layers }

// Width is kv_heads·head_dim, the values of one K (or V) row.
func (s *DraftStore) Width() int { return s.width }

// MaxPositions is the context positions a slot holds.
func (s *DraftStore) MaxPositions() int { return s.maxPos }

// Close frees the store's device memory.
func (s *DraftStore) Close() error {
	return s.b.dev.Do(func() error {
		for _, b := range s.bufs {
			s.b.dev.Free(b.p, b.n)
			s.b.sh.caches.Add(-b.n)
		}
		s.bufs, s.k, s.v = nil, nil, nil
		return nil
	})
}

// Capacity is the number of slots.
func (s *DraftStore) Capacity() int { return len(s.used) }

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

func (s *DraftStore) allocatedLocked(slot int) error {
	if slot < 0 || slot >= len(s.used) || !s.used[slot] {
		return fmt.Errorf("cache: draft slot %d is not allocated", slot)
	}
	return nil
}

// Alloc reserves a free slot with an empty sequence (nothing on the device
// to clear: a row is read only once written).
func (s *DraftStore) Alloc() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, u := range s.used {
		if !u {
			s.used[i], s.lens[i], s.ckpt[i] = true, 0, -1
			return i, nil
		}
	}
	return -1, fmt.Errorf("cache: all %d draft slots are in use", len(s.used))
}

// Free releases a slot.
func (s *DraftStore) Free(slot int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return err
	}
	s.used[slot], s.ckpt[slot] = false, -1
	return nil
}

// Len is the number of context positions a slot holds.
func (s *DraftStore) Len(slot int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return 0, err
	}
	return s.lens[slot], nil
}

// Checkpoint opens a rollback record at the slot's length (replacing an
// open one).
func (s *DraftStore) Checkpoint(slot int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return err
	}
	s.ckpt[slot] = s.lens[slot]
	return nil
}

// Truncate cuts a checkpointed slot back to n positions (checkpoint ≤ n ≤
// Len) and closes the record; the rows past n are left to be overwritten.
func (s *DraftStore) Truncate(slot, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.allocatedLocked(slot); err != nil {
		return err
	}
	base := s.ckpt[slot]
	if base < 0 {
		return fmt.Errorf("cache: draft slot %d has no open checkpoint", slot)
	}
	if n < base || n > s.lens[slot] {
		return fmt.Errorf("cache: draft slot %d can be cut back to [%d, %d] positions, not %d", slot, base, s.lens[slot], n)
	}
	s.lens[slot], s.ckpt[slot] = n, -1
	return nil
}

// Copy makes allocated slot dst hold src's rows and length (stream-ordered
// device copies of every layer's K and V rows); dst's open record is
// closed. A src with an open checkpoint, and src = dst, are refused.
func (s *DraftStore) Copy(src, dst int) error {
	s.mu.Lock()
	for _, sl := range []int{src, dst} {
		if err := s.allocatedLocked(sl); err != nil {
			s.mu.Unlock()
			return err
		}
	}
	if src == dst {
		s.mu.Unlock()
		return fmt.Errorf("cache: copying draft slot %d onto itself", src)
	}
	if s.ckpt[src] >= 0 {
		s.mu.Unlock()
		return fmt.Errorf("cache: draft slot %d has an open checkpoint: copy it after Truncate", src)
	}
	n := s.lens[src]
	s.mu.Unlock()
	st, bytes := s.slotStride(), 4*int64(n)*int64(s.width)
	err := s.b.dev.Do(func() error {
		for _, p := range append(append([]kc.DevicePtr(nil), s.k...), s.v...) {
			if err := s.b.dev.Copy(p+kc.DevicePtr(4*int64(dst)*st), p+kc.DevicePtr(4*int64(src)*st), bytes); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lens[dst], s.ckpt[dst] = n, -1
	return nil
}

// ReadDraft copies an allocated slot's rows to the host (tests compare them
// with the CPU's cache.DraftStore.ReadDraft).
func (s *DraftStore) ReadDraft(slot int) (*cache.DraftSeq, error) {
	n, err := s.Len(slot)
	if err != nil {
		return nil, err
	}
	q := &cache.DraftSeq{Len: n, K: make([][]float32, s.layers), V: make([][]float32, s.layers)}
	off := 4 * int64(slot) * s.slotStride()
	err = s.b.dev.Do(func() error {
		for l := 0; l < s.layers; l++ {
			q.K[l], q.V[l] = make([]float32, n*s.width), make([]float32, n*s.width)
			if n == 0 {
				continue
			}
			if err := s.b.dev.Download(unsafe.Pointer(unsafe.SliceData(q.K[l])), s.k[l]+kc.DevicePtr(off), 4*int64(n*s.width)); err != nil {
				return err
			}
			if err := s.b.dev.Download(unsafe.Pointer(unsafe.SliceData(q.V[l])), s.v[l]+kc.DevicePtr(off), 4*int64(n*s.width)); err != nil {
				return err
			}
		}
		return nil
	})
	return q, err
}

// draftState checks a draft batch against the store (every sequence's
// context rows within the slot's positions) and returns its slots.
func (s *DraftStore) draftState(pr *backend.Prepared) ([]int, error) {
	slots := make([]int, len(pr.Spans))
	for i, sp := range pr.Spans {
		if sp.Pos0+sp.C > s.maxPos {
			return nil, fmt.Errorf("cuda: draft batch sequence %d: %d cached + %d new context positions exceed the draft store's %d", i, sp.Pos0, sp.C, s.maxPos)
		}
		slots[i] = sp.Slot
	}
	return slots, nil
}

// commitDraft advances the batch's slots by their context rows.
func (s *DraftStore) commitDraft(pr *backend.Prepared) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sp := range pr.Spans {
		s.lens[sp.Slot] += sp.C
	}
}
