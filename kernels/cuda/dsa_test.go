package cuda_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	kc "github.com/glmflash/glmflash/kernels/cuda"
	"github.com/glmflash/glmflash/kernels/indexer"
	"github.com/stretchr/testify/require"
)

// idxCase is a batch for the indexer kernels: per sequence the positions
// cached before the step and the step's new rows.
type idxCase struct {
	H, D, kpool, topk int
	tail              bool
	pos0, news        []int
	odd               bool // row 0: zero head weights (every score 0, all tied); row 1: a NaN head weight (NaN scores)
}

// stepMeta builds the batch metadata of one step (sequence s in slot S−1−s).
func stepMeta(t *testing.T, d *kc.Device, pos0, news []int) (kc.BatchMeta, []int32) {
	S := len(pos0)
	var seqSlot, seqPos0, seqN, seqRow0, rowSeq, rowPos, lastRow []int32
	row := 0
	for s := 0; s < S; s++ {
		seqSlot = append(seqSlot, int32(S-1-s))
		seqPos0 = append(seqPos0, int32(pos0[s]))
		seqN = append(seqN, int32(news[s]))
		seqRow0 = append(seqRow0, int32(row))
		lastRow = append(lastRow, int32(row+news[s]-1))
		for j := 0; j < news[s]; j++ {
			rowSeq = append(rowSeq, int32(s))
			rowPos = append(rowPos, int32(pos0[s]+j))
		}
		row += news[s]
	}
	return kc.BatchMeta{SeqSlot: upload(t, d, seqSlot).p, SeqPos0: upload(t, d, seqPos0).p, SeqN: upload(t, d, seqN).p,
		SeqRow0: upload(t, d, seqRow0).p, RowSeq: upload(t, d, rowSeq).p, RowPos: upload(t, d, rowPos).p,
		LastRow: upload(t, d, lastRow).p, S: int64(S), T: int64(row)}, rowPos
}

