package backend_test

import (
	"math"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/stretchr/testify/require"
)

// A spec's edits and allow mask are checked before any backend reads them
// (a device backend reads them where they point): each refusal names what
// is wrong; valid processing, and none, pass.
func TestCheckProcessing(t *testing.T) {
	const V = 100
	inf := float32(math.Inf(1))
	ok := []backend.SampleSpec{
		{},
		{Edits: []sample.Edit{{Token: 0, Penalty: 1.2}, {Token: 5, Add: -inf}, {Token: 99, Penalty: 0, Add: 3}}},
		{Allow: make([]uint32, sample.AllowWords(V))},
	}
	for i, s := range ok {
		require.NoError(t, s.CheckProcessing(V), "spec %d", i)
	}
	for _, tc := range []struct {
		spec backend.SampleSpec
		want string
	}{
		{backend.SampleSpec{Edits: []sample.Edit{{Token: 100}}}, "edit 0: token 100 is outside the vocabulary [0, 100)"},
		{backend.SampleSpec{Edits: []sample.Edit{{Token: -1}}}, "edit 0: token -1 is outside"},
		{backend.SampleSpec{Edits: []sample.Edit{{Token: 5}, {Token: 5}}}, "edit 1: token 5 after token 5 (edits are sorted by token, each token once)"},
		{backend.SampleSpec{Edits: []sample.Edit{{Token: 7}, {Token: 3}}}, "edit 1: token 3 after token 7"},
		{backend.SampleSpec{Edits: []sample.Edit{{Token: 1, Penalty: -2}}}, "edit 0 (token 1): penalty -2 is not a finite value ≥ 0"},
		{backend.SampleSpec{Edits: []sample.Edit{{Token: 1, Penalty: float32(math.NaN())}}}, "penalty NaN"},
		{backend.SampleSpec{Edits: []sample.Edit{{Token: 1, Penalty: inf}}}, "penalty +Inf"},
		{backend.SampleSpec{Edits: []sample.Edit{{Token: 1, Add: inf}}}, "edit 0 (token 1): addend +Inf is NaN or +Inf"},
		{backend.SampleSpec{Edits: []sample.Edit{{Token: 1, Add: float32(math.NaN())}}}, "addend NaN"},
		{backend.SampleSpec{Allow: make([]uint32, 3)}, "allow mask of 3 words for a vocabulary of 100 ids (want 4)"},
		{backend.SampleSpec{Allow: []uint32{}}, "allow mask of 0 words"},
	} {
		err := tc.spec.CheckProcessing(V)
		require.Error(t, err, tc.want)
		require.Contains(t, err.Error(), tc.want)
	}
}

// SampleHost processes each row on its own copy: rows with different
// processing in one call pick as they would alone, and the logits the
// caller passed stay raw.
func TestSampleHostProcessesEachRowApart(t *testing.T) {
	const V = 64
	logits := make([]float32, 3*V)
	for i := range logits {
		logits[i] = float32(i%V) / 10 // every row's argmax is token 63
	}
	raw := append([]float32(nil), logits...)
	only3 := make([]uint32, sample.AllowWords(V))
	only3[0] = 1 << 3
	specs := []backend.SampleSpec{
		{Params: sample.Greedy(), Allow: only3},
		{Params: sample.Greedy(), Edits: []sample.Edit{{Token: 5, Add: 100}}},
		{Params: sample.Greedy()},
	}
	got := backend.SampleHost(logits, V, specs)
	require.Equal(t, raw, logits, "the caller's logits stay raw")
	require.Equal(t, []int32{3, 5, 63}, []int32{got[0].Token, got[1].Token, got[2].Token})
	for i := range specs {
		alone := backend.SampleHost(raw[i*V:(i+1)*V], V, specs[i:i+1])
		require.Equal(t, alone[0], got[i], "row %d", i)
	}
}
