package cuda

import (
	"fmt"

	"github.com/glmflash/glmflash/core/ir"
	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// DFlash ops: the draft layers' attention (src/dflash.cu) and the trunk's
// capture of the target layers' hidden rows.
func init() {
	bind(ir.OpDFlashAttn, bindDFlashAttn)
	bind(ir.OpConcatCols, bindConcatCols)
}

// dflashShape is a draft batch's kernel shape for a dflash_attn node:
// every sequence's keys are bounded by the store's positions plus the
// block, so the most splits (DFlashSplit) are a function of the batch's
// sequence count only and a captured graph serves every length.
func dflashShape(rc *runCtx, Hq, Hkv, hd, B int) kc.DFlashShape {
	return kc.DFlashShape{S: rc.S, B: B, Tc: rc.TC, Hq: Hq, Hkv: Hkv, HeadDim: hd, MaxKeys: rc.maxPos + B}
}

// bindDFlashAttn binds one draft layer's attention (node.Layer is its
// index in the draft store): glmf_dflash_prep normalizes and rotates the
// block's q and k rows into temporaries and appends the context rows' K/V
// to the layer's caches, glmf_dflash_attn attends over splits of the keys
// into the partials, glmf_dflash_reduce writes o.
func bindDFlashAttn(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	Hq, Hkv, hd, B := ir.AttrHeads.Get(n), ir.AttrKVHeads.Get(n), ir.AttrHeadDim.Get(n), ir.AttrBlock.Get(n)
	eps, theta := ir.AttrEps.Get(n), ir.AttrRopeTheta.Get(n)
	layer := n.Layer
	if layer < 0 {
		return nil, fmt.Errorf("a dflash_attn node needs its draft layer (node layer ≥ 0), got %d", layer)
	}
	if hd > kc.DFlashMaxHeadDim {
		return nil, fmt.Errorf("attribute head_dim %d: the CUDA kernel takes head dims up to %d", hd, kc.DFlashMaxHeadDim)
	}
	qn, err := p.w(in[6])
	if err != nil {
		return nil, fmt.Errorf("q_norm: %w", err)
	}
	kn, err := p.w(in[7])
	if err != nil {
		return nil, fmt.Errorf("k_norm: %w", err)
	}
	sms := p.b.dev.SMs
	return &kstep{
		temps: func(rc *runCtx) []int64 {
			sh := dflashShape(rc, Hq, Hkv, hd, B)
			nsplit := kc.DFlashSplit(sh, sms)
			po, pml := kc.DFlashPartFloats(sh, nsplit)
			return []int64{4 * int64(rc.T) * int64(Hq*hd), 4 * int64(rc.T) * int64(Hkv*hd), 4 * po, 4 * pml}
		},
		run: func(rc *runCtx) error {
			ds := rc.draft
			if ds == nil {
				return fmt.Errorf("the batch's store is not a draft store (a DFlash draft program runs on NewDraftStore's)")
			}
			if layer >= ds.layers {
				return fmt.Errorf("the draft store holds %d draft layers, not layer %d", ds.layers, layer)
			}
			if ds.width != Hkv*hd {
				return fmt.Errorf("the draft store's rows are %d wide, the layer's K/V %d×%d", ds.width, Hkv, hd)
			}
			for i, s := range rc.pr.Spans {
				if s.N != B {
					return fmt.Errorf("batch sequence %d has %d block rows, the block is %d", i, s.N, B)
				}
			}
			sh := dflashShape(rc, Hq, Hkv, hd, B)
			nsplit := kc.DFlashSplit(sh, sms)
			op := kc.DFlashOp{Q: rc.ptr(in[1]), Kb: rc.ptr(in[2]), Vb: rc.ptr(in[3]), Kc: rc.ptr(in[4]), Vc: rc.ptr(in[5]),
				QNorm: qn.ptr, KNorm: kn.ptr, QNormBF16: qn.bf16, KNormBF16: kn.bf16, O: rc.ptr(out),
				Qr: rc.temps[0], Kbr: rc.temps[1], PartO: rc.temps[2], PartML: rc.temps[3],
				KCache: ds.k[layer], VCache: ds.v[layer], SlotStride: ds.slotStride(), Meta: rc.dmeta,
				Shape: sh, Eps: eps, Theta: theta, NSplit: nsplit}
			return op.Launch(rc.dev)
		},
	}, nil
}

// bindConcatCols writes each row's inputs one after another, 8 inputs a
// launch.
func bindConcatCols(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	N := int64(out.Shape[1])
	return &kstep{run: func(rc *runCtx) error {
		R := int64(rc.rows(out))
		var off int64
		for j0 := 0; j0 < len(in); j0 += 8 {
			a := kc.ConcatArgs{Y: rc.ptr(out), R: R, N: N, Off: off}
			var W int64
			for j := j0; j < min(j0+8, len(in)); j++ {
				w := int64(in[j].Shape[1])
				a.X[a.Nin], a.W[a.Nin] = rc.ptr(in[j]), w
				a.Nin++
				W += w
			}
			if err := kc.LaunchConcatCols(rc.dev, blocks(R*W), block256, 0, &a); err != nil {
				return err
			}
			off += W
		}
		return nil
	}}, nil
}
