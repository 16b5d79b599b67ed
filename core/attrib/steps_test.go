package attrib

import (
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/kernels/mla"
	"github.com/stretchr/testify/require"
)

// A context prefilled in chunks is the context prefilled at once: the next
// decode step's logits agree (the KDA chunking of the two differs, so within
// fp32 rounding), for a chunk that divides the context and one that does not.
func TestPrefillSlotsInChunks(t *testing.T) {
	ck := tinyCheckpoint(t, 3)
	V := ck.Config().VocabSize
	const n = 70
	next := func(chunk int) []float32 {
		e, err := engine.New(ck.Config(), ck, engine.Options{Slots: 2})
		require.NoError(t, err)
		defer e.Close()
		var slots []int
		for range 2 {
			s, err := e.Store().Alloc()
			require.NoError(t, err)
			slots = append(slots, s)
		}
		require.NoError(t, prefillSlotsChunked(e, slots, V, n, chunk))
		b := &backend.Batch{}
		for i, s := range slots {
			b.Seqs = append(b.Seqs, backend.Seq{Slot: s, Tokens: []int32{int32(5 + i)}})
		}
		r, err := e.Run(DecodeKey, b)
		require.NoError(t, err)
		return append([]float32(nil), r.Logits...)
	}
	whole := next(n)
	require.NotEmpty(t, whole)
	for _, chunk := range []int{32, 35} {
		got := next(chunk)
		require.Len(t, got, len(whole))
		for i := range whole {
			require.InDelta(t, whole[i], got[i], 1e-4, "chunk %d, logit %d", chunk, i)
		}
	}
	require.Equal(t, 512, ContextChunk)
}

// A long context (400 tokens: the tiny indexer keeps 4 pools of 4 and the
// tail, so every query's selection is sparse and a chunk's union spans the
// cache) prefilled in chunks gives the next decode step's logits of the
// context prefilled at once by the expand path, within 1e-4, whichever MLA
// path the chunks take: the cost and scratch rule's choice per chunk, or
// either path forced.
func TestPrefillLongContextInChunks(t *testing.T) {
	ck := tinyCheckpoint(t, 4)
	V := ck.Config().VocabSize
	const n = 400
	defer func() { mla.Force = mla.PathAuto }()
	next := func(chunk int, p mla.Path) []float32 {
		mla.Force = p
		defer func() { mla.Force = mla.PathAuto }()
		e, err := engine.New(ck.Config(), ck, engine.Options{Slots: 1})
		require.NoError(t, err)
		defer e.Close()
		s, err := e.Store().Alloc()
		require.NoError(t, err)
		require.NoError(t, prefillSlotsChunked(e, []int{s}, V, n, chunk))
		r, err := e.Run(DecodeKey, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: []int32{7}}}})
		require.NoError(t, err)
		return append([]float32(nil), r.Logits...)
	}
	whole := next(n, mla.PathExpand)
	require.NotEmpty(t, whole)
	for _, chunk := range []int{64, 150} {
		for _, p := range []mla.Path{mla.PathAuto, mla.PathExpand, mla.PathAbsorb} {
			got := next(chunk, p)
			require.Len(t, got, len(whole))
			for i := range whole {
				require.InDelta(t, whole[i], got[i], 1e-4, "chunk %d, %s, logit %d", chunk, p, i)
			}
		}
	}
}
