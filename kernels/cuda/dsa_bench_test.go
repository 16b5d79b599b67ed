package cuda_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// benchMeta is the batch metadata of M decode rows, one a sequence (slot
// s), each at position ctx−1.
func benchMeta(b *testing.B, d *kc.Device, M, ctx int) kc.BatchMeta {
	var slot, pos0, n, row0, rowSeq, rowPos, last []int32
	for s := 0; s < M; s++ {
		slot = append(slot, int32(s))
		pos0 = append(pos0, int32(ctx-1))
		n = append(n, 1)
		row0 = append(row0, int32(s))
		rowSeq = append(rowSeq, int32(s))
		rowPos = append(rowPos, int32(ctx-1))
		last = append(last, int32(s))
	}
	return kc.BatchMeta{SeqSlot: upload(b, d, slot).p, SeqPos0: upload(b, d, pos0).p, SeqN: upload(b, d, n).p, SeqRow0: upload(b, d, row0).p,
		RowSeq: upload(b, d, rowSeq).p, RowPos: upload(b, d, rowPos).p, LastRow: upload(b, d, last).p, S: int64(M), T: int64(M)}
}

// BenchmarkMLADecode times one mla_attn's kernels (less the cache append)
// on the gpu preset's geometry (64 heads, qk/v 256, rank 512, selection
// width 2051, bf16 kv_b) at M decode rows whose selections list the first
// ctx positions (min(ctx, 2048) entries): the decode kernels the backend
// runs below 16 rows beside the small- and big-tile kernels (the path
// before them, and the one at 16 rows and more). weightGB/s counts the
// kv_b bytes (the floor at short contexts). Graph of reps calls:
//
//	go test -run - -bench MLADecode ./kernels/cuda
func BenchmarkMLADecode(b *testing.B) {
	d := openDevice(b)
	if d.Emulated {
		b.Skip("the emulator's timings mean nothing")
	}
	const reps = 20
	const H, dq, dv, R, width = 64, 256, 256, 512, 2051
	r := rand.New(rand.NewPCG(5, 6))
	wb, _ := toBF16(randn(r, H*(dq+dv)*R, 0.05))
	W := upload(b, d, wb)
	wbytes := float64(2 * len(wb))
	stride := int64((dq + dv) * R)
	cdiv := func(x, y int) uint32 { return uint32((x + y - 1) / y) }
	for _, ctx := range []int{40, 2048, 8192} {
		for _, M := range []int{1, 8, 64} {
			meta := benchMeta(b, d, M, ctx)
			cache := upload(b, d, randn(r, M*ctx*R, 1))
			sel := make([]int32, M*width)
			for t := 0; t < M; t++ {
				for i := 0; i < width; i++ {
					sel[t*width+i] = -1
					if i < min(ctx, 2048) {
						sel[t*width+i] = int32(ctx - min(ctx, 2048) + i)
					}
				}
			}
			S, Q := upload(b, d, sel), upload(b, d, randn(r, M*H*dq, 1))
			qa, ol := poisoned[float32](b, d, M*H*R), poisoned[float32](b, d, M*H*R)
			lg, o := poisoned[float32](b, d, M*H*width), poisoned[float32](b, d, M*H*dv)
			const nch = (width + 255) / 256
			part, live := poisoned[float32](b, d, M*nch*H*R), poisoned[int32](b, d, M*nch)
			scale := float64(float32(0.0625))
			name := fmt.Sprintf("ctx%d/M%d", ctx, M)
			if M <= 16 {
				b.Run(name+"/decode", func(b *testing.B) {
					qab := kc.MLAGemvArgs{A: Q.p, Lda: H * dq, AHead: dq, AParts: 1, W: W.p, WBf16: 1, WHead: stride, WLd: R,
						C: qa.p, Ldc: H * R, CHead: 1, CN: H, M: int64(M), N: R, K: dq}
					lo := kc.MLALogitsDArgs{M: meta, Qt: qa.p, Sel: S.p, Width: width, Cache: cache.p, SlotStride: int64(ctx * R), Lg: lg.p, H: H, R: R}
					sm := kc.MLASoftmaxArgs{Sel: S.p, Width: width, Lg: lg.p, H: H, Scale: scale}
					ac := kc.MLAAccumDArgs{M: meta, Lg: lg.p, Sel: S.p, Width: width, Cache: cache.p, SlotStride: int64(ctx * R), Part: part.p, Live: live.p, H: H, R: R}
					ex := kc.MLAGemvArgs{A: part.p, Lda: nch * H * R, AHead: R, AParts: nch, APartStride: H * R, ALive: live.p, W: W.p, WBf16: 1, WHead: stride, WOff: dq * R, WLd: R,
						C: o.p, Ldc: H * dv, CHead: dv, CN: 1, M: int64(M), N: dv, K: R}
					timeLaunches(b, d, reps, true, wbytes, func() error {
						for _, l := range []func() error{
							func() error { return kc.LaunchMLAQabsGv(d, kc.Dim3{X: cdiv(R, 32), Y: H}, kc.Dim3{X: 256}, 0, &qab) },
							func() error {
								return kc.LaunchMLALogitsD(d, kc.Dim3{X: cdiv(width, 12), Y: uint32(M)}, kc.Dim3{X: 256}, 4*(12*R+64*H), &lo)
							},
							func() error { return kc.LaunchMLASoftmax(d, kc.Dim3{X: H, Y: uint32(M)}, kc.Dim3{X: 256}, 0, &sm) },
							func() error {
								return kc.LaunchMLAAccumD(d, kc.Dim3{X: cdiv(R, 32), Y: nch, Z: uint32(M) * cdiv(H, 8)}, kc.Dim3{X: 256}, 0, &ac)
							},
							func() error { return kc.LaunchMLAExpandGv(d, kc.Dim3{X: cdiv(dv, 32), Y: H}, kc.Dim3{X: 256}, 0, &ex) },
						} {
							if err := l(); err != nil {
								return err
							}
						}
						return nil
					})
				})
			}
			for _, small := range []bool{true, false} {
				sfx, tm, tn, th := "", 64, 64, uint32(256)
				if small {
					sfx, tm, tn, th = "_s", 16, 32, 128
				}
				b.Run(name+"/tiled"+sfx, func(b *testing.B) {
					qab := kc.MLAHeadMMArgs{A: Q.p, Lda: H * dq, AHead: dq, W: W.p, WBf16: 1, WHead: stride, WLd: R, C: qa.p, Ldc: H * R, CHead: R, M: int64(M), N: R, K: dq}
					lo := kc.MLALogitsArgs{M: meta, Qa: qa.p, Sel: S.p, Width: width, Cache: cache.p, SlotStride: int64(ctx * R), Lg: lg.p, H: H, R: R}
					sm := kc.MLASoftmaxArgs{Sel: S.p, Width: width, Lg: lg.p, H: H, Scale: scale}
					ac := kc.MLAAccumArgs{M: meta, Lg: lg.p, Sel: S.p, Width: width, Cache: cache.p, SlotStride: int64(ctx * R), Ol: ol.p, H: H, R: R}
					ex := kc.MLAHeadMMArgs{A: ol.p, Lda: H * R, AHead: R, W: W.p, WBf16: 1, WHead: stride, WOff: dq * R, WLd: R, C: o.p, Ldc: H * dv, CHead: dv, M: int64(M), N: dv, K: R}
					timeLaunches(b, d, reps, true, wbytes, func() error {
						for _, l := range []func() error{
							func() error {
								return kc.MLAQabsKernel(small).Launch(d, kc.Dim3{X: cdiv(R, tn), Y: cdiv(M, tm), Z: H}, kc.Dim3{X: th}, 0, &qab)
							},
							func() error {
								return kc.MLALogitsKernel(small).Launch(d, kc.Dim3{X: cdiv(width, tn), Y: cdiv(H, tm), Z: uint32(M)}, kc.Dim3{X: th}, 0, &lo)
							},
							func() error { return kc.LaunchMLASoftmax(d, kc.Dim3{X: H, Y: uint32(M)}, kc.Dim3{X: 256}, 0, &sm) },
							func() error {
								return kc.MLAAccumKernel(small).Launch(d, kc.Dim3{X: cdiv(R, tn), Y: cdiv(H, tm), Z: uint32(M)}, kc.Dim3{X: th}, 0, &ac)
							},
							func() error {
								return kc.MLAExpandKernel(small).Launch(d, kc.Dim3{X: cdiv(dv, tn), Y: cdiv(M, tm), Z: H}, kc.Dim3{X: th}, 0, &ex)
							},
						} {
							if err := l(); err != nil {
								return err
							}
						}
						return nil
					})
				})
			}
		}
	}
}

