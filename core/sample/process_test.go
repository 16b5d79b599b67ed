package sample

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// Apply's rule, one case per branch: the repetition penalty divides a
// positive logit and multiplies a negative one, Add is added after it, a
// ban (Add = −Inf) and anything below the finite range land on Banned,
// raw non-finite values and untouched tokens stay, and the mask bans every
// token whose bit is clear (after the edits).
func TestApplyFollowsTheRule(t *testing.T) {
	inf := float32(math.Inf(1))
	nan := float32(math.NaN())
	row := []float32{2, -2, 0, 1, 3, inf, nan, 5, -math.MaxFloat32 / 2, 7}
	Apply(row, []Edit{
		{Token: 0, Penalty: 4},           // 2/4
		{Token: 1, Penalty: 4, Add: 0.5}, // −2·4 + 0.5
		{Token: 2, Penalty: 4, Add: -1},  // 0·4 − 1
		{Token: 3, Add: float32(math.Inf(-1))},
		{Token: 4, Penalty: 1, Add: 100},   // no penalty
		{Token: 5, Add: -1},                // +Inf stays
		{Token: 6, Penalty: 2},             // NaN stays
		{Token: 8, Add: -math.MaxFloat32},  // below the finite range: Banned
		{Token: 9, Penalty: 0, Add: -0.25}, // Penalty 0 is none
	}, nil)
	require.Equal(t, float32(0.5), row[0])
	require.Equal(t, float32(-7.5), row[1])
	require.Equal(t, float32(-1), row[2])
	require.Equal(t, float32(Banned), row[3])
	require.Equal(t, float32(103), row[4])
	require.True(t, math.IsInf(float64(row[5]), 1))
	require.True(t, math.IsNaN(float64(row[6])))
	require.Equal(t, float32(5), row[7], "a token without an edit is untouched")
	require.Equal(t, float32(Banned), row[8])
	require.Equal(t, float32(6.75), row[9])

	// A penalty near 0 divides a finite logit past the finite range: it
	// stays the largest finite value (a ban after it still bans).
	row = []float32{1e30, 1e30}
	Apply(row, []Edit{{Token: 0, Penalty: 0x1p-126}, {Token: 1, Penalty: 0x1p-126, Add: float32(math.Inf(-1))}}, nil)
	require.Equal(t, float32(math.MaxFloat32), row[0])
	require.Equal(t, float32(Banned), row[1])

	// The mask comes after the edits: a bias cannot lift a masked token.
	row = make([]float32, 40)
	for i := range row {
		row[i] = float32(i)
	}
	allow := make([]uint32, AllowWords(len(row)))
	for _, tok := range []int32{1, 5, 33} {
		allow[tok>>5] |= 1 << (uint32(tok) & 31)
	}
	Apply(row, []Edit{{Token: 2, Add: 100}, {Token: 5, Add: 1}}, allow)
	for i, v := range row {
		switch i {
		case 1, 33:
			require.Equal(t, float32(i), v)
		case 5:
			require.Equal(t, float32(6), v)
		default:
			require.Equal(t, float32(Banned), v, "token %d is masked", i)
		}
		require.Equal(t, Allowed(allow, int32(i)), i == 1 || i == 5 || i == 33)
	}
	require.True(t, Allowed(nil, 39), "a nil mask allows everything")
	require.Equal(t, 2, AllowWords(33))
	require.Equal(t, 1, AllowWords(32))
}

// A banned token has probability 0 and is never drawn, whatever the draw,
// the temperature or the filters: with u at the top of [0, 1) the pick
// falls through to the last kept token, which must be a possible one.
func TestBannedTokensAreNeverPicked(t *testing.T) {
	row := []float32{1, 0.5, Banned, 0.25, Banned, Banned}
	for _, p := range []Params{
		{Temperature: 1, TopP: 1},
		{Temperature: 100, TopP: 1},
		{Temperature: 1e6, TopP: 1, TopK: 5},
		{Temperature: 0.5, TopP: 0.999999},
		{Temperature: 2, TopP: 1, MinP: 1e-9},
	} {
		for _, u := range []float64{0, 0.3, 0.999, 1 - 1e-12, math.Nextafter(1, 0)} {
			got := Pick(row, p, u)
			require.Contains(t, []int{0, 1, 3}, got, "params %+v, u %v", p, u)
		}
		ids, pr := Dist(row, p)
		for i, id := range ids {
			require.NotContains(t, []int{2, 4, 5}, id)
			require.Positive(t, pr[i])
		}
	}
	require.Equal(t, 0, Pick(row, Greedy(), 0.9))
	// Only one token left: it is always the pick.
	one := []float32{Banned, Banned, -3, Banned}
	for _, u := range []float64{0, 0.5, math.Nextafter(1, 0)} {
		require.Equal(t, 2, Pick(one, Params{Temperature: 1, TopP: 1}, u))
	}
	// Its log-probability is 0, and a banned token's is far below any
	// other's.
	lp, top := Logprobs(one, 2, 2)
	require.Equal(t, float32(0), lp)
	require.Equal(t, int32(2), top[0].ID)
	require.Less(t, float64(top[1].Logprob), -1e30)
}

// Underflow is zero probability too: a token far below the top at a low
// temperature is never the fall-through pick.
func TestUnderflowedTokensAreNeverPicked(t *testing.T) {
	row := []float32{10, 9, -1e4, -2e4}
	for _, u := range []float64{0.999999, math.Nextafter(1, 0)} {
		require.Contains(t, []int{0, 1}, Pick(row, Params{Temperature: 0.05, TopP: 1}, u))
	}
}

// Active is false for the zero value and for an explicit repetition
// penalty of 1, true as soon as any processor is on.
func TestProcessingActive(t *testing.T) {
	require.False(t, Processing{}.Active())
	require.False(t, Processing{RepetitionPenalty: 1}.Active())
	for _, p := range []Processing{
		{RepetitionPenalty: 1.1}, {PresencePenalty: -0.5}, {FrequencyPenalty: 2}, {LogitBias: map[int32]float64{3: 0}},
	} {
		require.True(t, p.Active(), "%+v", p)
	}
}

// Validate names the bad field and accepts the bounds.
func TestProcessingValidate(t *testing.T) {
	ok := Processing{RepetitionPenalty: 100, PresencePenalty: -2, FrequencyPenalty: 2, LogitBias: map[int32]float64{0: -100, 9: 100}}
	require.NoError(t, ok.Validate(10))
	bias := map[int32]float64{}
	for i := range MaxLogitBias + 1 {
		bias[int32(i)] = 1
	}
	for _, c := range []struct {
		p    Processing
		want string
	}{
		{Processing{RepetitionPenalty: -1}, "repetition_penalty"},
		{Processing{RepetitionPenalty: 101}, "repetition_penalty"},
		{Processing{RepetitionPenalty: math.NaN()}, "repetition_penalty"},
		{Processing{PresencePenalty: 2.5}, "presence_penalty"},
		{Processing{FrequencyPenalty: math.Inf(-1)}, "frequency_penalty"},
		{Processing{LogitBias: map[int32]float64{10: 1}}, "logit_bias: token id 10"},
		{Processing{LogitBias: map[int32]float64{-1: 1}}, "logit_bias: token id -1"},
		{Processing{LogitBias: map[int32]float64{3: 100.5}}, "logit_bias[3]"},
		{Processing{LogitBias: bias}, "logit_bias: at most"},
	} {
		err := c.p.Validate(10)
		require.Error(t, err, "%+v", c.p)
		require.Contains(t, err.Error(), c.want)
	}
}
