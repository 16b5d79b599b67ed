package cuda

import (
	"fmt"
	"math"

	"github.com/glmflash/glmflash/core/ir"
	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// DSA ops: lengths, per-batch metadata, the k-pool indexer and sparse MLA.
func init() {
	bind(ir.OpSeqLengths, bindSeqLengths)
	bind(ir.OpDSAMeta, bindDSAMeta)
	bind(ir.OpDSATopK, bindDSATopK)
	bind(ir.OpMLAAttn, bindMLA)
}

// dsaMeta is the value of a dsa_meta node on the device: the visible-pools
// array (at the node's output address) and its pool size.
type dsaMeta struct {
	visible kc.DevicePtr
	kpool   int
}

func bindSeqLengths(p *Program, n *ir.Node) (*kstep, error) {
	out := n.Outputs[0]
	poison := int64(0)
	if p.b.poisonLengths {
		poison = 1
	}
	return &kstep{run: func(rc *runCtx) error {
		a := kc.SeqLenArgs{M: rc.meta, Out: rc.ptr(out), Poison: poison}
		return kc.LaunchSeqLengths(rc.dev, blocks(int64(rc.S)), block256, 0, &a)
	}}, nil
}

func bindDSAMeta(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	kp := ir.AttrKPool.Get(n)
	return &kstep{run: func(rc *runCtx) error {
		if _, err := rc.lens(in[0]); err != nil {
			return err
		}
		a := kc.DSAMetaArgs{M: rc.meta, Visible: rc.ptr(out), Kpool: int64(kp)}
		rc.host[out] = &dsaMeta{visible: rc.ptr(out), kpool: kp}
		return kc.LaunchDSAMeta(rc.dev, blocks(int64(rc.T)), block256, 0, &a)
	}}, nil
}

func metaOf(rc *runCtx, v *ir.Value) (*dsaMeta, error) {
	m, ok := rc.host[v].(*dsaMeta)
	if !ok {
		return nil, fmt.Errorf("metadata input %s is not DSA metadata", v.Name)
	}
	return m, nil
}

func bindDSATopK(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	ape, err := p.w(in[5])
	if err != nil {
		return nil, fmt.Errorf("compress ape: %w", err)
	}
	H, D, kp, topk := ir.AttrHeads.Get(n), ir.AttrDim.Get(n), ir.AttrKPool.Get(n), ir.AttrTopK.Get(n)
	tail := int64(0)
	if ir.AttrTail.Get(n) {
		tail = 1
	}
	if D > 1024 {
		return nil, fmt.Errorf("indexer head dim %d exceeds 1024 threads per block", D)
	}
	if sm := idxScoreSmem(H, D); sm > 48<<10 {
		return nil, fmt.Errorf("indexer of %d heads × %d needs %d bytes of shared memory to score (at most 48 KiB)", H, D, sm)
	}
	width := out.Shape[1]
	layer := n.Layer
	share, extra := ir.AttrShare.Get(n), ir.AttrShareExtra.Get(n)
	scale := float64(float32(1 / math.Sqrt(float64(D))))
	wscale := float64(float32(1 / math.Sqrt(float64(H))))
	appendThreads := uint32((D + 31) / 32 * 32)
	return &kstep{
		temps: func(rc *runCtx) []int64 {
			if share == ir.IndexShareReuse {
				return nil
			}
			return []int64{4 * int64(rc.T) * int64(max(rc.maxVisible[kp], 1))}
		},
		run: func(rc *runCtx) error {
			m, err := metaOf(rc, in[0])
			if err != nil {
				return err
			}
			if m.kpool != kp {
				return fmt.Errorf("metadata input does not match kpool %d", kp)
			}
			ls := rc.store.layer(layer)
			if ls.pools == 0 {
				return fmt.Errorf("slot state has no indexer for layer %d", layer)
			}
			ap := kc.IdxAppendArgs{M: rc.meta, K: rc.ptr(in[2]), Gate: rc.ptr(in[3]), Ape: ape.ptr, ApeBf16: ape.flag(),
				Pools: ls.pools, PendK: ls.pendK, PendG: ls.pendG, PendStride: ls.pendStride, D: int64(D), Kpool: int64(kp),
				Pt: rc.store.pt, PtStride: int64(rc.store.ptStride), Page: int64(rc.store.page / kp)}
			if ls.recK != 0 {
				ap.Ckpt, ap.RecK, ap.RecG, ap.RecStride = rc.ckpt, ls.recK, ls.recG, ls.recStride
			}
			if err := kc.LaunchIndexerAppend(rc.dev, kc.Dim3{X: uint32(rc.S)}, kc.Dim3{X: appendThreads}, 0, &ap); err != nil {
				return err
			}
			if share != "" && ls.saved == 0 {
				return fmt.Errorf("layer %d keeps no shared indexer selection in the store", layer)
			}
			if share == ir.IndexShareReuse { // the saved selection and the positions since, no scoring
				sh := kc.IdxSharedArgs{M: rc.meta, Saved: ls.saved, SavedStride: ls.savedStride, SavedWidth: int64(width - extra),
					SharePos: rc.sharePos, Sel: rc.ptr(out), Width: int64(width)}
				return kc.LaunchIndexerShared(rc.dev, kc.Dim3{X: uint32(rc.T)}, block256, 0, &sh)
			}
			mv := rc.maxVisible[kp]
			scores := rc.temps[0]
			if mv > 0 {
				sa := kc.IdxScoreArgs{M: rc.meta, Visible: m.visible, Q: rc.ptr(in[1]), W: rc.ptr(in[4]), Pools: ls.pools,
					Pt: rc.store.pt, PtStride: int64(rc.store.ptStride), Page: int64(rc.store.page / kp),
					Scores: scores, Ld: int64(mv), H: int64(H), D: int64(D), Keep: int64(topk / kp), Scale: scale, Wscale: wscale}
				if err := kc.LaunchIndexerScore(rc.dev, kc.Dim3{X: uint32((mv + idxScorePools - 1) / idxScorePools), Y: uint32(rc.T)}, block256, idxScoreSmem(H, D), &sa); err != nil {
					return err
				}
			}
			se := kc.IdxSelectArgs{M: rc.meta, Visible: m.visible, Scores: scores, Ld: int64(max(mv, 1)), Sel: rc.ptr(out), Width: int64(width),
				Kpool: int64(kp), Keep: int64(topk / kp), Tail: tail}
			if err := kc.LaunchIndexerSelect(rc.dev, kc.Dim3{X: uint32(rc.T)}, block256, 0, &se); err != nil {
				return err
			}
			if share == ir.IndexShareSave {
				sv := kc.IdxSaveArgs{M: rc.meta, Sel: rc.ptr(out), Width: int64(width), Saved: ls.saved, SavedStride: ls.savedStride}
				return kc.LaunchIndexerSave(rc.dev, kc.Dim3{X: uint32(rc.S)}, block256, 0, &sv)
			}
			return nil
		}}, nil
}

// idxScorePools is the pools one glmf_indexer_score block scores
// (SCORE_PB in dsa.cu: 8 warps of SCORE_PW pools).
const idxScorePools = 32

// idxScoreSmem is glmf_indexer_score's dynamic shared memory: the row's
// queries (rows of D+1 floats) and each warp's pool keys.
func idxScoreSmem(H, D int) int { return 4 * (H*(D+1) + idxScorePools*D) }

// mlaLogitBudget bounds the logits scratch of one mla_attn launch group:
// rows are attended in chunks of at most this many bytes of [H][width]
// logits (the chunking changes no result).
const mlaLogitBudget = 128 << 20

// mlaSmallRows: below this many rows the MLA kernels use their small tiles
// (more blocks for decode); both tile shapes give the same bits.
const mlaSmallRows = 16

// The decode kernels' shapes (dsa.cu): entries per glmf_mla_logits_d block
// (MLA_LD_E) and the k of its query chunks (MLA_LD_KQ), columns per
// glmf_mla_*_gv block (MLA_GV_NC), entries per glmf_mla_accum_d chunk
// (MLA_AD_CH).
const (
	mlaDecodeEntries = 12
	mlaDecodeQK      = 64
	mlaGemvCols      = 32
	mlaAccumChunk    = 256
)

// mlaDecodeSmem is the default dynamic shared memory, which bounds what
// glmf_mla_logits_d stages (R floats per entry and a chunk of queries).
const mlaDecodeSmem = 48 << 10

// mlaDecodeOK reports whether the decode kernels take T rows of H heads,
// rank R and a selection width (else the small tiles run): below 16 rows,
// at most 64 heads (a thread per head and 4 entries: 3·64 threads of 256),
// the staging within
// the default shared memory and the logits in one chunk.
func mlaDecodeOK(T, H, R, width int) bool {
	return T < mlaSmallRows && H <= 64 && mlaDecodeSmemBytes(H, R) <= mlaDecodeSmem && mlaRowChunk(T, H, width) == T
}

func mlaDecodeSmemBytes(H, R int) int { return 4 * (mlaDecodeEntries*R + mlaDecodeQK*H) }

// mlaRowChunk returns the rows per logits chunk for T rows of H heads over
// width selection entries: the chunks as even as the budget allows.
func mlaRowChunk(T, H, width int) int {
	per := 4 * int64(H) * int64(max(width, 1))
	maxRows := int(max(1, mlaLogitBudget/per))
	if T <= maxRows {
		return max(T, 1)
	}
	n := (T + maxRows - 1) / maxRows
	return (T + n - 1) / n
}

func bindMLA(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	W, err := p.w(in[3])
	if err != nil {
		return nil, fmt.Errorf("kv_b weight: %w", err)
	}
	H, dq, dv, R := ir.AttrHeads.Get(n), ir.AttrQKDim.Get(n), ir.AttrVDim.Get(n), ir.AttrRank.Get(n)
	scale := float64(float32(ir.AttrScale.Get(n)))
	width := in[4].Shape[1]
	layer := n.Layer
	// softmax threads: a power of two, about 8 entries each (a function of
	// the geometry only, so its reduction tree is the same in every batch)
	smThreads := uint32(32)
	for smThreads < 256 && int(smThreads)*8 < width {
		smThreads *= 2
	}
	return &kstep{
		temps: func(rc *runCtx) []int64 {
			tc := mlaRowChunk(rc.T, H, width)
			olSize := 4 * int64(rc.T*H*R)
			if mlaDecodeOK(rc.T, H, R, width) { // the accumulation's chunk partials and their live flags
				nch := int64((width + mlaAccumChunk - 1) / mlaAccumChunk)
				olSize = olSize*nch + 4*int64(rc.T)*nch
			}
			return []int64{4 * int64(rc.T*H*R), olSize, 4 * int64(tc) * int64(H) * int64(width)}
		},
		run: func(rc *runCtx) error {
			if _, err := metaOf(rc, in[0]); err != nil {
				return err
			}
			ls := rc.store.layer(layer)
			if ls.ckv == 0 {
				return fmt.Errorf("slot state has no latent cache for layer %d", layer)
			}
			qa, ol, lg := rc.temps[0], rc.temps[1], rc.temps[2]
			T := rc.T
			// the latents' page table (the store's, at a fixed address)
			pt, ptStride, page := rc.store.pt, int64(rc.store.ptStride), int64(rc.store.page)
			kvbf := int64(0) // the latents' dtype
			if rc.store.kvBF16 {
				kvbf = 1
			}
			ap := kc.MLAAppendArgs{M: rc.meta, Ckv: rc.ptr(in[2]), Cache: ls.ckv, R: int64(R), Pt: pt, PtStride: ptStride, Page: page, CacheBf16: kvbf}
			if err := kc.LaunchMLAAppend(rc.dev, blocks(int64(T*R)), block256, 0, &ap); err != nil {
				return err
			}
			cdiv := func(x, y int) uint32 { return uint32((x + y - 1) / y) }
			stride := int64((dq + dv) * R)
			if mlaDecodeOK(T, H, R, width) {
				// decode: the absorbed queries k-major ([t][R][H]), logits of the
				// selected entries only, softmax up to the row's last selected
				// entry, the accumulation's chunks in parallel, added by the
				// expand (the same bits as the tiled kernels)
				nch := (width + mlaAccumChunk - 1) / mlaAccumChunk
				live := ol + kc.DevicePtr(4*T*nch*H*R)
				qab := kc.MLAGemvArgs{A: rc.ptr(in[1]), Lda: int64(H * dq), AHead: int64(dq), AParts: 1, W: W.ptr, WBf16: W.flag(), WHead: stride, WOff: 0, WLd: int64(R),
					C: qa, Ldc: int64(H * R), CHead: 1, CN: int64(H), M: int64(T), N: int64(R), K: int64(dq)}
				if err := kc.LaunchMLAQabsGv(rc.dev, kc.Dim3{X: cdiv(R, mlaGemvCols), Y: uint32(H)}, block256, 0, &qab); err != nil {
					return err
				}
				lo := kc.MLALogitsDArgs{M: rc.meta, Qt: qa, Sel: rc.ptr(in[4]), Width: int64(width), Cache: ls.ckv, Pt: pt, PtStride: ptStride, Page: page, CacheBf16: kvbf,
					Lg: lg, H: int64(H), R: int64(R)}
				if err := kc.LaunchMLALogitsD(rc.dev, kc.Dim3{X: cdiv(width, mlaDecodeEntries), Y: uint32(T)}, block256, mlaDecodeSmemBytes(H, R), &lo); err != nil {
					return err
				}
				sm := kc.MLASoftmaxArgs{Sel: rc.ptr(in[4]), Width: int64(width), Lg: lg, H: int64(H), Scale: scale}
				if err := kc.LaunchMLASoftmax(rc.dev, kc.Dim3{X: uint32(H), Y: uint32(T)}, kc.Dim3{X: smThreads}, 0, &sm); err != nil {
					return err
				}
				ac := kc.MLAAccumDArgs{M: rc.meta, Lg: lg, Sel: rc.ptr(in[4]), Width: int64(width), Cache: ls.ckv, Pt: pt, PtStride: ptStride, Page: page, CacheBf16: kvbf,
					Part: ol, Live: live, H: int64(H), R: int64(R)}
				if err := kc.LaunchMLAAccumD(rc.dev, kc.Dim3{X: cdiv(R, 32), Y: uint32(nch), Z: uint32(T) * cdiv(H, 8)}, block256, 0, &ac); err != nil {
					return err
				}
				ex := kc.MLAGemvArgs{A: ol, Lda: int64(nch * H * R), AHead: int64(R), AParts: int64(nch), APartStride: int64(H * R), ALive: live, W: W.ptr, WBf16: W.flag(), WHead: stride, WOff: int64(dq * R), WLd: int64(R),
					C: rc.ptr(out), Ldc: int64(H * dv), CHead: int64(dv), CN: 1, M: int64(T), N: int64(dv), K: int64(R)}
				return kc.LaunchMLAExpandGv(rc.dev, kc.Dim3{X: cdiv(dv, mlaGemvCols), Y: uint32(H)}, block256, 0, &ex)
			}
			// tiles (TM rows × TN columns) and threads of the big and small variants
			small, tm, tn, th := false, 64, 64, uint32(256)
			if T < mlaSmallRows {
				small, tm, tn, th = true, 16, 32, 128
			}
			qab := kc.MLAHeadMMArgs{A: rc.ptr(in[1]), Lda: int64(H * dq), AHead: int64(dq), W: W.ptr, WBf16: W.flag(), WHead: stride, WOff: 0, WLd: int64(R),
				C: qa, Ldc: int64(H * R), CHead: int64(R), M: int64(T), N: int64(R), K: int64(dq)}
			if err := kc.MLAQabsKernel(small).Launch(rc.dev, kc.Dim3{X: cdiv(R, tn), Y: cdiv(T, tm), Z: uint32(H)}, kc.Dim3{X: th}, 0, &qab); err != nil {
				return err
			}
			tc := mlaRowChunk(T, H, width)
			for t0 := 0; t0 < T; t0 += tc {
				nr := min(tc, T-t0)
				lo := kc.MLALogitsArgs{M: rc.meta, Qa: qa, Sel: rc.ptr(in[4]), Width: int64(width), Cache: ls.ckv, Pt: pt, PtStride: ptStride, Page: page, CacheBf16: kvbf,
					Lg: lg, T0: int64(t0), H: int64(H), R: int64(R)}
				if err := kc.MLALogitsKernel(small).Launch(rc.dev, kc.Dim3{X: cdiv(width, tn), Y: cdiv(H, tm), Z: uint32(nr)}, kc.Dim3{X: th}, 0, &lo); err != nil {
					return err
				}
				sm := kc.MLASoftmaxArgs{Sel: rc.ptr(in[4]), Width: int64(width), Lg: lg, T0: int64(t0), H: int64(H), Scale: scale}
				if err := kc.LaunchMLASoftmax(rc.dev, kc.Dim3{X: uint32(H), Y: uint32(nr)}, kc.Dim3{X: smThreads}, 0, &sm); err != nil {
					return err
				}
				ac := kc.MLAAccumArgs{M: rc.meta, Lg: lg, Sel: rc.ptr(in[4]), Width: int64(width), Cache: ls.ckv, Pt: pt, PtStride: ptStride, Page: page, CacheBf16: kvbf,
					Ol: ol, T0: int64(t0), H: int64(H), R: int64(R)}
				if err := kc.MLAAccumKernel(small).Launch(rc.dev, kc.Dim3{X: cdiv(R, tn), Y: cdiv(H, tm), Z: uint32(nr)}, kc.Dim3{X: th}, 0, &ac); err != nil {
					return err
				}
			}
			ex := kc.MLAHeadMMArgs{A: ol, Lda: int64(H * R), AHead: int64(R), W: W.ptr, WBf16: W.flag(), WHead: stride, WOff: int64(dq * R), WLd: int64(R),
				C: rc.ptr(out), Ldc: int64(H * dv), CHead: int64(dv), M: int64(T), N: int64(dv), K: int64(R)}
			return kc.MLAExpandKernel(small).Launch(rc.dev, kc.Dim3{X: cdiv(dv, tn), Y: cdiv(T, tm), Z: uint32(H)}, kc.Dim3{X: th}, 0, &ex)
		}}, nil
}