// BenchmarkDSATopKDecode times one dsa_topk's kernels at decode (append,
// score, select) on the gpu preset's indexer (32 heads × 128, kpool 4,
// topk 2048) at M rows of context ctx, with the scores scratch and score
// grid sized for a store of 16384 positions as under graphs (weightGB/s
// counts the visible pool keys' bytes):
//
//	go test -run - -bench DSATopKDecode ./kernels/cuda
func BenchmarkDSATopKDecode(b *testing.B) {
	d := openDevice(b)
	if d.Emulated {
		b.Skip("the emulator's timings mean nothing")
	}
	const reps = 20
	const H, D, kp, topk, maxPos = 32, 128, 4, 2048, 16384
	const width = topk + kp - 1
	const mv = maxPos/kp + 1
	r := rand.New(rand.NewPCG(7, 8))
	wb, _ := toBF16(randn(r, kp*D, 0.3))
	ape := upload(b, d, wb)
	for _, ctx := range []int{40, 2048, 8192} {
		for _, M := range []int{1, 8, 64} {
			meta := benchMeta(b, d, M, ctx)
			pools := upload(b, d, randn(r, M*mv*D, 1))
			pend := poisoned[float32](b, d, 2*M*kp*D)
			vis := make([]int32, M)
			for i := range vis {
				vis[i] = int32(ctx / kp)
			}
			V := upload(b, d, vis)
			K, G := upload(b, d, randn(r, M*D, 1)), upload(b, d, randn(r, M*D, 1))
			Q, Wt := upload(b, d, randn(r, M*H*D, 1)), upload(b, d, randn(r, M*H, 1))
			scores, sel := poisoned[float32](b, d, M*mv), poisoned[int32](b, d, M*width)
			ap := kc.IdxAppendArgs{M: meta, K: K.p, Gate: G.p, Ape: ape.p, ApeBf16: 1, Pools: pools.p, PoolsStride: mv * D,
				PendK: pend.p, PendG: pend.p + kc.DevicePtr(4*M*kp*D), PendStride: kp * D, D: D, Kpool: kp}
			sa := kc.IdxScoreArgs{M: meta, Visible: V.p, Q: Q.p, W: Wt.p, Pools: pools.p, PoolsStride: mv * D, Scores: scores.p, Ld: mv,
				H: H, D: D, Keep: topk / kp, Scale: 0.088388346, Wscale: 0.17677669}
			se := kc.IdxSelectArgs{M: meta, Visible: V.p, Scores: scores.p, Ld: mv, Sel: sel.p, Width: width, Kpool: kp, Keep: topk / kp, Tail: 1}
			b.Run(fmt.Sprintf("ctx%d/M%d", ctx, M), func(b *testing.B) {
				timeLaunches(b, d, reps, true, float64(4*M*(ctx/kp)*D), func() error {
					if err := kc.LaunchIndexerAppend(d, kc.Dim3{X: uint32(M)}, kc.Dim3{X: D}, 0, &ap); err != nil {
						return err
					}
					if err := kc.LaunchIndexerScore(d, kc.Dim3{X: (mv + 31) / 32, Y: uint32(M)}, kc.Dim3{X: 256}, 4*(H*(D+1)+32*D), &sa); err != nil {
						return err
					}
					return kc.LaunchIndexerSelect(d, kc.Dim3{X: uint32(M)}, kc.Dim3{X: 256}, 0, &se)
				})
			})
		}
	}
}
