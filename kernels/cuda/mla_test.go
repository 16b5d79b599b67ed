package cuda_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	kc "github.com/glmflash/glmflash/kernels/cuda"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/kernels/mla"
	"github.com/stretchr/testify/require"
)

// mlaCase is a batch of sequences for the absorbed-MLA kernels: each
// sequence's latent cache (in its slot) and its rows' selections.
type mlaCase struct {
	H, dq, dv, R, width int
	lens, news          []int // cached positions (including the new rows) and new rows per sequence
}

// pageTable is a paged cache's page table for the kernels (Pt 0: the cache
// is contiguous per slot) and its latents' dtype (BF16 1: bf16).
type pageTable struct {
	Pt           kc.DevicePtr
	Stride, Page int64
	BF16         int64
}

// inPages lays a contiguous cache of slots × slotRows rows of w floats out
// in pages of page rows, the pages of all slots interleaved and shuffled
// (page ids in no slot order), and returns the paged buffer's contents
// and the page table ([slots][stride] ids).
func inPages(r *rand.Rand, cache []float32, slots, slotRows, w, page int) ([]float32, []int32, int) {
	stride := (slotRows + page - 1) / page
	ids := r.Perm(slots * stride)
	pt := make([]int32, slots*stride)
	paged := make([]float32, slots*stride*page*w)
	for i := range paged {
		paged[i] = float32(math.NaN()) // rows no slot holds must not be read
	}
	for sl := 0; sl < slots; sl++ {
		for pg := 0; pg < stride; pg++ {
			id := ids[sl*stride+pg]
			pt[sl*stride+pg] = int32(id)
			for o := 0; o < page && pg*page+o < slotRows; o++ {
				src := (sl*slotRows + pg*page + o) * w
				copy(paged[(id*page+o)*w:(id*page+o+1)*w], cache[src:src+w])
			}
		}
	}
	return paged, pt, stride
}

