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

// fp8Pages writes ckv (rows of R) into fp8 pages of pr rows (quantized as
// the store's writes are) and returns them with their values read back.
func fp8Pages(t *testing.T, R, pr int, ckv []float32) (*paged.Rows, []float32) {
	t.Helper()
	L := len(ckv) / R
	r := &paged.Rows{Width: R, PageRows: pr, FP8: true}
	nb := paged.FP8Blocks(R)
	for n := 0; n < L; n += pr {
		r.Codes = append(r.Codes, make([]byte, pr*R))
		r.Scales = append(r.Scales, make([]float32, pr*nb))
	}
	require.NoError(t, r.Write(0, ckv))
	r.Len = L
	return r, r.Flatten()
}

// FP8 latents (kv dtype fp8) give both paths, on any page size, the
// results of fp32 latents holding their dequantized values bit for bit
// (dequantizing is the only change), and stay within 15% (relative RMS) of
// the results of the unquantized latents: fp8 is lossy, about 2.5% RMS per
// latent, which these random logits (unit latents, unit weights, few
// positions and no dominant one) carry into the softmax and the output.
func TestAttendFP8(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	H, dq, dv, R, L, width := 4, 16, 12, 160, 41, 19 // R: a full block of 128 and a short one
	c := &Config{Heads: H, QKDim: dq, VDim: dv, Rank: R, Scale: float32(1 / math.Sqrt(float64(dq))), KVBW: randVec(r, H*(dq+dv)*R)}
	ckv := randVec(r, L*R)
	worst := 0.0
	defer func() { t.Logf("worst relative RMS error against unquantized latents: %.4f", worst) }()
	for _, p := range []Path{PathExpand, PathAbsorb} {
		for _, T := range []int{1, 3, 7} {
			q := randVec(r, T*H*dq)
			sel := sparseSel(r, T, width, L-T)
			c.Path = p
			exact := make([]float32, T*H*dv)
			c.AttendWith(new(Workspace), exact, q, ckv, sel, T, width)
			for _, pr := range []int{1, 4, 64} {
				lat, deq := fp8Pages(t, R, pr, ckv)
				want, got := make([]float32, T*H*dv), make([]float32, T*H*dv)
				c.AttendWith(new(Workspace), want, q, deq, sel, T, width)
				c.AttendPaged(new(Workspace), got, q, lat, sel, T, width)
				what := fmt.Sprintf("%s, T %d, fp8 pages of %d", p, T, pr)
				require.Equal(t, want, got, what)
				var se, sx float64
				for i, x := range exact {
					se += float64((x - got[i]) * (x - got[i]))
					sx += float64(x * x)
				}
				worst = max(worst, math.Sqrt(se/sx))
				require.Less(t, math.Sqrt(se/sx), 0.15, what)
			}
		}
	}
	c.Path = PathAuto
}
