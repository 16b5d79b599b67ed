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
