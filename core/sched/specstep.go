package sched

import (
	"math"
	"time"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/speculative"
)

// SpecProgram is the program of a speculative step: a continuous batch
// whose speculating sequences run verify spans (their pending token and its
// drafts) beside decode tokens and prompt chunks, with logits for every row
// of a verify span and one for the others (span logits), and the target's
// final hidden rows or its target-layer rows when the drafter reads them.
func SpecProgram(d speculative.Drafter) engine.Key {
	n := d.Needs()
	return engine.Key{Mode: graph.Verify, Logits: graph.SpanLogits, FinalHidden: n.FinalHidden, TargetHidden: n.TargetHidden}
}

// drafting reports whether a planned step holds a request the drafter
// drafts for (its prompt chunks feed the drafter too).
func drafting(batch []item) bool {
	for _, it := range batch {
		if it.r.drafting {
			return true
		}
	}
	return false
}

// A speculative step's plan, beside a plain one's: the drafter proposes
// drafts for the decode tokens of its sequences (propose), and the target
// runs the whole batch once, each drafted sequence's span under a
// checkpoint of its cache slot (buildSpecLocked). Its collection accepts a
// prefix of each span's drafts and adds the target's own token, cuts each
// slot back to what it committed (collectSpanLocked), and the drafter
// observes the committed tokens, prompt chunks included (observe).

// propose asks the drafter for the step's drafts. Called without mu.
func (rt *Scheduler) propose(s *step) {
	batch := s.batch
	var props []speculative.Proposal
	var who []int
	for i, it := range batch {
		if it.maxDrafts > 0 && it.r.drafting {
			props = append(props, speculative.Proposal{Seq: it.r.ID, Max: it.maxDrafts})
			who = append(who, i)
		}
	}
	if len(props) == 0 {
		return
	}
	if err := rt.draft.Propose(props); err != nil {
		rt.dropDrafting(batch, who, err)
		return
	}
	for j, i := range who {
		p := props[j]
		if len(p.Drafts) > batch[i].maxDrafts {
			p.Drafts = p.Drafts[:batch[i].maxDrafts]
		}
		batch[i].drafts, batch[i].q = p.Drafts, p.Q
		batch[i].tokens = append([]int32{batch[i].r.next}, p.Drafts...)
	}
}

// buildSpecLocked builds a speculative step's batch: a verify span's every
// row gets logits, a scored prompt's every row when it asks all positions,
// the others their last. A checkpoint that fails fails the step.
func (rt *Scheduler) buildSpecLocked(s *step) {
	s.key = SpecProgram(rt.draft)
	s.b = &backend.Batch{SamplesOnly: true}
	rows := 0
	for i := range s.batch {
		it := &s.batch[i]
		r := it.r
		it.nrows = 1
		switch {
		case len(it.drafts) > 0:
			it.nrows = len(it.tokens)
			if s.err == nil {
				s.err = rt.m.Store().Checkpoint(r.slot)
			}
			if r.Sampling.Temperature > 0 {
				s.b.SamplesOnly = false // the acceptance rule reads the target's probabilities
			}
		case r.Score:
			s.b.SamplesOnly = false
			if r.AllPositions {
				it.nrows = len(it.tokens)
			}
		}
		it.row0, it.tok0 = rows, s.ntok
		rows += it.nrows
		s.ntok += len(it.tokens)
		s.b.Seqs = append(s.b.Seqs, backend.Seq{Slot: r.slot, Tokens: it.tokens, LogitRows: it.nrows})
		s.b.Sample = appendSpecSamplesLocked(s.b.Sample, it)
	}
}

// observe tells the drafter what a speculative step committed; a drafter
// error turns speculation off for the observed requests. Called without mu.
func (rt *Scheduler) observe(s *step) {
	if len(s.obs) == 0 {
		return
	}
	err := rt.draft.Observe(s.obs)
	if err == nil {
		return
	}
	var idx []int
	for i, it := range s.batch {
		for _, o := range s.obs {
			if o.Seq == it.r.ID {
				idx = append(idx, i)
			}
		}
	}
	rt.dropDrafting(s.batch, idx, err)
}

// dropDrafting turns speculation off for the given items' requests after a
// drafter error: they go on decoding plainly (their outputs never depended
// on the drafter).
func (rt *Scheduler) dropDrafting(batch []item, idx []int, err error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, i := range idx {
		r := batch[i].r
		if r.drafting {
			rt.log.Warn().Err(err).Str("request_id", r.ID).Msg("the drafter failed: speculative decoding is off for this request")
			rt.draft.Stop(r.ID)
			r.drafting = false
		}
		batch[i].drafts, batch[i].q = nil, nil
		if !r.prefilling() {
			batch[i].tokens = []int32{r.next}
		}
	}
}

// appendSpecSamplesLocked appends an item's sampling specs, one per logits
// row.
// A verify span's rows carry greedy specs whose picks are the target's
// argmax tokens (a sampled request's acceptance reads the logits instead
// and draws its own randomness); a plain row that yields a token draws as
// plain decoding does.
func appendSpecSamplesLocked(specs []backend.SampleSpec, it *item) []backend.SampleSpec {
	if len(it.drafts) > 0 {
		for range it.nrows {
			specs = append(specs, backend.SampleSpec{Params: sample.Greedy(), TopLogprobs: it.r.TopLogprobs})
		}
		return specs
	}
	return appendSpecsLocked(specs, it.r, len(it.tokens), it.nrows)
}

