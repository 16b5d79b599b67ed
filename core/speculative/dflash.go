package speculative

import (
	"fmt"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/model"
)

// DFlashModel is what the DFlash drafter runs on; *engine.Engine (with
// engine.Options.DFlash set) implements it.
type DFlashModel interface {
	Config() *model.Config
	DFlash() *model.DFlashConfig
	DraftStore() (backend.Store, error)
	Run(key engine.Key, b *backend.Batch) (*backend.Result, error)
}

// DFlashKey is the program of the DFlash drafter's block draft forward.
var DFlashKey = engine.Key{DFlash: true, Mode: graph.Extend, Logits: graph.SpanLogits}

// DFlash drafts a block per forward (z-lab's DFlashDraftModel,
// dflash_generate): the target's hidden rows after its target layers
// (Needs.TargetHidden: captured by the verify, prefill and decode passes
// themselves) become context rows, and one non-causal forward of the
// drafter over the block [pending token, MASK × (B−1)] gives B−1 drafts,
// the argmax of each mask row's logits (top-1: deterministic drafts, so
// the acceptance rule's q is one-hot). The context rows of the positions
// the target committed since the last draft run with the next block and
// their K/V stay in the drafter's store (dflash_attn appends them); the
// block's K/V are never kept, so the store only ever holds committed
// context positions, a prefix of the sequence's: rejected drafts leave
// nothing to cut back. Block size and target layers come from the
// drafter's config.
type DFlash struct {
	m     DFlashModel
	store backend.Store
	cfg   *model.DFlashConfig
	W     int // context row width (target layers · hidden)
	slots seqSlots[*dflashSeq]
}

type dflashSeq struct {
	slot int
	// n is the target positions observed (committed); the store holds the
	// first ones' K/V, pending the context rows of the rest (positions
	// store length .. n−1), run with the next block.
	n       int
	pending []float32
	next    int32 // the pending token: the last observation's Next
	ready   bool
}

// NewDFlash returns the DFlash drafter on m (an engine with a drafter).
func NewDFlash(m DFlashModel) (*DFlash, error) {
	d := m.DFlash()
	if d == nil {
		return nil, fmt.Errorf("spec: speculative method dflash needs a DFlash drafter (speculative.draft_model)")
	}
	if err := d.CheckTarget(m.Config()); err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	st, err := m.DraftStore()
	if err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	return &DFlash{m: m, store: st, cfg: d, W: d.ContextWidth(), slots: newSeqSlots(st, "DFlash draft store", func(slot int) *dflashSeq { return &dflashSeq{slot: slot} })}, nil
}

// Name is "dflash".
func (d *DFlash) Name() string { return "dflash" }

// Needs the target's target-layer hidden rows.
func (d *DFlash) Needs() Needs { return Needs{TargetHidden: true} }

// MaxDrafts is block_size − 1.
func (d *DFlash) MaxDrafts() int { return d.cfg.BlockSize - 1 }

// Config is the drafter's configuration.
func (d *DFlash) Config() *model.DFlashConfig { return d.cfg }

// Keys are the programs the drafter runs (compile them before serving).
func (d *DFlash) Keys() []engine.Key { return []engine.Key{DFlashKey} }

// Start allocates the sequence's draft slot.
func (d *DFlash) Start(seq SeqID, _ []int32) error { return d.slots.start(seq) }

// Stop frees the sequence's draft slot.
func (d *DFlash) Stop(seq SeqID) { d.slots.stop(seq) }

// Close stops every sequence.
func (d *DFlash) Close() error {
	d.slots.close()
	return nil
}

// Observe keeps the committed positions' context rows for the next draft
// and the pending token.
func (d *DFlash) Observe(obs []Observation) error {
	for _, o := range obs {
		s := d.slots.at(o.Seq)
		if s == nil {
			return fmt.Errorf("spec: sequence %s is not drafted", o.Seq)
		}
		if len(o.Tokens) == 0 || len(o.Context) != len(o.Tokens)*d.W {
			s.ready = false
			return fmt.Errorf("spec: sequence %s: %d tokens need %d×%d context values (the target's layers %v), got %d", o.Seq, len(o.Tokens), len(o.Tokens), d.W, d.cfg.TargetLayerIDs, len(o.Context))
		}
		if o.Pos0 != s.n {
			s.ready = false
			return fmt.Errorf("spec: sequence %s: the target committed from position %d, the drafter holds %d", o.Seq, o.Pos0, s.n)
		}
		s.pending = append(s.pending, o.Context...)
		s.n += len(o.Tokens)
		s.next, s.ready = o.Next, true
	}
	return nil
}

// Propose runs one block draft forward over the sequences asked for
// (batched): each gets min(Max, B−1) drafts.
func (d *DFlash) Propose(props []Proposal) error {
	B := d.cfg.BlockSize
	b := &backend.Batch{SamplesOnly: true}
	var act []int
	var seqs []*dflashSeq
	for i := range props {
		p := &props[i]
		p.Drafts, p.Q = p.Drafts[:0], nil
		s := d.slots.at(p.Seq)
		if s == nil || !s.ready || p.Max < 1 {
			continue
		}
		toks := make([]int32, B)
		toks[0] = s.next
		for j := 1; j < B; j++ {
			toks[j] = int32(d.cfg.MaskTokenID)
		}
		b.Seqs = append(b.Seqs, backend.Seq{Slot: s.slot, Tokens: toks, Context: s.pending, LogitRows: B - 1})
		for j := 1; j < B; j++ {
			b.Sample = append(b.Sample, backend.SampleSpec{Params: sample.Greedy()})
		}
		act, seqs = append(act, i), append(seqs, s)
	}
	if len(act) == 0 {
		return nil
	}
	res, err := d.m.Run(DFlashKey, b)
	if err != nil {
		return fmt.Errorf("spec: DFlash draft: %w", err)
	}
	for k, i := range act {
		p, s := &props[i], seqs[k]
		s.pending = s.pending[:0] // run: the store holds them now
		rows := res.Samples[k*(B-1) : (k+1)*(B-1)]
		for _, r := range rows[:min(p.Max, B-1)] {
			if r.Err != nil {
				p.Drafts = p.Drafts[:0]
				return fmt.Errorf("spec: DFlash draft: %w", r.Err)
			}
			p.Drafts = append(p.Drafts, r.Token)
		}
	}
	return nil
}

// Slot returns the draft store slot of a sequence (tests read its state).
func (d *DFlash) Slot(seq SeqID) (int, bool) {
	s := d.slots.at(seq)
	if s == nil {
		return -1, false
	}
	return s.slot, true
}

// Committed is the target positions the drafter has observed for a
// sequence, and how many of them the draft store holds (the rest wait for
// the next block).
func (d *DFlash) Committed(seq SeqID) (observed, stored int, err error) {
	s := d.slots.at(seq)
	if s == nil {
		return 0, 0, fmt.Errorf("spec: sequence %s is not drafted", seq)
	}
	n, err := d.store.Len(s.slot)
	return s.n, n, err
}

func (s *dflashSeq) slotIndex() int { return s.slot }
