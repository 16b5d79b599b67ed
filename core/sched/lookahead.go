package sched

import (
	"github.com/glmflash/glmflash/core/backend"
)

// lookahead is the next step, planned and prepared while the current one
// executes, under the assumption that every running request continues and
// nothing else changes (not to be confused with speculative decoding: a
// step with verify spans is never prepared ahead, its positions come from
// acceptance).
type lookahead struct {
	running []*request // the running set it was planned for
	rr      int
	batch   []item
	prefill []bool // item i is a prompt chunk (else a decode token to fill in)
	b       *backend.Batch
	pos     []int
	prep    *backend.Prepared
	err     error
	fed     []int // projected r.fed per item
}

// lookaheadLocked plans the step after batch as planLocked will, on the
// state that batch leaves if no request finishes. It returns nil when a
// Score request, a speculating request or a pending admission makes the
// prediction pointless.
func (rt *Scheduler) lookaheadLocked(batch []item) *lookahead {
	if len(rt.waiting) > 0 || rt.closing || rt.draining {
		return nil
	}
	inBatch := map[*request]int{}
	for _, it := range batch {
		inBatch[it.r] = len(it.tokens)
	}
	fed := map[*request]int{}
	cached := map[*request]int{}
	for _, r := range rt.running {
		if r.Score || r.killed || r.drafting || r.resuming {
			return nil
		}
		f, c := r.fed, r.cached
		if n, ok := inBatch[r]; ok {
			if r.prefilling() {
				f += n
			}
			c += n
		}
		fed[r], cached[r] = f, c
	}
	sp := &lookahead{running: append([]*request(nil), rt.running...), rr: rt.rr, b: &backend.Batch{}}
	budget := rt.cfg.MaxBatchTokens
	n := len(rt.running)
	start := rt.rr % n
	for k := 0; k < n && budget > 0; k++ {
		r := rt.running[(start+k)%n]
		if fed[r] >= len(r.feed()) {
			sp.add(r, []int32{0}, false, fed[r], cached[r])
			budget--
		}
	}
	for _, r := range rt.running {
		if budget == 0 {
			break
		}
		if f := fed[r]; f < len(r.feed()) {
			c := min(rt.cfg.PrefillChunk, len(r.feed())-f, budget)
			sp.add(r, r.feed()[f:f+c], true, f, cached[r])
			budget -= c
		}
	}
	return sp
}

func (sp *lookahead) add(r *request, toks []int32, prefill bool, fed, cached int) {
	sp.batch = append(sp.batch, item{r: r, tokens: toks, row0: len(sp.batch)})
	sp.prefill = append(sp.prefill, prefill)
	sp.fed = append(sp.fed, fed)
	sp.pos = append(sp.pos, cached)
	sp.b.Seqs = append(sp.b.Seqs, backend.Seq{Slot: r.slot, Tokens: toks})
}

// lookaheadValidLocked reports whether the lookahead's assumptions held:
// the same running requests, none finished, the planned state reached.
func (rt *Scheduler) lookaheadValidLocked(sp *lookahead) bool {
	if sp.prep == nil || sp.rr != rt.rr || len(sp.running) != len(rt.running) {
		return false
	}
	for i, r := range rt.running {
		if sp.running[i] != r || r.killed || r.Score {
			return false
		}
	}
	for i, it := range sp.batch {
		if it.r.fed != sp.fed[i] || it.r.cached != sp.pos[i] || it.r.prefilling() != sp.prefill[i] {
			return false
		}
	}
	return true
}

// takeLookaheadLocked makes la's batch the step's when la's assumptions
// held, with la's preparation and this step's decode tokens filled in (the
// preparation is dropped, for a fresh one, when they do not fit); it
// advances the round-robin start as planLocked does.
func (rt *Scheduler) takeLookaheadLocked(s *step, la *lookahead) bool {
	if la == nil || !rt.lookaheadValidLocked(la) || !rt.pagesFitLocked(la.batch) {
		return false
	}
	s.batch, s.prep = la.batch, la.prep
	for i, it := range s.batch {
		if !la.prefill[i] {
			s.batch[i].tokens = []int32{it.r.next}
			if s.prep == nil {
				continue // an earlier item did not fit
			}
			if err := s.prep.SetTokens(i, s.batch[i].tokens); err != nil {
				s.prep = nil // fall back to a fresh preparation
			}
		}
	}
	rt.rr++
	rt.ahead.Add(1)
	return true
}

// prepareNext is a plain step's overlap: while s executes, it plans the
// step after s (lookaheadLocked, under mu) and prepares its batch on the
// host. It returns nil when there is nothing worth preparing or the
// preparation failed (the next step is then planned and prepared afresh).
func (rt *Scheduler) prepareNext(pp Preparer, s *step) *lookahead {
	rt.mu.Lock()
	la := rt.lookaheadLocked(s.batch)
	rt.mu.Unlock()
	if la == nil {
		return nil
	}
	if la.prep, la.err = pp.Prepare(s.key, la.b, la.pos); la.err != nil {
		return nil
	}
	return la
}