// collectSpecItemLocked applies one item of a speculative step: a verify
// span's acceptance (collectSpanLocked), else a prompt chunk or decode
// token as in a plain step; a drafted request that goes on keeps what it
// committed for the drafter (s.obs).
func (rt *Scheduler) collectSpecItemLocked(s *step, it item, now time.Time, n *tally) {
	r := it.r
	o := speculative.Observation{Seq: r.ID, Pos0: r.cached, Tokens: it.tokens}
	if hidden := s.res.Hidden[ir.OutputFinalHidden]; hidden != nil {
		D := rt.m.Config().HiddenSize
		o.Hidden = hidden[it.tok0*D : (it.tok0+len(it.tokens))*D]
	}
	if ctx := s.res.Hidden[ir.OutputTargetHidden]; ctx != nil && s.ntok > 0 {
		W := len(ctx) / s.ntok // every token of the step has a row
		o.Context = ctx[it.tok0*W : (it.tok0+len(it.tokens))*W]
	}
	more := false
	if len(it.drafts) > 0 {
		more = rt.collectSpanLocked(it, s.res, &o, now, n)
	} else {
		o.Next, more = rt.collectItemLocked(it, s.res, now, n)
	}
	if more && r.drafting {
		s.obs = append(s.obs, o)
	}
}

// collectSpanLocked applies a verify span: the accepted drafts and the
// target's token are delivered (up to a stop id or a limit, where plain
// decoding stops too), the slot is cut back to them and o records the
// commit. It reports whether r goes on.
func (rt *Scheduler) collectSpanLocked(it item, res *backend.Result, o *speculative.Observation, now time.Time, n *tally) bool {
	r := it.r
	toks, accepted, err := rt.acceptLocked(it, res)
	if err != nil {
		rt.completeLocked(r, FinishError, err.Error())
		return false
	}
	r.stats = r.stats.Add(speculative.Stats{Steps: 1, Drafted: len(it.drafts), Accepted: accepted})
	rt.met.Verified(len(it.drafts), accepted)
	for _, t := range toks {
		n.generated++
		if !rt.emitLocked(r, t, now) {
			return false // a stop id or a limit inside the accepted run
		}
	}
	r.cached += accepted + 1
	if err := rt.m.Store().Truncate(r.slot, r.cached); err != nil {
		rt.completeLocked(r, FinishError, err.Error())
		return false
	}
	o.Tokens, o.Next = it.tokens[:accepted+1], toks[len(toks)-1].ID
	o.Drafted, o.Accepted, o.Verify = len(it.drafts), accepted, true
	if o.Hidden != nil {
		o.Hidden = o.Hidden[:(accepted+1)*rt.m.Config().HiddenSize]
	}
	if o.Context != nil {
		o.Context = o.Context[:(accepted+1)*(len(o.Context)/len(it.tokens))]
	}
	return true
}

// acceptLocked decides one verify span: the tokens it emits (the accepted
// drafts, then the target's token) and how many drafts were accepted.
func (rt *Scheduler) acceptLocked(it item, res *backend.Result) ([]Token, int, error) {
	r := it.r
	rows := res.Samples[it.row0 : it.row0+it.nrows]
	for _, s := range rows {
		if s.Err != nil {
			return nil, 0, s.Err
		}
	}
	var accepted int
	var next int32
	row := func(j int) []float32 { return res.Row(it.row0 + j) }
	switch {
	case rt.sim > 0: // simulated acceptance: the chain decides, the target gives the next token
		if !r.simKeyed {
			r.simKey, r.simKeyed = speculative.SimulationKey(r.Sampling.Seed, r.Prompt), true
		}
		accepted = speculative.SimulatedAccepts(rt.sim, r.simKey, r.generated, len(it.drafts))
		if r.Sampling.Temperature == 0 {
			next = rows[accepted].Token // the device's pick (argmax) of that row
		} else {
			next = speculative.SimulatedNext(row, it.drafts, it.q, r.sampler.Params(), accepted, r.sampler.Draw)
		}
	case r.Sampling.Temperature == 0:
		targets := make([]int32, len(rows))
		for j, s := range rows {
			targets[j] = s.Token
		}
		accepted, next = speculative.AcceptGreedy(targets, it.drafts)
	default:
		accepted, next = speculative.Accept(row, it.drafts, it.q, r.sampler.Params(), r.sampler.Draw)
	}
	toks := make([]Token, 0, accepted+1)
	for j := 0; j <= accepted; j++ {
		id := next
		if j < accepted {
			id = it.drafts[j]
		}
		t := Token{ID: id, Index: r.generated + j}
		if res.Logits != nil {
			t.Logprob, t.Top = sample.Logprobs(res.Row(it.row0+j), id, r.TopLogprobs)
		} else { // greedy on a device sampler: every emitted token is its row's pick
			t.Logprob, t.Top = rows[j].Logprob, rows[j].Top
			if rows[j].Token != id { // a draft simulated acceptance forced: its logprob was not computed
				t.Logprob = float32(math.NaN())
			}
		}
		toks = append(toks, t)
	}
	return toks, accepted, nil
}
