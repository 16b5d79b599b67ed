package speculative

import (
	"fmt"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/model"
)

// MTPModel is what the MTP drafter runs on; *engine.Engine implements it.
type MTPModel interface {
	Config() *model.Config
	MTPStore() (backend.Store, error)
	Run(key engine.Key, b *backend.Batch) (*backend.Result, error)
}

// MTPOptions configure the MTP drafter.
type MTPOptions struct {
	// Steps is num_steps: drafts per verify span (≥ 1).
	Steps int
	// IndexShare is index_share_for_mtp_iteration: draft steps ≥ 1 reuse
	// step 0's indexer selection (plus the positions drafted since) instead
	// of scoring every pool again.
	IndexShare bool
}

// MTP drafts with the model's MTP (NextN) layer (architecture §7), SGLang's
// NEXTN/EAGLE chain with top-1: after the target commits tokens, the MTP
// layer runs over them ("draft extend": MTP position i reads token i+1 and
// the target's final hidden row i) and its last row's argmax is the first
// draft d1; each further step feeds the previous draft and the MTP's own
// hidden row (post shared_head.norm) back, Steps−1 times. Draft steps run
// under a checkpoint of the MTP store and are cut back before the next
// draft extend, which recomputes the accepted positions from the target's
// rows. Position 0 reads its embedding like any other (SGLang's convention;
// vLLM zeroes it): this changes drafts, never outputs.
type MTP struct {
	m     MTPModel
	store backend.Store
	opts  MTPOptions
	D     int
	slots seqSlots[*mtpSeq]
}

type mtpSeq struct {
	slot int
	n    int       // MTP positions committed (the target's committed length)
	d1   int32     // the first draft for the target's pending token
	h    []float32 // the MTP's hidden row at position n−1
	// ready: d1 and h are valid; drafted: the store holds draft positions
	// past n under an open checkpoint.
	ready, drafted bool
}

// NewMTP returns the MTP drafter on m, whose MTP store must allow
// checkpoints of opts.Steps positions (engine.Options.Rollback ≥ Steps).
func NewMTP(m MTPModel, opts MTPOptions) (*MTP, error) {
	if opts.Steps < 1 || opts.Steps > MaxSteps {
		return nil, fmt.Errorf("spec: num_steps must be in [1, %d], got %d", MaxSteps, opts.Steps)
	}
	if !m.Config().HasMTP() {
		return nil, fmt.Errorf("spec: the model has no MTP layer (num_nextn_predict_layers is %d): speculative method mtp needs one", m.Config().NumNextNPredictLayers)
	}
	if r, ok := m.(interface{ MTPReady() error }); ok {
		if err := r.MTPReady(); err != nil {
			return nil, fmt.Errorf("spec: %w", err)
		}
	}
	st, err := m.MTPStore()
	if err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	return &MTP{m: m, store: st, opts: opts, D: m.Config().HiddenSize, slots: newSeqSlots(st, "MTP store", func(slot int) *mtpSeq { return &mtpSeq{slot: slot} })}, nil
}

// Name is "mtp".
func (d *MTP) Name() string { return "mtp" }

// Needs the target's final hidden rows.
func (d *MTP) Needs() Needs { return Needs{FinalHidden: true} }

// MaxDrafts is num_steps.
func (d *MTP) MaxDrafts() int { return d.opts.Steps }

// Options returns the drafter's options.
func (d *MTP) Options() MTPOptions { return d.opts }

// share is the index-share width of the draft-step graphs (0: off).
func (d *MTP) share() int {
	if d.opts.IndexShare && d.opts.Steps > 1 {
		return d.opts.Steps - 1
	}
	return 0
}

// Keys are the MTP programs the drafter runs (compile them before serving):
// the draft extend after a prefill chunk and after a verify step, and the
// draft step.
func (d *MTP) Keys() []engine.Key {
	keys := []engine.Key{
		{MTP: true, Mode: graph.Extend, Logits: graph.LastLogits, IndexShare: d.share()},
		{MTP: true, Mode: graph.Verify, Logits: graph.LastLogits, IndexShare: d.share()},
	}
	if d.opts.Steps > 1 {
		keys = append(keys, engine.Key{MTP: true, Mode: graph.Decode, Logits: graph.LastLogits, IndexShare: d.share()})
	}
	return keys
}

// Start allocates the sequence's MTP slot.
func (d *MTP) Start(seq SeqID, _ []int32) error { return d.slots.start(seq) }

// Stop frees the sequence's MTP slot.
func (d *MTP) Stop(seq SeqID) { d.slots.stop(seq) }

// Close stops every sequence.
func (d *MTP) Close() error {
	d.slots.close()
	return nil
}