// The indexer kernels (append, score, select, save, shared) match the
// CPU's indexer (kernels/indexer) exactly: rows that see fewer pools than
// they keep (no scoring), more (scored and selected), none, contexts past
// pool boundaries, with and without the tail, tied and NaN scores, more
// heads than a warp's lanes, a scores scratch wider than the visible pools
// (as under graphs); then a shared selection for the next step's rows.
// Each case runs with the pooled keys contiguous per slot and in pages of
// 1, 2 or 3 pools (shuffled page ids: the append pools and the scores read
// through the page table).
func TestIndexerKernelsMatchCPU(t *testing.T) {
	d := openDevice(t)
	cases := []idxCase{
		{H: 4, D: 40, kpool: 4, topk: 16, tail: true, pos0: []int{0, 15, 60}, news: []int{3, 1, 1}},
		{H: 4, D: 40, kpool: 4, topk: 16, tail: false, pos0: []int{16, 2, 37}, news: []int{1, 5, 9}},
		{H: 3, D: 288, kpool: 3, topk: 9, tail: true, pos0: []int{40, 8}, news: []int{2, 1}},
		{H: 37, D: 24, kpool: 2, topk: 10, tail: true, pos0: []int{45}, news: []int{3}},
		{H: 5, D: 64, kpool: 4, topk: 2048, tail: true, pos0: []int{39}, news: []int{1}},
		{H: 2, D: 32, kpool: 4, topk: 8, tail: true, pos0: []int{300}, news: []int{1}},
		// hundreds of pools (several per thread of the selection), ties, NaN scores
		{H: 4, D: 40, kpool: 4, topk: 256, tail: true, pos0: []int{1200, 900, 2000}, news: []int{1, 2, 1}, odd: true},
	}
	for ci, c := range cases {
		for _, pp := range []int{0, 1 + ci%3} {
			t.Run(fmt.Sprintf("case%d/pools_per_page=%d", ci, pp), func(t *testing.T) {
				r := rand.New(rand.NewPCG(uint64(ci), 11))
				H, D, kp := c.H, c.D, c.kpool
				S := len(c.pos0)
				ape := randn(r, kp*D, 0.5)
				cfg := &indexer.Config{Heads: H, Dim: D, KPool: kp, TopK: c.topk, SelectTail: c.tail, APE: ape}
				W := cfg.Width()
				extra := 3
				maxPos := 0
				for s := range c.pos0 {
					maxPos = max(maxPos, c.pos0[s]+c.news[s]+extra+1)
				}
				maxPools := maxPos/kp + 1
				poolsStride, pendStride := maxPools*D, kp*D
				pools := upload(t, d, make([]float32, S*poolsStride))
				var tab pageTable
				if pp > 0 { // pages of pp pools, ids shuffled over the slots
					stride := (maxPools + pp - 1) / pp
					pools = upload(t, d, make([]float32, S*stride*pp*D))
					ids := r.Perm(S * stride)
					pt := make([]int32, len(ids))
					for i, id := range ids {
						pt[i] = int32(id)
					}
					tab = pageTable{Pt: upload(t, d, pt).p, Stride: int64(stride), Page: int64(pp)}
				}
				pendK, pendG := upload(t, d, make([]float32, S*pendStride)), upload(t, d, make([]float32, S*pendStride))
				apeb := upload(t, d, ape)
				states := make([]*indexer.State, S)
				for s := range states {
					states[s] = &indexer.State{}
				}
				// appendStep appends rows for the sequences (CPU and GPU)
				appendStep := func(pos0, news []int) (kc.BatchMeta, []int32, int) {
					meta, rowPos := stepMeta(t, d, pos0, news)
					T := len(rowPos)
					k, g := randn(r, T*D, 1), randn(r, T*D, 1)
					row := 0
					for s := 0; s < S; s++ {
						if news[s] > 0 {
							cfg.Append(states[s], pos0[s], k[row*D:(row+news[s])*D], g[row*D:(row+news[s])*D], news[s], nil)
						}
						row += news[s]
					}
					if T > 0 {
						ap := kc.IdxAppendArgs{M: meta, K: upload(t, d, k).p, Gate: upload(t, d, g).p, Ape: apeb.p, Pools: pools.p, PoolsStride: int64(poolsStride),
							PendK: pendK.p, PendG: pendG.p, PendStride: int64(pendStride), D: int64(D), Kpool: int64(kp), Pt: tab.Pt, PtStride: tab.Stride, Page: tab.Page}
						launch(t, d, kc.KernelIndexerAppend, kc.Dim3{X: uint32(S)}, kc.Dim3{X: uint32((D + 31) / 32 * 32)}, 0, &ap)
					}
					return meta, rowPos, T
				}
				// the history (a step of pos0 rows per sequence), then the scored step
				zeros := make([]int, S)
				hist := append([]int(nil), c.pos0...)
				appendStep(zeros, hist)
				meta, rowPos, T := appendStep(c.pos0, c.news)
				visible := make([]int32, T)
				mv := 0
				for i, p := range rowPos {
					visible[i] = (p + 1) / int32(kp)
					mv = max(mv, int(visible[i]))
				}
				visb := upload(t, d, visible)
				q, w := randn(r, T*H*D, 1), randn(r, T*H, 1)
				if c.odd {
					for h := 0; h < H; h++ {
						w[h] = 0
					}
					w[H] = float32(math.NaN())
				}
				ld := mv + 5
				scores := poisoned[float32](t, d, T*ld)
				scale := float64(float32(1 / math.Sqrt(float64(D))))
				wscale := float32(1 / math.Sqrt(float64(H)))
				sa := kc.IdxScoreArgs{M: meta, Visible: visb.p, Q: upload(t, d, q).p, W: upload(t, d, w).p, Pools: pools.p, PoolsStride: int64(poolsStride),
					Scores: scores.p, Ld: int64(ld), H: int64(H), D: int64(D), Keep: int64(c.topk / kp), Scale: scale, Wscale: float64(wscale), Pt: tab.Pt, PtStride: tab.Stride, Page: tab.Page}
				launch(t, d, kc.KernelIndexerScore, kc.Dim3{X: uint32((ld + 31) / 32), Y: uint32(T)}, kc.Dim3{X: 256}, 4*(H*(D+1)+32*D), &sa)
				sel := poisoned[int32](t, d, T*W)
				se := kc.IdxSelectArgs{M: meta, Visible: visb.p, Scores: scores.p, Ld: int64(ld), Sel: sel.p, Width: int64(W),
					Kpool: int64(kp), Keep: int64(c.topk / kp), Tail: map[bool]int64{false: 0, true: 1}[c.tail]}
				launch(t, d, kc.KernelIndexerSelect, kc.Dim3{X: uint32(T)}, kc.Dim3{X: 256}, 0, &se)
				got := download[int32](t, sel)
				want := make([]int32, T*W)
				row := 0
				for s := 0; s < S; s++ {
					n := c.news[s]
					vis := make([]int, n)
					for j := range vis {
						vis[j] = (c.pos0[s] + j + 1) / kp
					}
					ws := make([]float32, n*H)
					for i := range ws {
						ws[i] = w[row*H+i] * wscale
					}
					cfg.Select(want[row*W:(row+n)*W], states[s], c.pos0[s], q[row*H*D:(row+n)*H*D], ws, n, vis)
					states[s].SaveShare(want[(row+n-1)*W:(row+n)*W], c.pos0[s]+n-1)
					row += n
				}
				for tr := 0; tr < T; tr++ {
					require.Equal(t, want[tr*W:(tr+1)*W], got[tr*W:(tr+1)*W], "row %d (position %d, %d pools visible)", tr, rowPos[tr], visible[tr])
				}
				// save the last rows' selections, then a step of shared rows
				savedStride := W + 2
				saved := poisoned[int32](t, d, S*savedStride)
				sv := kc.IdxSaveArgs{M: meta, Sel: sel.p, Width: int64(W), Saved: saved.p, SavedStride: int64(savedStride)}
				launch(t, d, kc.KernelIndexerSave, kc.Dim3{X: uint32(S)}, kc.Dim3{X: 256}, 0, &sv)
				sharePos := make([]int32, S)
				pos1, news1 := make([]int, S), make([]int, S)
				for s := range sharePos {
					sharePos[s] = int32(c.pos0[s] + c.news[s] - 1)
					pos1[s] = c.pos0[s] + c.news[s]
					news1[s] = 1 + s%2
				}
				meta1, rowPos1 := stepMeta(t, d, pos1, news1)
				T1 := len(rowPos1)
				W1 := W + extra
				sel1 := poisoned[int32](t, d, T1*W1)
				sh := kc.IdxSharedArgs{M: meta1, Saved: saved.p, SavedStride: int64(savedStride), SavedWidth: int64(W),
					SharePos: upload(t, d, sharePos).p, Sel: sel1.p, Width: int64(W1)}
				launch(t, d, kc.KernelIndexerShared, kc.Dim3{X: uint32(T1)}, kc.Dim3{X: 256}, 0, &sh)
				got1 := download[int32](t, sel1)
				want1 := make([]int32, T1*W1)
				row = 0
				for s := 0; s < S; s++ {
					require.NoError(t, indexer.SelectShared(want1[row*W1:(row+news1[s])*W1], W1, states[s], pos1[s], news1[s]))
					row += news1[s]
				}
				require.Equal(t, want1, got1)
			})
		}
	}
}
