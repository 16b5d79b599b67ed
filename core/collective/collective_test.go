package collective

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Every rank holds the rank-order sum, bit for bit, for every group size
// and for buffers of several lengths in a row (the scratch grows).
func TestAllReduceSum(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			g, err := NewGroup(n)
			require.NoError(t, err)
			out := make([][][]float32, n)
			require.NoError(t, g.Run(func(r int) error {
				for step, L := range []int{5, 1, 300} {
					buf := make([]float32, L)
					for i := range buf {
						buf[i] = float32(r+1)*0.1 + float32(i) + float32(step)
					}
					if err := g.Rank(r).AllReduceSum(buf); err != nil {
						return err
					}
					out[r] = append(out[r], buf)
				}
				return nil
			}))
			for step, L := range []int{5, 1, 300} {
				want := make([]float32, L)
				for i := range want {
					for r := range n {
						want[i] += float32(r+1)*0.1 + float32(i) + float32(step)
					}
				}
				for r := range n {
					require.Equal(t, want, out[r][step], "rank %d step %d", r, step)
				}
			}
			for r := range n {
				s := g.Rank(r).Stats()
				require.Equal(t, int64(3), s.AllReduces)
				require.Equal(t, int64(4*(5+1+300)), s.Bytes)
			}
		})
	}
}

func TestAllGather(t *testing.T) {
	g, err := NewGroup(3)
	require.NoError(t, err)
	out := make([][]float32, 3)
	require.NoError(t, g.Run(func(r int) error {
		src := []float32{float32(r), float32(10 * r)}
		out[r] = make([]float32, 6)
		return g.Rank(r).AllGather(out[r], src)
	}))
	for r := range 3 {
		require.Equal(t, []float32{0, 0, 1, 10, 2, 20}, out[r])
		require.Equal(t, int64(1), g.Rank(r).Stats().AllGathers)
	}
}

// A rank that fails before its collective aborts the group: the others
// return ErrAborted instead of waiting, and Run names the failing rank.
func TestRankFailureAborts(t *testing.T) {
	g, err := NewGroup(4)
	require.NoError(t, err)
	boom := errors.New("boom")
	err = g.Run(func(r int) error {
		if r == 2 {
			return boom
		}
		return g.Rank(r).AllReduceSum(make([]float32, 4))
	})
	require.ErrorIs(t, err, boom)
	require.ErrorContains(t, err, "rank 2")
	// The next Run finds the group usable again.
	require.NoError(t, g.Err())
	require.NoError(t, g.Run(func(r int) error { return g.Rank(r).AllReduceSum(make([]float32, 4)) }))
	// Outside Run, an aborted group fails every collective at once.
	g.Abort(boom)
	require.ErrorIs(t, g.Rank(0).AllReduceSum(make([]float32, 1)), ErrAborted)
}

// Ranks that join one collective with different lengths all fail.
func TestLengthMismatch(t *testing.T) {
	g, err := NewGroup(2)
	require.NoError(t, err)
	err = g.Run(func(r int) error { return g.Rank(r).AllReduceSum(make([]float32, 2+r)) })
	require.ErrorContains(t, err, "programs differ")
	err = g.Run(func(r int) error { return g.Rank(r).AllGather(make([]float32, 3), make([]float32, 2)) })
	require.ErrorContains(t, err, "all-gather into 3 values from 2 per rank over 2 ranks")
}

func TestNewGroupRefuses(t *testing.T) {
	_, err := NewGroup(0)
	require.ErrorContains(t, err, "1 to 1024 ranks")
}

// Stats.Sub is the counters of an interval.
func TestStatsSub(t *testing.T) {
	a := Stats{AllReduces: 5, AllGathers: 2, Bytes: 100, Time: 7}
	b := Stats{AllReduces: 2, AllGathers: 1, Bytes: 40, Time: 3}
	require.Equal(t, Stats{AllReduces: 3, AllGathers: 1, Bytes: 60, Time: 4}, a.Sub(b))
}