// Observe runs the draft extend: the MTP layer over the committed
// positions, reading the next tokens and the target's hidden rows; each
// sequence's last row gives its first draft.
func (d *MTP) Observe(obs []Observation) error {
	if len(obs) == 0 {
		return nil
	}
	b := &backend.Batch{SamplesOnly: true}
	verify := false
	seqs := make([]*mtpSeq, 0, len(obs))
	for _, o := range obs {
		s := d.slots.at(o.Seq)
		if s == nil {
			return fmt.Errorf("spec: sequence %s is not drafted", o.Seq)
		}
		if len(o.Tokens) == 0 || len(o.Hidden) != len(o.Tokens)*d.D {
			return fmt.Errorf("spec: sequence %s: %d tokens need %d×%d hidden values, got %d", o.Seq, len(o.Tokens), len(o.Tokens), d.D, len(o.Hidden))
		}
		if s.drafted {
			if err := d.store.Truncate(s.slot, s.n); err != nil {
				return fmt.Errorf("spec: sequence %s: %w", o.Seq, err)
			}
			s.drafted = false
		}
		if o.Pos0 != s.n {
			return fmt.Errorf("spec: sequence %s: the target committed from position %d, the MTP layer holds %d", o.Seq, o.Pos0, s.n)
		}
		toks := append(append(make([]int32, 0, len(o.Tokens)), o.Tokens[1:]...), o.Next)
		b.Seqs = append(b.Seqs, backend.Seq{Slot: s.slot, Tokens: toks, Hidden: o.Hidden})
		b.Sample = append(b.Sample, backend.SampleSpec{Params: sample.Greedy()})
		verify = verify || o.Verify
		seqs = append(seqs, s)
	}
	mode := graph.Extend
	if verify { // lengths that came from acceptance
		mode = graph.Verify
	}
	res, err := d.m.Run(engine.Key{MTP: true, Mode: mode, Logits: graph.LastLogits, IndexShare: d.share()}, b)
	if err != nil {
		for _, s := range seqs {
			s.ready = false
		}
		return fmt.Errorf("spec: MTP draft extend: %w", err)
	}
	hid := res.Hidden[ir.OutputFinalHidden]
	row := 0
	for i, s := range seqs {
		n := len(b.Seqs[i].Tokens)
		row += n
		s.n += n
		s.h = append(s.h[:0], hid[(row-1)*d.D:row*d.D]...)
		if err := res.Samples[i].Err; err != nil {
			s.ready = false
			return fmt.Errorf("spec: MTP draft extend: %w", err)
		}
		s.d1, s.ready = res.Samples[i].Token, true
	}
	return nil
}

// Propose chains up to Max drafts per sequence: d1 from the last draft
// extend, then one MTP step per further draft, batched over the sequences.
func (d *MTP) Propose(props []Proposal) error {
	type active struct {
		p *Proposal
		s *mtpSeq
		h []float32
	}
	var act []active
	for i := range props {
		p := &props[i]
		p.Drafts, p.Q = p.Drafts[:0], nil
		s := d.slots.at(p.Seq)
		if s == nil || !s.ready || p.Max < 1 {
			continue
		}
		if s.drafted {
			return fmt.Errorf("spec: sequence %s was proposed for twice without an observation", p.Seq)
		}
		p.Drafts = append(p.Drafts, s.d1)
		if min(p.Max, d.opts.Steps) > 1 {
			if err := d.store.Checkpoint(s.slot); err != nil {
				return fmt.Errorf("spec: sequence %s: %w", p.Seq, err)
			}
			s.drafted = true
			act = append(act, active{p: p, s: s, h: s.h})
		}
	}
	key := engine.Key{MTP: true, Mode: graph.Decode, Logits: graph.LastLogits, IndexShare: d.share()}
	for step := 1; len(act) > 0; step++ {
		b := &backend.Batch{SamplesOnly: true}
		for _, a := range act {
			b.Seqs = append(b.Seqs, backend.Seq{Slot: a.s.slot, Tokens: a.p.Drafts[step-1 : step], Hidden: a.h})
			b.Sample = append(b.Sample, backend.SampleSpec{Params: sample.Greedy()})
		}
		res, err := d.m.Run(key, b)
		if err != nil {
			return fmt.Errorf("spec: MTP draft step %d: %w", step, err)
		}
		hid := res.Hidden[ir.OutputFinalHidden]
		next := act[:0]
		for i, a := range act {
			if err := res.Samples[i].Err; err != nil {
				return fmt.Errorf("spec: MTP draft step %d: %w", step, err)
			}
			a.p.Drafts = append(a.p.Drafts, res.Samples[i].Token)
			a.h = hid[i*d.D : (i+1)*d.D]
			if len(a.p.Drafts) < min(a.p.Max, d.opts.Steps) {
				next = append(next, a)
			}
		}
		act = next
	}
	return nil
}

// Slot returns the MTP store slot of a sequence (tests read its state).
func (d *MTP) Slot(seq SeqID) (int, bool) {
	s := d.slots.at(seq)
	if s == nil {
		return -1, false
	}
	return s.slot, true
}

func (s *mtpSeq) slotIndex() int { return s.slot }
