package cpu

import (
	"fmt"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/kernels/mhc"
	"github.com/glmflash/glmflash/kernels/parallel"
)

// mHC ops: pre, post and the fused post+pre.
func init() {
	bind(ir.OpMHCPre, bindMHCPre)
	bind(ir.OpMHCPost, bindMHCPost)
	bind(ir.OpMHCPostPre, bindMHCPostPre)
}

func mhcParams(p *Program, n *ir.Node, x, fn, base, scale *ir.Value) (*mhc.Params, error) {
	prm := &mhc.Params{H: x.Shape[1], D: x.Shape[2], Fn: p.constant(fn), Base: p.constant(base), Scale: p.constant(scale),
		NormEps: float32(ir.AttrEps.Get(n)), HCEps: float32(ir.AttrHCEps.Get(n)), Iterations: ir.AttrIters.Get(n)}
	if prm.Fn == nil || prm.Base == nil || prm.Scale == nil {
		return nil, fmt.Errorf("mHC parameters must be weights")
	}
	return prm, nil
}

func bindMHCPre(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	prm, err := mhcParams(p, n, in[0], in[1], in[2], in[3])
	if err != nil {
		return nil, err
	}
	H, D := prm.H, prm.D
	// The parallel body is made once and reads the run's buffers from
	// these variables (runs are serialized), so a run allocates no closure.
	var X, h, post, comb []float32
	body := func(lo, hi int) {
		mhc.Pre(prm, h[lo*D:hi*D], post[lo*H:hi*H], comb[lo*H*H:hi*H*H], X[lo*H*D:hi*H*D], hi-lo)
	}
	return func(rc *runCtx) error {
		X = rc.in(in[0])
		h, post, comb = rc.out(outs[0]), rc.out(outs[1]), rc.out(outs[2])
		parallel.For(rc.batch.T, 8, body)
		return nil
	}, nil
}

func bindMHCPost(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	H, D := in[1].Shape[1], in[1].Shape[2]
	var o, R, post, comb, x []float32 // the run's buffers (see bindMHCPre)
	body := func(lo, hi int) {
		mhc.Post(x[lo*H*D:hi*H*D], o[lo*D:hi*D], R[lo*H*D:hi*H*D], post[lo*H:hi*H], comb[lo*H*H:hi*H*H], hi-lo, H, D)
	}
	return func(rc *runCtx) error {
		o, R, post, comb = rc.in(in[0]), rc.in(in[1]), rc.in(in[2]), rc.in(in[3])
		x = rc.out(outs[0])
		parallel.For(rc.batch.T, 16, body)
		return nil
	}, nil
}

func bindMHCPostPre(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	prm, err := mhcParams(p, n, in[1], in[4], in[5], in[6])
	if err != nil {
		return nil, err
	}
	H, D := prm.H, prm.D
	var normW []float32
	if len(in) == 8 {
		normW = p.constant(in[7])
	}
	normEps := float32(ir.AttrNormEps.Get(n))
	maxTokens := ir.AttrMaxTokens.Get(n)
	var o, R, post, comb, X, h, post2, comb2 []float32 // the run's buffers (see bindMHCPre)
	var fused bool
	body := func(lo, hi int) {
		args := mhc.PostPreArgs{Out: X[lo*H*D : hi*H*D], H2: h[lo*D : hi*D], Post2: post2[lo*H : hi*H], Comb2: comb2[lo*H*H : hi*H*H],
			O: o[lo*D : hi*D], R: R[lo*H*D : hi*H*D], Post: post[lo*H : hi*H], Comb: comb[lo*H*H : hi*H*H], NormW: normW, NormEps: normEps}
		if fused {
			mhc.PostPre(prm, &args, hi-lo)
		} else {
			mhc.PostPreUnfused(prm, &args, hi-lo)
		}
	}
	return func(rc *runCtx) error {
		o, R, post, comb = rc.in(in[0]), rc.in(in[1]), rc.in(in[2]), rc.in(in[3])
		T := rc.batch.T
		X, h, post2, comb2 = rc.out(outs[0]), rc.out(outs[1]), rc.out(outs[2]), rc.out(outs[3])
		fused = maxTokens == 0 || T <= maxTokens
		if fused {
			rc.p.fusedMHC.Add(1)
		}
		parallel.For(T, 8, body)
		return nil
	}, nil
}
