package cpu

import (
	"fmt"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/kernels/dflash"
)

// DFlash ops: the draft layers' attention and the trunk's capture of the
// target layers' hidden rows.
func init() {
	bind(ir.OpDFlashAttn, bindDFlashAttn)
	bind(ir.OpConcatCols, bindConcatCols)
}

// bindDFlashAttn binds one draft layer's attention (node.Layer is its
// index in the draft store). Per sequence: its context rows' k are normed
// and rotated at positions L..L+c−1 and appended with their v to the
// layer's K/V state; its B block rows' q and k are normed and rotated at
// L+c..L+c+B−1; the block attends to every cached row and itself.
func bindDFlashAttn(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	cfg := dflash.Config{Heads: ir.AttrHeads.Get(n), KVHeads: ir.AttrKVHeads.Get(n), HeadDim: ir.AttrHeadDim.Get(n), Eps: ir.AttrEps.Get(n), Theta: ir.AttrRopeTheta.Get(n)}
	B, l := ir.AttrBlock.Get(n), n.Layer
	if l < 0 {
		return nil, fmt.Errorf("a dflash_attn node needs its draft layer (node layer ≥ 0), got %d", l)
	}
	qn, kn := p.constant(in[6]), p.constant(in[7])
	if qn == nil || kn == nil {
		return nil, fmt.Errorf("the q_norm and k_norm weights must be constants")
	}
	Q, W := cfg.Heads*cfg.HeadDim, cfg.KVHeads*cfg.HeadDim
	return func(rc *runCtx) error {
		q, kb, vb, kc, vc := rc.in(in[1]), rc.in(in[2]), rc.in(in[3]), rc.in(in[4]), rc.in(in[5])
		o := rc.out(outs[0])
		for i, s := range rc.batch.seqs {
			if s.draft == nil {
				return fmt.Errorf("batch sequence %d has no draft state (a draft program runs on a draft store)", i)
			}
			if s.n != B {
				return fmt.Errorf("batch sequence %d has %d block rows, the block is %d", i, s.n, B)
			}
			if l >= len(s.draft.K) {
				return fmt.Errorf("the draft store holds %d draft layers, not layer %d", len(s.draft.K), l)
			}
			L := s.pos0
			if got := len(s.draft.K[l]) / W; got != L {
				return fmt.Errorf("batch sequence %d: layer %d holds %d context rows, the sequence %d", i, l, got, L)
			}
			// scratch: the context rows' k, the block's q, then the keys and
			// values the block attends to (the L+c cached rows, the block's)
			N := L + s.c + B
			buf := rc.p.scratch(s.c*W + B*Q + 2*N*W)
			kcs, qs := buf[:s.c*W], buf[s.c*W:s.c*W+B*Q]
			keys, vals := buf[s.c*W+B*Q:s.c*W+B*Q+N*W], buf[s.c*W+B*Q+N*W:]
			copy(kcs, kc[s.crow0*W:(s.crow0+s.c)*W])
			cfg.NormRope(kcs, s.c, cfg.KVHeads, kn, L)
			s.draft.Append(l, kcs, vc[s.crow0*W:(s.crow0+s.c)*W])
			kbs := keys[(L+s.c)*W:]
			copy(keys, s.draft.K[l])
			copy(kbs, kb[s.row0*W:(s.row0+B)*W])
			cfg.NormRope(kbs, B, cfg.KVHeads, kn, L+s.c)
			copy(vals, s.draft.V[l])
			copy(vals[(L+s.c)*W:], vb[s.row0*W:(s.row0+B)*W])
			copy(qs, q[s.row0*Q:(s.row0+B)*Q])
			cfg.NormRope(qs, B, cfg.Heads, qn, L+s.c)
			cfg.Attend(o[s.row0*Q:(s.row0+B)*Q], qs, B, keys, vals, N)
		}
		return nil
	}, nil
}

// bindConcatCols writes each row's inputs one after another.
func bindConcatCols(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	W := outs[0].Shape[1]
	return func(rc *runCtx) error {
		y := rc.out(outs[0])
		R := rc.rows(outs[0])
		off := 0
		for _, v := range in {
			x, w := rc.in(v), v.Shape[1]
			for r := 0; r < R; r++ {
				copy(y[r*W+off:r*W+off+w], x[r*w:(r+1)*w])
			}
			off += w
		}
		return nil
	}, nil
}
