package mla

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/glmflash/glmflash/kernels/paged"
	"github.com/stretchr/testify/require"
)

// inPages copies ckv (rows of R) into pages of pr rows.
func inPages(R, pr int, ckv []float32) *paged.Rows {
	r := &paged.Rows{Width: R, PageRows: pr, Len: len(ckv) / R}
	for o := 0; o < len(ckv); o += pr * R {
		pg := make([]float32, pr*R)
		copy(pg, ckv[o:])
		r.Pages = append(r.Pages, pg)
	}
	return r
}

// Latents in pages (odd sizes, one row per page, runs crossing page ends)
// give both paths the results of contiguous latents bit for bit.
func TestAttendPagedMatchesFlat(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	H, dq, dv, R, L, width := 4, 16, 12, 24, 41, 19
	c := &Config{Heads: H, QKDim: dq, VDim: dv, Rank: R, Scale: float32(1 / math.Sqrt(float64(dq))), KVBW: randVec(r, H*(dq+dv)*R)}
	ckv := randVec(r, L*R)
	for _, p := range []Path{PathExpand, PathAbsorb} {
		for _, T := range []int{1, 3, 7} {
			q := randVec(r, T*H*dq)
			sel := sparseSel(r, T, width, L-T)
			c.Path = p
			want := make([]float32, T*H*dv)
			c.AttendWith(new(Workspace), want, q, ckv, sel, T, width)
			for _, pr := range []int{1, 3, 4, 8, 64} {
				got := make([]float32, T*H*dv)
				c.AttendPaged(new(Workspace), got, q, inPages(R, pr, ckv), sel, T, width)
				require.Equal(t, want, got, fmt.Sprintf("%s, T %d, pages of %d", p, T, pr))
			}
		}
	}
	c.Path = PathAuto
}
