package sample

import (
	"math/rand/v2"
	"testing"

	"github.com/glmflash/glmflash/core/collective"
	"github.com/stretchr/testify/require"
)

// The two-stage reduction picks Argmax of the whole row on every rank, ties
// (within a block and across blocks) to the lowest id, at 1, 2 and 4 ranks.
func TestShardedArgmax(t *testing.T) {
	const rows, vocab = 7, 64
	rng := rand.New(rand.NewPCG(1, 2))
	full := make([]float32, rows*vocab)
	for i := range full {
		full[i] = float32(rng.IntN(9)) // many ties
	}
	full[3*vocab+40], full[3*vocab+50] = 100, 100 // a tie across blocks
	want := make([]int, rows)
	for r := range rows {
		want[r] = Argmax(full[r*vocab : (r+1)*vocab])
	}
	require.Equal(t, 40, want[3])
	for _, n := range []int{1, 2, 4} {
		g, err := collective.NewGroup(n)
		require.NoError(t, err)
		V := vocab / n
		got := make([][]int, n)
		require.NoError(t, g.Run(func(rank int) error {
			block := make([]float32, rows*V)
			for r := range rows {
				copy(block[r*V:(r+1)*V], full[r*vocab+rank*V:r*vocab+(rank+1)*V])
			}
			got[rank] = make([]int, rows)
			return ShardedArgmax(g.Rank(rank), block, rows, V, got[rank])
		}))
		for rank := range n {
			require.Equal(t, want, got[rank], "%d ranks, rank %d", n, rank)
		}
		require.Equal(t, int64(4*2*rows), g.Rank(0).Stats().Bytes, "two values per row, not the block")
	}
	g, _ := collective.NewGroup(1)
	require.ErrorContains(t, ShardedArgmax(g.Rank(0), make([]float32, 3), 2, 2, make([]int, 2)), "sharded argmax of 2 rows")
}
