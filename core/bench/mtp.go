package bench

import (
	"time"

	"github.com/glmflash/glmflash/core/attrib"
	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
)

// benchMTP times steps chained MTP draft steps for B sequences (after an
// untimed 32-token trunk prefill and MTP prefill per sequence) and returns
// the draft tokens made and the seconds they took.
func benchMTP(e *engine.Engine, B, steps int, alloc func(int) ([]int, error), free func([]int)) (int, float64, error) {
	mst, err := e.MTPStore()
	if err != nil {
		return 0, 0, err
	}
	slots, err := alloc(B)
	if err != nil {
		return 0, 0, err
	}
	defer free(slots)
	var mslots []int
	defer func() {
		for _, s := range mslots {
			mst.Free(s)
		}
	}()
	D := e.Config().HiddenSize
	greedy := attrib.GreedySpecs(B)
	tb, mb := &backend.Batch{Sample: greedy, SamplesOnly: true}, &backend.Batch{Sample: greedy, SamplesOnly: true}
	for i, s := range slots {
		tb.Seqs = append(tb.Seqs, backend.Seq{Slot: s, Tokens: attrib.BenchTokens(32, i+2, e.Config().VocabSize)})
	}
	tr, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits, FinalHidden: true}, tb)
	if err != nil {
		return 0, 0, err
	}
	fh := tr.Hidden[ir.OutputFinalHidden]
	for i := range slots {
		ms, err := mst.Alloc()
		if err != nil {
			return 0, 0, err
		}
		mslots = append(mslots, ms)
		t := tb.Seqs[i].Tokens
		mb.Seqs = append(mb.Seqs, backend.Seq{Slot: ms, Tokens: append(append([]int32(nil), t[1:]...), tr.Samples[i].Token), Hidden: fh[i*32*D : (i+1)*32*D]})
	}
	out, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits, MTP: true}, mb)
	if err != nil {
		return 0, 0, err
	}
	last := func(out *backend.Result, n int) (tok []int32, h [][]float32) {
		rows := out.Hidden[ir.OutputFinalHidden]
		for i := range slots {
			tok = append(tok, out.Samples[i].Token)
			h = append(h, rows[((i+1)*n-1)*D:(i+1)*n*D])
		}
		return tok, h
	}
	tok, h := last(out, 32)
	key := engine.Key{Mode: graph.Decode, Logits: graph.LastLogits, MTP: true}
	t0 := time.Now()
	for st := 0; st < steps; st++ {
		db := &backend.Batch{Sample: greedy, SamplesOnly: true}
		for i, s := range mslots {
			db.Seqs = append(db.Seqs, backend.Seq{Slot: s, Tokens: tok[i : i+1], Hidden: h[i]})
		}
		if out, err = e.Run(key, db); err != nil {
			return 0, 0, err
		}
		tok, h = last(out, 1)
	}
	return B * steps, time.Since(t0).Seconds(), nil
}