// runMLAKernels runs qabs, logits, softmax, accum and expand as the backend
// does (the small or the big tiles, or the decode kernels) and returns o
// [T][H·dv]; pg, when set, reads the latents through its page table.
func runMLAKernels(t *testing.T, d *kc.Device, c mlaCase, small, decode bool, meta kc.BatchMeta, q, w, sel, cache buf, wbf16 int64, slotStride, T int, pg ...pageTable) []float32 {
	var pt pageTable
	if len(pg) > 0 {
		pt = pg[0]
	}
	H, dq, dv, R, width := c.H, c.dq, c.dv, c.R, c.width
	tm, tn, th := 64, 64, uint32(256)
	if small {
		tm, tn, th = 16, 32, 128
	}
	cdiv := func(x, y int) uint32 { return uint32((x + y - 1) / y) }
	qa := poisoned[float32](t, d, T*H*R)
	ol := poisoned[float32](t, d, T*H*R)
	o := poisoned[float32](t, d, T*H*dv)
	stride := int64((dq + dv) * R)
	if decode { // the decode kernels, as the backend runs them below 16 rows
		qab := kc.MLAGemvArgs{A: q.p, Lda: int64(H * dq), AHead: int64(dq), AParts: 1, W: w.p, WBf16: wbf16, WHead: stride, WLd: int64(R),
			C: qa.p, Ldc: int64(H * R), CHead: 1, CN: int64(H), M: int64(T), N: int64(R), K: int64(dq)}
		launch(t, d, kc.KernelMLAQabsGv, kc.Dim3{X: cdiv(R, 32), Y: uint32(H)}, kc.Dim3{X: 256}, 0, &qab)
		lg := poisoned[float32](t, d, T*H*width)
		lo := kc.MLALogitsDArgs{M: meta, Qt: qa.p, Sel: sel.p, Width: int64(width), Cache: cache.p, SlotStride: int64(slotStride),
			Lg: lg.p, H: int64(H), R: int64(R), Pt: pt.Pt, PtStride: pt.Stride, Page: pt.Page, CacheBf16: pt.BF16}
		launch(t, d, kc.KernelMLALogitsD, kc.Dim3{X: cdiv(width, 12), Y: uint32(T)}, kc.Dim3{X: 256}, 4*(12*R+64*H), &lo)
		sm := kc.MLASoftmaxArgs{Sel: sel.p, Width: int64(width), Lg: lg.p, H: int64(H), Scale: float64(float32(1 / math.Sqrt(float64(dq))))}
		launch(t, d, kc.KernelMLASoftmax, kc.Dim3{X: uint32(H), Y: uint32(T)}, kc.Dim3{X: 256}, 0, &sm)
		nch := (width + 255) / 256
		part, live := poisoned[float32](t, d, T*nch*H*R), poisoned[int32](t, d, T*nch)
		ac := kc.MLAAccumDArgs{M: meta, Lg: lg.p, Sel: sel.p, Width: int64(width), Cache: cache.p, SlotStride: int64(slotStride),
			Part: part.p, Live: live.p, H: int64(H), R: int64(R), Pt: pt.Pt, PtStride: pt.Stride, Page: pt.Page, CacheBf16: pt.BF16}
		launch(t, d, kc.KernelMLAAccumD, kc.Dim3{X: cdiv(R, 32), Y: uint32(nch), Z: uint32(T) * cdiv(H, 8)}, kc.Dim3{X: 256}, 0, &ac)
		ex := kc.MLAGemvArgs{A: part.p, Lda: int64(nch * H * R), AHead: int64(R), AParts: int64(nch), APartStride: int64(H * R), ALive: live.p, W: w.p, WBf16: wbf16, WHead: stride, WOff: int64(dq * R), WLd: int64(R),
			C: o.p, Ldc: int64(H * dv), CHead: int64(dv), CN: 1, M: int64(T), N: int64(dv), K: int64(R)}
		launch(t, d, kc.KernelMLAExpandGv, kc.Dim3{X: cdiv(dv, 32), Y: uint32(H)}, kc.Dim3{X: 256}, 0, &ex)
		return download[float32](t, o)
	}
	qab := kc.MLAHeadMMArgs{A: q.p, Lda: int64(H * dq), AHead: int64(dq), W: w.p, WBf16: wbf16, WHead: stride, WLd: int64(R),
		C: qa.p, Ldc: int64(H * R), CHead: int64(R), M: int64(T), N: int64(R), K: int64(dq)}
	launch(t, d, kc.MLAQabsKernel(small), kc.Dim3{X: cdiv(R, tn), Y: cdiv(T, tm), Z: uint32(H)}, kc.Dim3{X: th}, 0, &qab)
	tc := 3 // row chunks of 3: the chunking must not matter
	lg := poisoned[float32](t, d, tc*H*width)
	for t0 := 0; t0 < T; t0 += tc {
		nr := min(tc, T-t0)
		lo := kc.MLALogitsArgs{M: meta, Qa: qa.p, Sel: sel.p, Width: int64(width), Cache: cache.p, SlotStride: int64(slotStride),
			Lg: lg.p, T0: int64(t0), H: int64(H), R: int64(R), Pt: pt.Pt, PtStride: pt.Stride, Page: pt.Page, CacheBf16: pt.BF16}
		launch(t, d, kc.MLALogitsKernel(small), kc.Dim3{X: cdiv(width, tn), Y: cdiv(H, tm), Z: uint32(nr)}, kc.Dim3{X: th}, 0, &lo)
		sm := kc.MLASoftmaxArgs{Sel: sel.p, Width: int64(width), Lg: lg.p, T0: int64(t0), H: int64(H), Scale: float64(float32(1 / math.Sqrt(float64(dq))))}
		launch(t, d, kc.KernelMLASoftmax, kc.Dim3{X: uint32(H), Y: uint32(nr)}, kc.Dim3{X: 256}, 0, &sm)
		ac := kc.MLAAccumArgs{M: meta, Lg: lg.p, Sel: sel.p, Width: int64(width), Cache: cache.p, SlotStride: int64(slotStride),
			Ol: ol.p, T0: int64(t0), H: int64(H), R: int64(R), Pt: pt.Pt, PtStride: pt.Stride, Page: pt.Page, CacheBf16: pt.BF16}
		launch(t, d, kc.MLAAccumKernel(small), kc.Dim3{X: cdiv(R, tn), Y: cdiv(H, tm), Z: uint32(nr)}, kc.Dim3{X: th}, 0, &ac)
	}
	ex := kc.MLAHeadMMArgs{A: ol.p, Lda: int64(H * R), AHead: int64(R), W: w.p, WBf16: wbf16, WHead: stride, WOff: int64(dq * R), WLd: int64(R),
		C: o.p, Ldc: int64(H * dv), CHead: int64(dv), M: int64(T), N: int64(dv), K: int64(R)}
	launch(t, d, kc.MLAExpandKernel(small), kc.Dim3{X: cdiv(dv, tn), Y: cdiv(T, tm), Z: uint32(H)}, kc.Dim3{X: th}, 0, &ex)
	return download[float32](t, o)
}

