package sched

import (
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/speculative"
	"github.com/stretchr/testify/require"
)

// contextDrafter is fakeDrafter asking the target's target-layer rows.
type contextDrafter struct{ fakeDrafter }

func (d *contextDrafter) Needs() speculative.Needs { return speculative.Needs{TargetHidden: true} }

// contextModel is fakeModel whose results carry ir.OutputTargetHidden:
// token row t of the batch is [10t, 10t+1].
type contextModel struct{ *fakeModel }

func (m *contextModel) Run(key engine.Key, b *backend.Batch) (*backend.Result, error) {
	res, err := m.fakeModel.Run(key, b)
	if err != nil || !key.TargetHidden {
		return res, err
	}
	var ctx []float32
	t := 0
	for _, s := range b.Seqs {
		for range s.Tokens {
			ctx = append(ctx, float32(10*t), float32(10*t+1))
			t++
		}
	}
	res.Hidden = map[string][]float32{ir.OutputTargetHidden: ctx}
	return res, nil
}

// A drafter that reads the target's target-layer rows (Needs.TargetHidden,
// the DFlash drafter) gets them from the speculative step's own pass: the
// step runs the capturing program, and each observation holds the rows of
// exactly the tokens it commits — a verify span's accepted prefix and its
// last token, a prompt chunk's every token.
func TestSpecStepHandsTargetRowsToTheDrafter(t *testing.T) {
	fm := newFakeModel(3)
	m := &contextModel{fm}
	d := &contextDrafter{fakeDrafter{max: 3, drafts: func(speculative.SeqID) []int32 { return []int32{20, 21, 22} }}}
	rt := idle(t, m, Config{PrefillChunk: 4}, Options{Drafter: d})
	a := submit(t, rt, Request{ID: "a", Prompt: []int32{1, 2, 3}, MaxTokens: 10, Sampling: sample.Greedy()})
	_ = submit(t, rt, Request{ID: "b", Prompt: []int32{4, 5, 6, 7, 8, 9}, MaxTokens: 10, Sampling: sample.Greedy()})
	admit(t, rt)
	decoding(a, 1, 5)
	// rows: a's span 0..3 (the target agrees with 20, then says 9), b's
	// first prompt chunk's last row 4
	fm.pick = func(row int) int32 { return []int32{20, 9, 30, 31, 17}[row] }
	var s step
	take(rt, &s, nil)
	require.True(t, s.spec)
	require.True(t, s.key.TargetHidden, "the step's program captures the drafter's rows")
	require.Equal(t, [][]int32{{5, 20, 21, 22}, {4, 5, 6, 7}}, toks(&s))
	rt.executeStep(&s, noPrepareNext)
	rt.collectStep(&s)
	require.Len(t, d.obs, 2)
	oa, ob := d.obs[0], d.obs[1]
	if oa.Seq != "a" {
		oa, ob = ob, oa
	}
	require.Equal(t, []int32{5, 20}, oa.Tokens)
	require.Equal(t, []float32{0, 1, 10, 11}, oa.Context, "a's span rows 0 and 1: the pending token and the accepted draft")
	require.Equal(t, []int32{4, 5, 6, 7}, ob.Tokens)
	require.Equal(t, []float32{40, 41, 50, 51, 60, 61, 70, 71}, ob.Context, "b's chunk rows 4..7")
}
