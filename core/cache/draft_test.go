package cache

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The draft store holds context rows only: Advance counts positions every
// layer appended, Truncate cuts a checkpointed slot back to any length from
// its checkpoint (every layer's rows past it dropped), Copy forks a slot,
// and what a failed run appended is rewound.
func TestDraftStoreTruncateAndCopy(t *testing.T) {
	_, err := NewDraftStore(0, 4, 2)
	require.ErrorContains(t, err, "at least one draft layer")
	s, err := NewDraftStore(2, 2, 2)
	require.NoError(t, err)
	a, err := s.Alloc()
	require.NoError(t, err)
	q, err := s.Seq(a)
	require.NoError(t, err)
	for l := 0; l < 2; l++ {
		q.Append(l, []float32{1, 2, 3, 4, 5, 6}, []float32{-1, -2, -3, -4, -5, -6})
	}
	require.NoError(t, s.Advance(a, 3))
	q.Append(0, []float32{7, 8}, []float32{-7, -8})
	require.ErrorContains(t, s.Advance(a, 1), "layer 1 holds 3 K and 3 V rows, want 4")
	s.Rewind(a)
	require.Len(t, q.K[0], 6)

	require.ErrorContains(t, s.Truncate(a, 1), "no open checkpoint")
	require.NoError(t, s.Checkpoint(a))
	for l := 0; l < 2; l++ {
		q.Append(l, []float32{7, 8}, []float32{-7, -8})
	}
	require.NoError(t, s.Advance(a, 1))
	require.ErrorContains(t, s.Truncate(a, 2), "[3, 4] positions, not 2")
	b, err := s.Alloc()
	require.NoError(t, err)
	require.ErrorContains(t, s.Copy(a, b), "open checkpoint")
	require.NoError(t, s.Truncate(a, 3))
	n, _ := s.Len(a)
	require.Equal(t, 3, n)
	require.Equal(t, []float32{1, 2, 3, 4, 5, 6}, q.K[1])
	require.NoError(t, s.Copy(a, b))
	st, err := s.ReadDraft(b)
	require.NoError(t, err)
	require.Equal(t, 3, st.Len)
	require.Equal(t, []float32{-1, -2, -3, -4, -5, -6}, st.V[0])
	require.ErrorContains(t, s.Copy(a, a), "onto itself")
	_, err = s.Alloc()
	require.ErrorContains(t, err, "all 2 draft slots are in use")
	require.NoError(t, s.Free(b))
	require.Equal(t, 1, s.InUse())
	c, err := s.Alloc()
	require.NoError(t, err)
	n, _ = s.Len(c)
	require.Equal(t, 0, n, "a reallocated slot is empty")
}
