package attrib

import (
	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/sample"
)

// The engine-level workload `glmflash bench` and the pass micro-benchmark
// share: the same token streams, prefills and greedy decode steps, so their
// figures measure the same work.

// BenchTokens are n deterministic token ids for seed within a vocabulary.
func BenchTokens(n, seed, vocab int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32((seed*7919 + i*104729) % vocab)
	}
	return t
}

// PrefillSlots prefills 32 tokens in each slot (slot i's stream is seed
// i+2), as one batch.
func PrefillSlots(e *engine.Engine, slots []int, vocab int) error {
	return PrefillSlotsN(e, slots, vocab, 32)
}

// ContextChunk is the most tokens per sequence PrefillSlotsN runs in one
// step: a long context is prefilled in steps of this many tokens, as a
// server runs long prompts in chunks, so its activations stay bounded.
const ContextChunk = 512

// PrefillSlotsN is PrefillSlots with n tokens per slot (the context later
// decode steps attend), in steps of at most ContextChunk tokens a slot.
func PrefillSlotsN(e *engine.Engine, slots []int, vocab, n int) error {
	return prefillSlotsChunked(e, slots, vocab, n, ContextChunk)
}

func prefillSlotsChunked(e *engine.Engine, slots []int, vocab, n, chunk int) error {
	streams := make([][]int32, len(slots))
	for i := range slots {
		streams[i] = BenchTokens(n, i+2, vocab)
	}
	for f := 0; f < n; f += chunk {
		c := min(chunk, n-f)
		b := &backend.Batch{}
		for i, s := range slots {
			b.Seqs = append(b.Seqs, backend.Seq{Slot: s, Tokens: streams[i][f : f+c]})
		}
		if _, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, b); err != nil {
			return err
		}
	}
	return nil
}

// DecodeKey is the program decode steps run.
var DecodeKey = engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}

// GreedySpecs are the sampling specs of a decode step over n sequences:
// greedy on the backend, only ids coming back (as when serving).
func GreedySpecs(n int) []backend.SampleSpec {
	specs := make([]backend.SampleSpec, n)
	for i := range specs {
		specs[i].Params = sample.Greedy()
	}
	return specs
}

// DecodeStep runs decode step st over slots with GreedySpecs specs: token
// (st·31+i) mod vocab for slot i.
func DecodeStep(e *engine.Engine, slots []int, specs []backend.SampleSpec, st, vocab int) error {
	db := &backend.Batch{Sample: specs, SamplesOnly: true}
	for i, s := range slots {
		db.Seqs = append(db.Seqs, backend.Seq{Slot: s, Tokens: []int32{int32((st*31 + i) % vocab)}})
	}
	_, err := e.Run(DecodeKey, db)
	return err
}
