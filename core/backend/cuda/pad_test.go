package cuda

import (
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/stretchr/testify/require"
)

// padBatch pads a batch past graph_max_tokens to the smallest bucket that
// holds its padding: the real spans, tokens and specs first and unchanged,
// then padding spans of the padding slot at position 0 spread evenly (each
// at least one row, one logits row), greedy specs for their rows and no
// checkpoint or shared selection; batches it cannot bucket run as they are.
func TestPadBatch(t *testing.T) {
	g := ir.New("pad")
	logits := g.AddInput("logits", ir.F32, ir.DimS, 4)
	b := &Backend{cuda: Options{GraphMaxTokens: 8, GraphBuckets: []int{16, 32, 64}}}
	p := &Program{b: b, plan: &plan.Plan{Logits: logits, HostLengths: true, Vocab: 4}}
	st := &Store{pad: true, used: make([]bool, 5), maxPos: 40}
	rc := &runCtx{store: st}
	prep := func(ns ...int) *backend.Prepared {
		pr := &backend.Prepared{Prog: p, Store: st}
		for i, n := range ns {
			pr.Spans = append(pr.Spans, backend.Span{Slot: i, Pos0: 3 * i, N: n, Row0: pr.T, Rows: 1})
			for j := 0; j < n; j++ {
				pr.Tokens = append(pr.Tokens, int32(1+i))
			}
			pr.T += n
			pr.Sample = append(pr.Sample, backend.SampleSpec{Params: sample.Params{Temperature: 0.5}, U: 0.25})
		}
		return pr
	}
	ckpt := func(pr *backend.Prepared) []int {
		c := make([]int, len(pr.Spans))
		for i := range c {
			c[i] = 7
		}
		return c
	}

	pr := prep(1, 13, 6) // 20 tokens in 3 sequences → 32 in 4
	q, ck, sh, ok := p.padBatch(rc, pr, ckpt(pr), ckpt(pr))
	require.True(t, ok)
	require.Equal(t, 32, q.T)
	require.Len(t, q.Spans, 4)
	require.Equal(t, pr.Spans, q.Spans[:3])
	require.Equal(t, backend.Span{Slot: 5, Pos0: 0, N: 12, Row0: 20, Rows: 1}, q.Spans[3])
	require.Equal(t, pr.Tokens, q.Tokens[:20])
	require.Equal(t, make([]int32, 12), q.Tokens[20:])
	require.Equal(t, pr.Sample, q.Sample[:3])
	require.Equal(t, []backend.SampleSpec{{Params: sample.Greedy()}}, q.Sample[3:])
	require.Equal(t, []int{7, 7, 7, -1}, ck)
	require.Equal(t, []int{7, 7, 7, -1}, sh)
	require.Equal(t, 20, pr.T, "the caller's batch is not changed")

	pr = prep(1, 1, 1, 17) // 20 in 4 → 32 in 8: 12 rows over 4 padding sequences
	q, _, _, ok = p.padBatch(rc, pr, ckpt(pr), ckpt(pr))
	require.True(t, ok)
	require.Equal(t, 32, q.T)
	for i, s := range q.Spans[4:] {
		require.Equal(t, backend.Span{Slot: 5, N: 3, Row0: 20 + 3*i, Rows: 1}, s)
	}
	require.Len(t, q.Sample, 8)

	pr = prep(1, 12, 1, 2) // 16 tokens: a bucket exactly, no padding
	q, _, _, ok = p.padBatch(rc, pr, ckpt(pr), ckpt(pr))
	require.True(t, ok)
	require.Equal(t, pr.Spans, q.Spans)
	require.Equal(t, 16, q.T)

	pr = prep(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1) // 15 in 15 → 16 needs 1 padding sequence of ≥ 1 row: 16 in 16
	q, _, _, ok = p.padBatch(rc, pr, ckpt(pr), ckpt(pr))
	require.True(t, ok)
	require.Equal(t, 16, q.T)
	require.Len(t, q.Spans, 16)

	pr = prep(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1) // 16 in 16: exactly
	q, _, _, ok = p.padBatch(rc, pr, ckpt(pr), ckpt(pr))
	require.True(t, ok)
	require.Len(t, q.Spans, 16)
	pr.Spans, pr.Tokens, pr.T, pr.Sample = append(pr.Spans, backend.Span{Slot: 0, N: 1, Row0: 16, Rows: 1}), append(pr.Tokens, 1), 17, append(pr.Sample, pr.Sample[0])
	q, _, _, ok = p.padBatch(rc, pr, ckpt(pr), ckpt(pr)) // 17 in 17 → 32 in 32: 15 rows for 15 padding sequences
	require.True(t, ok)
	require.Equal(t, 32, q.T)
	require.Len(t, q.Spans, 32)

	for _, ns := range [][]int{{8}, {65}} { // an exact graph; past every bucket
		pr = prep(ns...)
		_, _, _, ok = p.padBatch(rc, pr, ckpt(pr), ckpt(pr))
		require.False(t, ok, "%v", ns)
	}
	pr = prep(1, 60) // 61 → 64 in 4 (3 rows for 2 padding sequences): fits
	_, _, _, ok = p.padBatch(rc, pr, ckpt(pr), ckpt(pr))
	require.True(t, ok)
	st.maxPos = 1 // padding sequences may not pass the store's positions
	pr = prep(1, 20)
	_, _, _, ok = p.padBatch(rc, pr, ckpt(pr), ckpt(pr)) // 21 → 32: 11 rows for 2 padding sequences of 6 > 1
	require.False(t, ok)
	st.maxPos = 40
	pr = prep(1, 20)
	pr.Hidden = []float32{0}
	_, _, _, ok = p.padBatch(rc, pr, ckpt(pr), ckpt(pr))
	require.False(t, ok, "MTP batches are not bucketed")
	st.pad = false
	_, _, _, ok = p.padBatch(rc, prep(1, 20), nil, nil)
	require.False(t, ok, "a store without a padding slot")
	st.pad = true
	b.cuda.NoGraphBuckets = true
	_, _, _, ok = p.padBatch(rc, prep(1, 20), nil, nil)
	require.False(t, ok, "bucket graphs off")
}
