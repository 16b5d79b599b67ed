package cuda

import (
	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/sample"
)

// A batch of more tokens than graphMax (prompt chunks beside decode
// tokens, a long prefill) runs from a bucket graph: padBatch pads it to
// the smallest bucket of Options.GraphBuckets that holds it, T_b tokens in
// S_b sequences (the next power of two above S), so that the steps of one
// bucket share one captured graph whatever their spans. Every padding
// sequence is a span of the store's padding slot (Store.pad) at position
// 0: its rows write only that slot's KDA windows and states and pending
// indexer rows, and latents and pooled keys only to the scratch page its
// page table row names, so no sequence's cache is touched; the padding
// rows' logits, samples and hidden rows are never read back (results).
// Every kernel computes a row from its own sequence's rows and cache only,
// so the real rows are those the eager batch computes. The spans are
// after the real ones, so the real rows, logits rows and sampling rows
// keep their indices. The store's positions and pages are those of the
// real batch (reserve and commit see only it).

// padBatch returns the padded batch of pr (ckpt and share extended with
// −1 for the padding sequences), or ok false where pr runs as it is: the
// program and batch cannot be bucketed (a store without a padding slot, an
// MTP or DFlash batch with hidden or context rows, indexer sharing), pr
// is small enough for an exact graph or larger than every bucket, or no
// bucket holds its padding within the store's positions.
func (p *Program) padBatch(rc *runCtx, pr *backend.Prepared, ckpt, share []int) (*backend.Prepared, []int, []int, bool) {
	st := rc.store
	bs := p.b.buckets()
	switch {
	case st == nil || !st.pad || len(bs) == 0 || !p.graphable():
		return nil, nil, nil, false
	case pr.T <= p.b.graphMax() || pr.T > bs[len(bs)-1]:
		return nil, nil, nil, false
	case pr.Hidden != nil || pr.TC > 0 || p.shareExtra > 0 || p.shareSaves:
		return nil, nil, nil, false
	}
	S := len(pr.Spans)
	Tb, Sb := 0, S
	for _, b := range bs {
		if b < pr.T {
			continue
		}
		if b == pr.T { // no padding
			Tb = b
			break
		}
		sb := nextPow2(S + 1)
		rows, seqs := b-pr.T, sb-S
		if rows >= seqs && (rows+seqs-1)/seqs <= st.maxPos {
			Tb, Sb = b, sb
			break
		}
	}
	if Tb == 0 {
		return nil, nil, nil, false
	}
	q := &p.padPr // its storage reused (execute holds the program's lock)
	spans, toks, specs := q.Spans[:0], q.Tokens[:0], q.Sample[:0]
	*q = backend.Prepared{Prog: pr.Prog, Store: pr.Store, Spans: append(spans, pr.Spans...), Tokens: append(toks, pr.Tokens...),
		T: Tb, SamplesOnly: pr.SamplesOnly}
	seqs, rows := Sb-S, Tb-pr.T
	padSlot := len(st.used)
	row0 := pr.T
	for i := 0; i < seqs; i++ {
		n := rows / seqs
		if i < rows%seqs {
			n++
		}
		q.Spans = append(q.Spans, backend.Span{Slot: padSlot, Pos0: 0, N: n, Row0: row0, Rows: 1})
		row0 += n
	}
	for range rows {
		q.Tokens = append(q.Tokens, 0)
	}
	if pr.Sample != nil {
		q.Sample = append(specs, pr.Sample...)
		for range q.Rows() - pr.Rows() {
			q.Sample = append(q.Sample, backend.SampleSpec{Params: sample.Greedy()})
		}
	}
	ck := append(append(p.padCkpt[:0], ckpt...), make([]int, seqs)...)
	sh := append(append(p.padShare[:0], share...), make([]int, seqs)...)
	for i := S; i < Sb; i++ {
		ck[i], sh[i] = -1, -1
	}
	p.padCkpt, p.padShare = ck, sh
	return q, ck, sh, true
}

// nextPow2 is the smallest power of two ≥ n.
func nextPow2(n int) int {
	p := 1
	for p < n {
		p *= 2
	}
	return p
}
