package cpu

import (
	"fmt"
	"math"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/kernels/indexer"
	"github.com/glmflash/glmflash/kernels/mla"
)

// DSA ops: lengths, per-batch metadata, the k-pool indexer and sparse MLA.
func init() {
	bind(ir.OpSeqLengths, bindSeqLengths)
	bind(ir.OpDSAMeta, bindDSAMeta)
	bind(ir.OpDSATopK, bindDSATopK)
	bind(ir.OpMLAAttn, bindMLA)
}

func bindSeqLengths(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	outs := n.Outputs
	return func(rc *runCtx) error {
		l := rc.outI(outs[0])
		for i, s := range rc.batch.seqs {
			l[i] = int32(s.n)
			if rc.p.poisonLengths {
				l[i] = int32(s.n + 1 + i)
			}
		}
		return nil
	}, nil
}

func bindDSAMeta(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	kp, topk := ir.AttrKPool.Get(n), ir.AttrTopK.Get(n)
	m := &dsaMeta{kpool: kp, topk: topk} // rebuilt by every run (runs are serialized)
	return func(rc *runCtx) error {
		seqs, err := rc.spans(in[0])
		if err != nil {
			return err
		}
		m.seqs = seqs
		if cap(m.visible) < rc.batch.T {
			m.visible = make([]int, rc.batch.T)
		}
		m.visible = m.visible[:rc.batch.T]
		m.keyLen, m.closed = m.keyLen[:0], m.closed[:0]
		for _, s := range seqs {
			for j := 0; j < s.n; j++ {
				m.visible[s.row0+j] = (s.pos0 + j + 1) / kp
			}
			m.keyLen = append(m.keyLen, s.pos0+s.n)
			m.closed = append(m.closed, (s.pos0+s.n)/kp-s.pos0/kp)
		}
		rc.host[outs[0]] = m
		return nil
	}, nil
}

func bindDSATopK(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	cfg := &indexer.Config{Heads: ir.AttrHeads.Get(n), Dim: ir.AttrDim.Get(n), KPool: ir.AttrKPool.Get(n), TopK: ir.AttrTopK.Get(n), SelectTail: ir.AttrTail.Get(n), APE: p.constant(in[5])}
	if cfg.APE == nil {
		return nil, fmt.Errorf("compress ape must be a weight")
	}
	layer := n.Layer
	Hi, Di := cfg.Heads, cfg.Dim
	W := outs[0].Shape[1] // the selection width (wider when it reuses a shared selection)
	share := ir.AttrShare.Get(n)
	wscale := float32(1 / math.Sqrt(float64(Hi)))
	return func(rc *runCtx) error {
		meta, ok := rc.host[in[0]].(*dsaMeta)
		if !ok || meta.kpool != cfg.KPool {
			return fmt.Errorf("metadata input does not match kpool %d", cfg.KPool)
		}
		q, k, g, w := rc.in(in[1]), rc.in(in[2]), rc.in(in[3]), rc.in(in[4])
		sel := rc.outI(outs[0])
		for _, s := range meta.seqs {
			st, err := s.seq.Indexer(layer)
			if err != nil {
				return fmt.Errorf("slot %d: %w", s.slot, err)
			}
			r0, r1 := s.row0, s.row0+s.n
			vis := meta.visible[r0:r1]
			if rb := s.seq.Rollback; rb != nil {
				rb.RecordIndexer(layer, s.pos0, k[r0*Di:r1*Di], g[r0*Di:r1*Di])
			}
			if err := cfg.Append(st, s.pos0, k[r0*Di:r1*Di], g[r0*Di:r1*Di], s.n, nil); err != nil { // visibility comes from the metadata
				return fmt.Errorf("slot %d: %w", s.slot, err)
			}
			if share == ir.IndexShareReuse {
				if err := indexer.SelectShared(sel[r0*W:r1*W], W, st, s.pos0, s.n); err != nil {
					return fmt.Errorf("slot %d: %w", s.slot, err)
				}
				continue
			}
			ws := takeScratch(&rc.p.topkW, s.n*Hi)
			for i := range ws {
				ws[i] = w[r0*Hi+i] * wscale
			}
			cfg.Select(sel[r0*W:r1*W], st, s.pos0, q[r0*Hi*Di:r1*Hi*Di], ws, s.n, vis)
			if share == ir.IndexShareSave {
				st.SaveShare(sel[(r1-1)*W:r1*W], s.pos0+s.n-1)
			}
		}
		return nil
	}, nil
}

func bindMLA(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	c := &mla.Config{Heads: ir.AttrHeads.Get(n), QKDim: ir.AttrQKDim.Get(n), VDim: ir.AttrVDim.Get(n), Rank: ir.AttrRank.Get(n),
		Scale: float32(ir.AttrScale.Get(n)), KVBW: p.constant(in[3]), Params: gemm.Default()}
	if c.KVBW == nil {
		return nil, fmt.Errorf("kv_b weight must be a weight")
	}
	layer := n.Layer
	H, dq, dv, R := c.Heads, c.QKDim, c.VDim, c.Rank
	width := in[4].Shape[1]
	return func(rc *runCtx) error {
		meta, ok := rc.host[in[0]].(*dsaMeta)
		if !ok {
			return fmt.Errorf("metadata input is not DSA metadata")
		}
		q, ckv := rc.in(in[1]), rc.in(in[2])
		sel := rc.i[in[4]]
		o := rc.out(outs[0])
		for _, s := range meta.seqs {
			r0, r1 := s.row0, s.row0+s.n
			lat, err := s.seq.Latents(layer)
			if err != nil {
				return fmt.Errorf("slot %d: %w", s.slot, err)
			}
			// the new rows at their positions, in the sequence's pages
			// (taken before the run)
			if err := lat.Write(s.pos0, ckv[r0*R:r1*R]); err != nil {
				return fmt.Errorf("slot %d: %w", s.slot, err)
			}
			lat.Len = s.pos0 + s.n
			c.AttendPaged(&rc.p.mlaWS, o[r0*H*dv:r1*H*dv], q[r0*H*dq:r1*H*dq], lat, sel[r0*width:r1*width], s.n, width)
		}
		return nil
	}, nil
}