// bf16RNE rounds x to the nearest bfloat16, ties to even (bf16_round);
// NaN stays NaN.
func bf16RNE(x float32) float32 {
	u := math.Float32bits(x)
	if u&0x7f800000 == 0x7f800000 && u&0x007fffff != 0 {
		return x
	}
	u += 0x7fff + (u>>16)&1
	return math.Float32frombits(u & 0xffff0000)
}

// The absorbed-MLA kernels match the CPU's absorbed path (kernels/mla) with
// fp32 and bf16 weights, at 1, 5 and 70 rows whose selections hold sparse
// positions, −1 padding inside and at the end, and empty rows; the small
// and big tiles, and (up to 16 rows) the decode kernels, give the same
// bits.
func TestMLAKernelsMatchCPU(t *testing.T) {
	d := openDevice(t)
	cases := []mlaCase{
		{H: 5, dq: 24, dv: 20, R: 40, width: 80, lens: []int{37}, news: []int{1}},
		{H: 5, dq: 24, dv: 20, R: 40, width: 80, lens: []int{9, 130}, news: []int{2, 3}},
		{H: 4, dq: 32, dv: 16, R: 68, width: 100, lens: []int{30, 140, 20}, news: []int{30, 25, 15}},
		{H: 17, dq: 16, dv: 8, R: 36, width: 70, lens: []int{75}, news: []int{70}},
		// decode shapes: 1, 3 and 16 rows, a full-size latent (R = 512,
		// vector loads), odd sizes (scalar loads), a selection wider than
		// the context
		{H: 6, dq: 64, dv: 40, R: 512, width: 300, lens: []int{260}, news: []int{1}},
		{H: 3, dq: 24, dv: 20, R: 40, width: 160, lens: []int{5, 150, 1}, news: []int{1, 1, 1}},
		{H: 7, dq: 20, dv: 12, R: 38, width: 90, lens: []int{60, 33}, news: []int{9, 7}},
		{H: 5, dq: 136, dv: 24, R: 40, width: 64, lens: []int{17}, news: []int{17}},
		// selections past one accumulation chunk (256 entries), 8+ heads
		{H: 9, dq: 16, dv: 12, R: 36, width: 600, lens: []int{590, 300}, news: []int{2, 1}},
		{H: 8, dq: 32, dv: 16, R: 64, width: 530, lens: []int{700}, news: []int{20}},
		// rows × rank past the decode GEMV's whole-A buffer (A a chunk at a
		// time), chunks of rows past their selection
		{H: 3, dq: 24, dv: 20, R: 256, width: 600, lens: []int{560, 40, 300, 7, 590, 270, 1, 100, 520}, news: []int{1, 1, 1, 1, 1, 1, 1, 1, 1}},
		// more than 16 accumulation chunks (the expand's parts in two groups)
		{H: 2, dq: 16, dv: 8, R: 36, width: 4400, lens: []int{4390, 100}, news: []int{1, 1}},
	}
	for ci, c := range cases {
		for _, bf := range []bool{false, true} {
			t.Run(fmt.Sprintf("case%d/bf16=%v", ci, bf), func(t *testing.T) {
				r := rand.New(rand.NewPCG(uint64(ci), 7))
				H, dq, dv, R, width := c.H, c.dq, c.dv, c.R, c.width
				S := len(c.lens)
				T := 0
				for _, n := range c.news {
					T += n
				}
				maxLen := 0
				for _, l := range c.lens {
					maxLen = max(maxLen, l)
				}
				slotStride := (maxLen + 3) * R
				slots := make([]int32, S)
				for s := range slots {
					slots[s] = int32(S - 1 - s) // slots in another order than the sequences
				}
				cache := randn(r, S*slotStride, 1)
				wf := randn(r, H*(dq+dv)*R, 0.2)
				var wbuf buf
				wbf16 := int64(0)
				if bf {
					var wb []uint16
					wb, wf = toBF16(wf)
					wbuf, wbf16 = upload(t, d, wb), 1
				} else {
					wbuf = upload(t, d, wf)
				}
				q := randn(r, T*H*dq, 1)
				sel := make([]int32, T*width)
				var seqSlot, seqPos0, seqN, seqRow0, rowSeq, rowPos, lastRow []int32
				want := make([]float32, T*H*dv)
				row := 0
				for s := 0; s < S; s++ {
					L, n := c.lens[s], c.news[s]
					seqSlot = append(seqSlot, slots[s])
					seqPos0 = append(seqPos0, int32(L-n))
					seqN = append(seqN, int32(n))
					seqRow0 = append(seqRow0, int32(row))
					lastRow = append(lastRow, int32(row+n-1))
					for j := 0; j < n; j++ {
						tr := row + j
						pos := L - n + j
						rowSeq = append(rowSeq, int32(s))
						rowPos = append(rowPos, int32(pos))
						srow := sel[tr*width : (tr+1)*width]
						for i := range srow {
							srow[i] = -1
						}
						if (tr+ci)%11 == 4 {
							continue // an empty selection
						}
						o := 0
						for p := 0; p <= pos && o < width; p++ {
							switch {
							case p < pos-40 && r.IntN(3) != 0: // sparse far context
							case r.IntN(9) == 0 && o < width-1:
								o++ // −1 padding inside the row
								srow[o] = int32(p)
								o++
							default:
								srow[o] = int32(p)
								o++
							}
						}
					}
					// the CPU reference for this sequence
					ckv := cache[int(slots[s])*slotStride : int(slots[s])*slotStride+L*R]
					cfg := &mla.Config{Heads: H, QKDim: dq, VDim: dv, Rank: R, Scale: float32(1 / math.Sqrt(float64(dq))), KVBW: wf, Params: gemm.Default()}
					cfg.AttendAbsorbed(want[row*H*dv:(row+n)*H*dv], q[row*H*dq:(row+n)*H*dq], ckv, sel[row*width:(row+n)*width], n, width)
					row += n
				}
				meta := kc.BatchMeta{SeqSlot: upload(t, d, seqSlot).p, SeqPos0: upload(t, d, seqPos0).p, SeqN: upload(t, d, seqN).p,
					SeqRow0: upload(t, d, seqRow0).p, RowSeq: upload(t, d, rowSeq).p, RowPos: upload(t, d, rowPos).p,
					LastRow: upload(t, d, lastRow).p, S: int64(S), T: int64(T)}
				qb, selb, cb := upload(t, d, q), upload(t, d, sel), upload(t, d, cache)
				big := runMLAKernels(t, d, c, false, false, meta, qb, wbuf, selb, cb, wbf16, slotStride, T)
				smallOut := runMLAKernels(t, d, c, true, false, meta, qb, wbuf, selb, cb, wbf16, slotStride, T)
				require.Less(t, maxRelErr(t, big, want), 2e-6)
				for i := range big {
					require.Equal(t, math.Float32bits(big[i]), math.Float32bits(smallOut[i]), "element %d: big and small tiles differ", i)
				}
				if T <= 16 {
					dec := runMLAKernels(t, d, c, false, true, meta, qb, wbuf, selb, cb, wbf16, slotStride, T)
					for i := range big {
						require.Equal(t, math.Float32bits(big[i]), math.Float32bits(dec[i]), "element %d: big tiles and decode kernels differ", i)
					}
				}
				if !bf { // the latents in pages (3, 4 or 8 rows, shuffled ids): the same bits on every kernel path
					page := []int{4, 8, 3}[ci%3]
					paged, pt, ptStride := inPages(r, cache, S, slotStride/R, R, page)
					pb, ptb := upload(t, d, paged), upload(t, d, pt)
					tab := pageTable{Pt: ptb.p, Stride: int64(ptStride), Page: int64(page)}
					for _, v := range []struct{ small, decode bool }{{false, false}, {true, false}, {false, true}} {
						if v.decode && T > 16 {
							continue
						}
						got := runMLAKernels(t, d, c, v.small, v.decode, meta, qb, wbuf, selb, pb, wbf16, slotStride, T, tab)
						for i := range big {
							require.Equal(t, math.Float32bits(big[i]), math.Float32bits(got[i]), "element %d: pages of %d (small %v, decode %v) differ from contiguous latents", i, page, v.small, v.decode)
						}
					}
					// bf16 latents (the same pages): the CPU's attention over the
					// rounded latents, and within bf16's rounding of the fp32 one
					cr := make([]float32, len(cache))
					for i, v := range cache {
						cr[i] = bf16RNE(v)
					}
					wantR := make([]float32, T*H*dv)
					row := 0
					for s := 0; s < S; s++ {
						L, n := c.lens[s], c.news[s]
						cfg := &mla.Config{Heads: H, QKDim: dq, VDim: dv, Rank: R, Scale: float32(1 / math.Sqrt(float64(dq))), KVBW: wf, Params: gemm.Default()}
						cfg.AttendAbsorbed(wantR[row*H*dv:(row+n)*H*dv], q[row*H*dq:(row+n)*H*dq], cr[int(slots[s])*slotStride:int(slots[s])*slotStride+L*R], sel[row*width:(row+n)*width], n, width)
						row += n
					}
					bits := make([]uint16, len(paged))
					for i, v := range paged { // the same page ids as tab's
						bits[i] = uint16(math.Float32bits(bf16RNE(v)) >> 16)
					}
					tab.BF16 = 1
					for _, v := range []struct{ small, decode bool }{{false, false}, {false, true}} {
						if v.decode && T > 16 {
							continue
						}
						got := runMLAKernels(t, d, c, v.small, v.decode, meta, qb, wbuf, selb, upload(t, d, bits), wbf16, slotStride, T, tab)
						require.Less(t, maxRelErr(t, got, wantR), 2e-6, "bf16 latents against the CPU over the rounded latents (decode %v)", v.decode)
						rel := maxRelErr(t, got, want)
						require.Less(t, rel, 1e-2, "bf16 latents against fp32 latents (decode %v)", v.decode)
						if ci == 0 && !v.decode {
							t.Logf("bf16 latents: max relative error %.2e against fp32 latents", rel)
						}
					}
				}
				for tr := 0; tr < T; tr++ {
					if (tr+ci)%11 == 4 {
						for _, v := range big[tr*H*dv : (tr+1)*H*dv] {
							require.Zero(t, v, "row %d has no selection", tr)
						}
					}
				}
			})
		}
	}
}

