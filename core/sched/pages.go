package sched

import (
	"fmt"
	"slices"

	"github.com/glmflash/glmflash/core/backend"
)

// Admission and preemption by KV pages (a store that is a
// backend.PagedStore; any other store has no page limit here).
//
// A slot holds exactly the pages of the tokens it has cached (runs take
// them, Free and Truncate give them back), so a step's item needs
// ⌈(cached + its tokens)/P⌉ − ⌈cached/P⌉ more pages, a verify span's
// counting every draft it may get. A waiting request is admitted only
// when the pages of its whole prompt are free beyond what the prompts
// already running still need. When a step's decode tokens need more pages
// than are free, the newest running request is preempted (vLLM's
// recompute preemption): its slot and pages are freed and it goes back to
// the front of the queue; readmitted, it recomputes its prompt and the
// tokens it had generated but the last (resuming), then decodes that last
// one as it would have. Nothing it streamed is sent again and its sampler
// draws nothing while it resumes, so its output is the one a run without
// preemption gives (speculative decoding is off for it after a preemption).
// Prompt chunks that do not fit wait for pages: they are cut to the pages
// free, or left out of the step.

// PreemptMetrics is a Metrics that also counts preemptions (optional).
type PreemptMetrics interface {
	// Preempted: a running request was preempted for KV pages.
	Preempted()
}

// Preemptions counts the requests preempted for KV pages so far.
func (rt *Scheduler) Preemptions() int64 { return rt.preemptions.Load() }

// pagesLocked is the store's page pool (false: the store is not paged).
func (rt *Scheduler) pagesLocked() (backend.PageStats, bool) {
	ps, ok := rt.m.Store().(backend.PagedStore)
	if !ok {
		return backend.PageStats{}, false
	}
	st := ps.PageStats()
	return st, st.PageTokens > 0
}

func pagesFor(tokens, P int) int { return (tokens + P - 1) / P }

// itemPages is the pages an item's run takes beyond those its request
// holds.
func itemPages(it item, P int) int {
	c := it.r.cached
	return pagesFor(c+len(it.tokens)+it.maxDrafts, P) - pagesFor(c, P)
}

// promptPagesLocked is the pages the running requests' prompts (and
// resumptions) still need.
func (rt *Scheduler) promptPagesLocked(P int) int {
	n := 0
	for _, r := range rt.running {
		if r.prefilling() && !r.killed {
			n += pagesFor(len(r.feed()), P) - pagesFor(r.cached, P)
		}
	}
	return n
}

// pagesAdmitLocked reports whether copies prompts of tokens tokens can be
// admitted: their pages are free beyond those the running prompts still
// need. With nothing running a request is always admitted (one too long
// for the pool fails at its first step, fitPagesLocked).
func (rt *Scheduler) pagesAdmitLocked(tokens, copies int) bool {
	st, ok := rt.pagesLocked()
	if !ok || len(rt.running) == 0 {
		return true
	}
	return st.Free-rt.promptPagesLocked(st.PageTokens) >= copies*pagesFor(tokens, st.PageTokens)
}

// pagesFitLocked reports whether a planned batch's pages are free.
func (rt *Scheduler) pagesFitLocked(batch []item) bool {
	st, ok := rt.pagesLocked()
	if !ok {
		return true
	}
	need := 0
	for _, it := range batch {
		need += itemPages(it, st.PageTokens)
	}
	return need <= st.Free
}

// fitPagesLocked makes a planned batch fit the free pages: while its
// decode tokens (and verify spans) need more than are free, the newest
// running request is preempted and its items leave the batch; then prompt
// chunks take what is left in admission order, cut to it (a Score
// request's fixed chunk waits whole).
func (rt *Scheduler) fitPagesLocked(batch []item) []item {
	st, ok := rt.pagesLocked()
	if !ok {
		return batch
	}
	P := st.PageTokens
	for {
		need := 0
		for _, it := range batch {
			if !it.r.prefilling() {
				need += itemPages(it, P)
			}
		}
		if need <= st.Free {
			break
		}
		v := rt.victimLocked()
		if v == nil { // nothing may be preempted (Score requests, shared prefills hold the pages): decoders wait
			batch = slices.DeleteFunc(batch, func(it item) bool { return !it.r.prefilling() && itemPages(it, P) > 0 })
			continue
		}
		if len(rt.running) == 1 { // alone and still short: the pool cannot hold it
			rt.completeLocked(v, FinishError, fmt.Sprintf("the KV cache's %d pages of %d tokens cannot hold this request's %d tokens (runtime.memory_fraction sizes the pool)", st.Total, P, v.cached+1))
			rt.reapLocked()
		} else {
			rt.preemptLocked(v, st)
		}
		batch = slices.DeleteFunc(batch, func(it item) bool { return it.r == v })
		st, _ = rt.pagesLocked()
	}
	avail := st.Free
	for _, it := range batch {
		if !it.r.prefilling() {
			avail -= itemPages(it, P)
		}
	}
	kept := batch[:0]
	for _, it := range batch {
		if it.r.prefilling() {
			c := it.r.cached
			fit := (pagesFor(c, P)+avail)*P - c // tokens the free pages hold
			if fit <= 0 || (it.r.Score && len(it.tokens) > fit) {
				continue // waits for pages
			}
			if len(it.tokens) > fit {
				it.tokens = it.tokens[:fit]
			}
			avail -= itemPages(it, P)
		}
		kept = append(kept, it)
	}
	clear(batch[len(kept):])
	return kept
}

// victimLocked is the newest running request that may be preempted: not
// a Score request (its logits rows are collected as it goes), not a
// shared prefill (its choices wait on it), not already finalized.
func (rt *Scheduler) victimLocked() *request {
	for i := len(rt.running) - 1; i >= 0; i-- {
		if r := rt.running[i]; !r.Score && !r.carrier && !r.killed {
			return r
		}
	}
	return nil
}

// preemptLocked frees r's slot and pages and puts it at the front of the
// queue to be recomputed: its prompt and the tokens it generated but the
// last, after which it decodes that last token (collectItemLocked).
func (rt *Scheduler) preemptLocked(r *request, st backend.PageStats) {
	pages := pagesFor(r.cached, st.PageTokens)
	rt.freeLocked(r) // stops its drafting too: it decodes plainly from now on
	rt.running = slices.DeleteFunc(rt.running, func(o *request) bool { return o == r })
	r.fed, r.cached, r.resuming, r.seq = 0, 0, false, nil
	if g := len(r.out); g > 0 {
		r.seq = append(slices.Clip(r.Prompt), r.out[:g-1]...)
		r.resuming = true
	}
	r.preempted++
	rt.waiting = slices.Insert(rt.waiting, 0, r)
	rt.preemptions.Add(1)
	if pm, ok := rt.met.(PreemptMetrics); ok {
		pm.Preempted()
	}
	rt.log.Info().Str("request_id", r.ID).Int("generated", r.generated).Int("pages_freed", pages).Int("pages_free", st.Free).
		Int("running", len(rt.running)).Int("preempted", r.preempted).Msg("preempted for KV pages: it will be recomputed")
	rt.depthLocked()
}
