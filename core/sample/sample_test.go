package sample

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGreedyIsArgmax(t *testing.T) {
	s := New(Greedy())
	require.Equal(t, 2, s.Next([]float32{0.1, 0.5, 0.9, 0.2}))
}

func TestSeededSamplingIsReproducible(t *testing.T) {
	logits := []float32{1, 2, 3, 2.5, 0.5, 1.5}
	draw := func(seed uint64) []int {
		s := New(Params{Temperature: 1, TopP: 1, Seed: seed})
		var out []int
		for i := 0; i < 50; i++ {
			out = append(out, s.Next(logits))
		}
		return out
	}
	require.Equal(t, draw(7), draw(7))
	require.NotEqual(t, draw(7), draw(8))
}

func TestFiltersRestrictSupport(t *testing.T) {
	logits := []float32{5, 4, 0, -3}
	for seed := uint64(0); seed < 40; seed++ {
		k := New(Params{Temperature: 2, TopK: 2, TopP: 1, Seed: seed}).Next(logits)
		require.Contains(t, []int{0, 1}, k)
		p := New(Params{Temperature: 1, TopP: 0.5, Seed: seed}).Next(logits)
		require.Equal(t, 0, p)
		m := New(Params{Temperature: 1, TopP: 1, MinP: 0.2, Seed: seed}).Next(logits)
		require.Contains(t, []int{0, 1}, m)
	}
}

func TestValidateNamesField(t *testing.T) {
	require.ErrorContains(t, Params{Temperature: -1, TopP: 1}.Validate(), "temperature")
	require.ErrorContains(t, Params{TopP: 0}.Validate(), "top_p")
	require.ErrorContains(t, Params{TopP: 1.5}.Validate(), "top_p")
	require.ErrorContains(t, Params{TopP: 1, TopK: -2}.Validate(), "top_k")
	require.ErrorContains(t, Params{TopP: 1, MinP: 1}.Validate(), "min_p")
	require.NoError(t, Greedy().Validate())
}

func TestCheckFinite(t *testing.T) {
	require.NoError(t, CheckFinite([]float32{1, -3, 0}))
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	require.ErrorContains(t, CheckFinite([]float32{1, nan, inf}), "2 of 3 values (the first, token 1, is NaN)")
	require.ErrorContains(t, CheckFinite([]float32{-inf}), "token 0, is -Inf")
}
