package speculative

import (
	"fmt"

	"github.com/glmflash/glmflash/core/backend"
)

// slotted is the state of one drafted sequence that holds a slot of its
// drafter's own store.
type slotted interface{ slotIndex() int }

// seqSlots are a store-backed drafter's sequences (MTP's, DFlash's): each
// one started holds a slot of the drafter's store from Start to Stop.
type seqSlots[T slotted] struct {
	store backend.Store
	name  string // the store, in errors
	seqs  map[SeqID]T
	fresh func(slot int) T
}

func newSeqSlots[T slotted](store backend.Store, name string, fresh func(slot int) T) seqSlots[T] {
	return seqSlots[T]{store: store, name: name, seqs: map[SeqID]T{}, fresh: fresh}
}

// start allocates seq's slot.
func (t *seqSlots[T]) start(seq SeqID) error {
	if _, dup := t.seqs[seq]; dup {
		return fmt.Errorf("spec: sequence %s is already drafted", seq)
	}
	slot, err := t.store.Alloc()
	if err != nil {
		return fmt.Errorf("spec: %s: %w", t.name, err)
	}
	t.seqs[seq] = t.fresh(slot)
	return nil
}

// stop frees seq's slot (nothing if it was not started).
func (t *seqSlots[T]) stop(seq SeqID) {
	if s, ok := t.seqs[seq]; ok {
		_ = t.store.Free(s.slotIndex()) // the slot was ours: freeing cannot fail
		delete(t.seqs, seq)
	}
}

// close stops every sequence.
func (t *seqSlots[T]) close() {
	for id := range t.seqs {
		t.stop(id)
	}
}

// at is seq's state (the zero T, nil for a pointer, when not started).
func (t *seqSlots[T]) at(seq SeqID) T { return t.seqs[seq] }
