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
	if p.b.opts.PoisonDeviceLengths {
		poison = 1
	}
	return &kstep{run: func(rc *runCtx) error {
		a := kc.SeqLenArgs{M: rc.meta, Out: rc.ptr(out), Poison: poison}
		return kc.Launch(rc.dev, "glmf_seq_lengths", blocks(int64(rc.S)), block256, 0, &a)
	}}, nil
}

func bindDSAMeta(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	kp := n.Attrs.Int("kpool", 0)
	return &kstep{run: func(rc *runCtx) error {
		if _, err := rc.lens(in[0]); err != nil {
			return err
		}
		a := kc.DSAMetaArgs{M: rc.meta, Visible: rc.ptr(out), Kpool: int64(kp)}
		rc.host[out] = &dsaMeta{visible: rc.ptr(out), kpool: kp}
		return kc.Launch(rc.dev, "glmf_dsa_meta", blocks(int64(rc.T)), block256, 0, &a)
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
	in, out, a := n.Inputs, n.Outputs[0], n.Attrs
	ape, err := p.w(in[5])
	if err != nil {
		return nil, fmt.Errorf("compress ape: %w", err)
	}
	H, D, kp, topk := a.Int("heads", 0), a.Int("dim", 0), a.Int("kpool", 0), a.Int("topk", 0)
	tail := int64(0)
	if a.Bool("tail") {
		tail = 1
	}
	if D > 1024 {
		return nil, fmt.Errorf("indexer head dim %d exceeds 1024 threads per block", D)
	}
	width := out.Shape[1]
	layer := n.Layer
	share, extra := a.String("share", ""), a.Int("share_extra", 0)
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
				Pools: ls.pools, PoolsStride: ls.poolsStride, PendK: ls.pendK, PendG: ls.pendG, PendStride: ls.pendStride, D: int64(D), Kpool: int64(kp)}
			if ls.recK != 0 {
				ap.Ckpt, ap.RecK, ap.RecG, ap.RecStride = rc.ckpt, ls.recK, ls.recG, ls.recStride
			}
			if err := kc.Launch(rc.dev, "glmf_indexer_append", kc.Dim3{X: uint32(rc.S)}, kc.Dim3{X: appendThreads}, 0, &ap); err != nil {
				return err
			}
			if share != "" && ls.saved == 0 {
				return fmt.Errorf("layer %d keeps no shared indexer selection in the store", layer)
			}
			if share == ir.IndexShareReuse { // the saved selection and the positions since, no scoring
				sh := kc.IdxSharedArgs{M: rc.meta, Saved: ls.saved, SavedStride: ls.savedStride, SavedWidth: int64(width - extra),
					SharePos: rc.sharePos, Sel: rc.ptr(out), Width: int64(width)}
				return kc.Launch(rc.dev, "glmf_indexer_shared", kc.Dim3{X: uint32(rc.T)}, kc.Dim3{X: 32}, 0, &sh)
			}
			mv := rc.maxVisible[kp]
			scores := rc.temps[0]
			if mv > 0 {
				sa := kc.IdxScoreArgs{M: rc.meta, Visible: m.visible, Q: rc.ptr(in[1]), W: rc.ptr(in[4]), Pools: ls.pools, PoolsStride: ls.poolsStride,
					Scores: scores, Ld: int64(mv), H: int64(H), D: int64(D), Scale: scale, Wscale: wscale}
				if err := kc.Launch(rc.dev, "glmf_indexer_score", kc.Dim3{X: uint32((mv + 127) / 128), Y: uint32(rc.T)}, kc.Dim3{X: 128}, 4*H*D, &sa); err != nil {
					return err
				}
			}
			se := kc.IdxSelectArgs{M: rc.meta, Visible: m.visible, Scores: scores, Ld: int64(max(mv, 1)), Sel: rc.ptr(out), Width: int64(width),
				Kpool: int64(kp), Keep: int64(topk / kp), Tail: tail}
			if err := kc.Launch(rc.dev, "glmf_indexer_select", kc.Dim3{X: uint32(rc.T)}, block256, 0, &se); err != nil {
				return err
			}
			if share == ir.IndexShareSave {
				sv := kc.IdxSaveArgs{M: rc.meta, Sel: rc.ptr(out), Width: int64(width), Saved: ls.saved, SavedStride: ls.savedStride}
				return kc.Launch(rc.dev, "glmf_indexer_save", kc.Dim3{X: uint32(rc.S)}, block256, 0, &sv)
			}
			return nil
		}}, nil
}

func bindMLA(p *Program, n *ir.Node) (*kstep, error) {
	in, out, a := n.Inputs, n.Outputs[0], n.Attrs
	W, err := p.w(in[3])
	if err != nil {
		return nil, fmt.Errorf("kv_b weight: %w", err)
	}
	H, dq, dv, R := a.Int("heads", 0), a.Int("qk_dim", 0), a.Int("v_dim", 0), a.Int("rank", 0)
	scale := float64(float32(a.Float("scale", 0)))
	width := in[4].Shape[1]
	layer := n.Layer
	return &kstep{
		temps: func(rc *runCtx) []int64 { return []int64{4 * int64(rc.T*H*R), 4 * int64(rc.T*H*R)} },
		run: func(rc *runCtx) error {
			if _, err := metaOf(rc, in[0]); err != nil {
				return err
			}
			ls := rc.store.layer(layer)
			if ls.ckv == 0 {
				return fmt.Errorf("slot state has no latent cache for layer %d", layer)
			}
			qa, ol := rc.temps[0], rc.temps[1]
			ap := kc.MLAAppendArgs{M: rc.meta, Ckv: rc.ptr(in[2]), Cache: ls.ckv, SlotStride: ls.ckvStride, R: int64(R)}
			if err := kc.Launch(rc.dev, "glmf_mla_append", blocks(int64(rc.T*R)), block256, 0, &ap); err != nil {
				return err
			}
			TH := uint32(rc.T * H)
			qab := kc.MLAQAbsArgs{Q: rc.ptr(in[1]), W: W.ptr, WBf16: W.flag(), Qa: qa, T: int64(rc.T), H: int64(H), Dq: int64(dq), Dv: int64(dv), R: int64(R)}
			if err := kc.Launch(rc.dev, "glmf_mla_qabs", kc.Dim3{X: TH}, block256, 4*dq, &qab); err != nil {
				return err
			}
			at := kc.MLAAttendArgs{M: rc.meta, Qa: qa, Sel: rc.ptr(in[4]), Width: int64(width), Cache: ls.ckv, SlotStride: ls.ckvStride,
				Ol: ol, T: int64(rc.T), H: int64(H), R: int64(R), Scale: scale}
			if err := kc.Launch(rc.dev, "glmf_mla_attend", kc.Dim3{X: TH}, block256, 4*width, &at); err != nil {
				return err
			}
			ex := kc.MLAExpandArgs{Ol: ol, W: W.ptr, WBf16: W.flag(), O: rc.ptr(out), T: int64(rc.T), H: int64(H), Dq: int64(dq), Dv: int64(dv), R: int64(R)}
			return kc.Launch(rc.dev, "glmf_mla_expand", kc.Dim3{X: TH}, block256, 4*R, &ex)
		}}, nil
}
