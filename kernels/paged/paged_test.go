package paged

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// pagedOf splits data (rows of w) into pages of pr rows, the last one
// padded to a whole page.
func pagedOf(w, pr int, data []float32) Rows {
	r := Rows{Width: w, PageRows: pr, Len: len(data) / w}
	for o := 0; o < len(data); o += pr * w {
		pg := make([]float32, pr*w)
		copy(pg, data[o:])
		r.Pages = append(r.Pages, pg)
	}
	return r
}

// Rows read, span, gather and write across page boundaries as one
// contiguous matrix would.
func TestRowsAcrossPages(t *testing.T) {
	const w = 3
	data := make([]float32, 11*w)
	for i := range data {
		data[i] = float32(i)
	}
	for _, pr := range []int{1, 2, 4, 5, 11, 16} {
		r := pagedOf(w, pr, data)
		flat := Flat(w, data)
		require.Equal(t, 11, r.Len)
		for i := 0; i < 11; i++ {
			require.Equal(t, flat.Row(i), r.Row(i), "pages of %d, row %d", pr, i)
			for j := i + 1; j <= 11; j++ {
				s := r.Span(i, j)
				require.Equal(t, r.SpanRows(i, j)*w, len(s))
				require.Equal(t, data[i*w:i*w+len(s)], s, "span [%d, %d)", i, j)
				require.LessOrEqual(t, i%pr+len(s)/w, pr, "a span stays in its page")
				require.Equal(t, data[i*w:j*w], r.Gather(nil, i, j), "gather [%d, %d) pages of %d", i, j, pr)
			}
		}
		require.Equal(t, data, r.Flatten())
		require.Equal(t, data, r.Clone().Pages[0])
		// writes land where the reads find them (across a page end)
		src := []float32{-1, -2, -3, -4, -5, -6, -7, -8, -9}
		i0 := min(pr-1, 8)
		require.NoError(t, r.Write(i0, src))
		for k := 0; k < 3; k++ {
			require.Equal(t, src[k*w:(k+1)*w], r.Row(i0+k), "pages of %d, row %d", pr, i0+k)
		}
		require.ErrorContains(t, r.Write(r.Cap(), src[:w]), "pass the")
		_, err := r.Slot(r.Cap())
		require.Error(t, err)
	}
	// unpaged rows grow as they are written
	var u Rows
	u.Width = w
	require.NoError(t, u.Write(2, data[:2*w]))
	require.Equal(t, data[:w], u.Row(2))
	require.Equal(t, data[w:2*w], u.Row(3))
	row, err := u.Slot(9)
	require.NoError(t, err)
	require.Len(t, row, w)
	require.GreaterOrEqual(t, u.Cap(), 10)
	require.ErrorContains(t, u.Write(0, data[:w+1]), "as rows of 3")
}