// mla_append writes each row's latent at its position's page and row
// (pages of 3 rows, shuffled ids, odd lengths), in fp32 as given and in
// bf16 rounded to nearest even.
func TestMLAAppendPaged(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(3, 3))
	const R, page = 20, 3
	pos0, news := []int{0, 7, 2}, []int{5, 1, 4}
	S := len(pos0)
	meta, rowPos := stepMeta(t, d, pos0, news)
	T := len(rowPos)
	ckv := randn(r, T*R, 1)
	stride := 4 // pages per slot (12 positions)
	ids := r.Perm(S * stride)
	pt := make([]int32, len(ids))
	for i, id := range ids {
		pt[i] = int32(id)
	}
	ptb := upload(t, d, pt)
	for _, bf := range []int64{0, 1} {
		n := S * stride * page * R
		var cache buf
		if bf == 1 {
			cache = poisoned[uint16](t, d, n)
		} else {
			cache = poisoned[float32](t, d, n)
		}
		ap := kc.MLAAppendArgs{M: meta, Ckv: upload(t, d, ckv).p, Cache: cache.p, R: R, Pt: ptb.p, PtStride: int64(stride), Page: page, CacheBf16: bf}
		launch(t, d, kc.KernelMLAAppend, kc.Dim3{X: uint32((T*R + 255) / 256)}, kc.Dim3{X: 256}, 0, &ap)
		var got func(i int) float32
		if bf == 1 {
			b := download[uint16](t, cache)
			got = func(i int) float32 { return math.Float32frombits(uint32(b[i]) << 16) }
		} else {
			f := download[float32](t, cache)
			got = func(i int) float32 { return f[i] }
		}
		row := 0
		for s := 0; s < S; s++ {
			slot := S - 1 - s // stepMeta's slots
			for j := 0; j < news[s]; j++ {
				p := pos0[s] + j
				at := (int(pt[slot*stride+p/page])*page + p%page) * R
				for k := 0; k < R; k++ {
					want := ckv[(row+j)*R+k]
					if bf == 1 {
						want = bf16RNE(want)
					}
					require.Equal(t, want, got(at+k), "bf16 %d, sequence %d position %d channel %d", bf, s, p, k)
				}
			}
			row += news[s]
		}
	}
}
