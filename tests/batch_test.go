package tests

import (
	"math"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/stretchr/testify/require"
)

func maxDiff(a, b []float32) float64 {
	d := 0.0
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

func seqTokens(n, seed, vocab int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32((seed*131 + i*17 + i*i*7) % vocab)
	}
	return t
}

// Running three sequences together (ragged, in one pass) gives each the
// logits it gets alone, in prefill and then in a mixed decode/extend step.
func TestBatchingDoesNotChangeResults(t *testing.T) {
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			ck, _ := openFixture(t, name)
			cfg := ck.Config()
			V := cfg.VocabSize
			prompts := [][]int32{seqTokens(37, 1, V), seqTokens(5, 2, V), seqTokens(70, 3, V)}
			conts := [][]int32{seqTokens(1, 4, V), seqTokens(9, 5, V), seqTokens(1, 6, V)}
			key := engine.Key{Mode: graph.Mixed, Logits: graph.AllLogits}

			alone := make([][2]*backend.Result, len(prompts))
			for i := range prompts {
				e, err := engine.New(cfg, ck, engine.Options{Slots: 1})
				require.NoError(t, err)
				slot, err := e.Store().Alloc()
				require.NoError(t, err)
				r1, err := e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: prompts[i]}}})
				require.NoError(t, err)
				r2, err := e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: conts[i]}}})
				require.NoError(t, err)
				alone[i] = [2]*backend.Result{r1, r2}
			}

			e, err := engine.New(cfg, ck, engine.Options{Slots: 3})
			require.NoError(t, err)
			var slots []int
			for range prompts {
				s, err := e.Store().Alloc()
				require.NoError(t, err)
				slots = append(slots, s)
			}
			for phase, toks := range [][][]int32{prompts, conts} {
				b := &backend.Batch{}
				for i := range toks {
					b.Seqs = append(b.Seqs, backend.Seq{Slot: slots[i], Tokens: toks[i]})
				}
				res, err := e.Run(key, b)
				require.NoError(t, err)
				row := 0
				for i := range toks {
					n := len(toks[i]) * V
					got := res.Logits[row : row+n]
					require.Less(t, maxDiff(got, alone[i][phase].Logits), 1e-5, "seq %d phase %d", i, phase)
					row += n
				}
			}
		})
	}
}

// Decoding token by token gives the same last logits as prefilling the
// whole sequence at once (recurrent vs chunked KDA, cached vs fresh MLA and
// indexer state).
func TestDecodeMatchesPrefill(t *testing.T) {
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			ck, _ := openFixture(t, name)
			cfg := ck.Config()
			toks := seqTokens(83, 9, cfg.VocabSize)
			e, err := engine.New(cfg, ck, engine.Options{Slots: 2})
			require.NoError(t, err)
			a, _ := e.Store().Alloc()
			whole, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: a, Tokens: toks}}})
			require.NoError(t, err)
			b, _ := e.Store().Alloc()
			var last *backend.Result
			for i := range toks {
				last, err = e.Run(engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: b, Tokens: toks[i : i+1]}}})
				require.NoError(t, err)
			}
			require.Less(t, maxDiff(last.Logits, whole.Logits), 1e-4)
		})
	}
}

func TestRunRejectsBadBatches(t *testing.T) {
	ck, _ := openFixture(t, fixtures[0])
	e, err := engine.New(ck.Config(), ck, engine.Options{Slots: 2, MaxPositions: 50})
	require.NoError(t, err)
	key := engine.Key{Mode: graph.Mixed, Logits: graph.LastLogits}
	s, _ := e.Store().Alloc()
	cases := map[string]*backend.Batch{
		"empty batch":      {},
		"no tokens":        {Seqs: []backend.Seq{{Slot: s}}},
		"token too large":  {Seqs: []backend.Seq{{Slot: s, Tokens: []int32{1, 256}}}},
		"negative token":   {Seqs: []backend.Seq{{Slot: s, Tokens: []int32{-1}}}},
		"unallocated slot": {Seqs: []backend.Seq{{Slot: 1, Tokens: []int32{1}}}},
		"duplicate slot":   {Seqs: []backend.Seq{{Slot: s, Tokens: []int32{1}}, {Slot: s, Tokens: []int32{2}}}},
		"too long":         {Seqs: []backend.Seq{{Slot: s, Tokens: seqTokens(51, 1, 256)}}},
	}
	for name, b := range cases {
		_, err := e.Run(key, b)
		require.Error(t, err, name)
	}
	n, err := e.Store().Len(s)
	require.NoError(t, err)
	require.Equal(t, 0, n, "rejected batches must not advance the cache")
}
