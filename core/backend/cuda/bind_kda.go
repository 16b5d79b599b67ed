package cuda

import (
	"fmt"
	"math"

	"github.com/glmflash/glmflash/core/ir"
	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// KDA ops: short conv, forget gate, delta-rule attention, gated norm.
func init() {
	bind(ir.OpKDAConv, bindKDAConv)
	bind(ir.OpKDAGate, bindKDAGate)
	bind(ir.OpKDAAttn, bindKDAAttn)
	bind(ir.OpGatedRMSNorm, bindGatedRMSNorm)
}

// kdaMaxConv is KDA_MAX_CONV of kda.cu.
const kdaMaxConv = 8

func bindKDAConv(p *Program, n *ir.Node) (*kstep, error) {
	in, outs := n.Inputs, n.Outputs
	W, err := p.w(in[4])
	if err != nil {
		return nil, err
	}
	P := in[1].Shape[1]
	K := in[4].Shape[2]
	if K < 1 || K > kdaMaxConv {
		return nil, fmt.Errorf("conv kernel size %d outside [1, %d]", K, kdaMaxConv)
	}
	layer := n.Layer
	return &kstep{run: func(rc *runCtx) error {
		ls := rc.store.layer(layer)
		if ls.conv == 0 {
			return fmt.Errorf("layer %d has no KDA state in the store", layer)
		}
		lens, err := rc.lens(in[0])
		if err != nil {
			return err
		}
		a := kc.KDAConvArgs{M: rc.meta, Lens: lens, Q: rc.ptr(in[1]), K: rc.ptr(in[2]), V: rc.ptr(in[3]), W: W.ptr, WBf16: W.flag(),
			Oq: rc.ptr(outs[0]), Ok: rc.ptr(outs[1]), Ov: rc.ptr(outs[2]), State: ls.conv, SlotStride: ls.convStride, P: int64(P), Ksize: int64(K)}
		if ls.snapConv != 0 {
			a.Ckpt, a.Snap, a.SnapStride = rc.ckpt, ls.snapConv, int64(rc.store.depth)*ls.convStride
		}
		g := blocks(int64(3 * P))
		g.Y = uint32(rc.S)
		return kc.LaunchKDAConv(rc.dev, g, block256, 0, &a)
	}}, nil
}

func bindKDAGate(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	A, err := p.w(in[1])
	if err != nil {
		return nil, err
	}
	dt, err := p.w(in[2])
	if err != nil {
		return nil, err
	}
	H := ir.AttrHeads.Get(n)
	P := in[0].Shape[1]
	hasLB, lb := int64(0), 0.0
	if v, ok := ir.AttrLowerBound.Lookup(n); ok {
		hasLB, lb = 1, v
	}
	return &kstep{run: func(rc *runCtx) error {
		args := kc.KDAGateArgs{Z: rc.ptr(in[0]), Alog: A.ptr, AlogBf16: A.flag(), Dt: dt.ptr, DtBf16: dt.flag(), G: rc.ptr(out),
			T: int64(rc.T), H: int64(H), Dh: int64(P / H), HasLb: hasLB, Lb: lb}
		return kc.LaunchKDAGate(rc.dev, blocks(int64(rc.T*P)), block256, 0, &args)
	}}, nil
}

// kdaRegCols (KDA_COLS of kda.cu) is the state columns one block of
// glmf_kda_recurrent_regD owns (kc.KDARecurrentRegKernel: the head_dims D
// whose state it holds in registers).
const kdaRegCols = 32

func bindKDAAttn(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	H, Dh := ir.AttrHeads.Get(n), ir.AttrHeadDim.Get(n)
	if Dh > 1024 {
		return nil, fmt.Errorf("head_dim %d exceeds 1024 threads per block", Dh)
	}
	bs := uint32(32)
	for int(bs) < Dh {
		bs *= 2
	}
	qscale := float64(float32(1 / math.Sqrt(float64(Dh))))
	layer := n.Layer
	return &kstep{run: func(rc *runCtx) error {
		ls := rc.store.layer(layer)
		if ls.state == 0 {
			return fmt.Errorf("layer %d has no KDA state in the store", layer)
		}
		lens, err := rc.lens(in[0])
		if err != nil {
			return err
		}
		args := kc.KDAAttnArgs{M: rc.meta, Lens: lens, Q: rc.ptr(in[1]), K: rc.ptr(in[2]), V: rc.ptr(in[3]), G: rc.ptr(in[4]), Beta: rc.ptr(in[5]),
			O: rc.ptr(out), State: ls.state, SlotStride: ls.stateStride, H: int64(H), Dh: int64(Dh), Qscale: qscale}
		if ls.snapState != 0 {
			args.Ckpt, args.Snap, args.SnapStride = rc.ckpt, ls.snapState, int64(rc.store.depth)*ls.stateStride
		}
		if k, ok := kc.KDARecurrentRegKernel(Dh); ok { // the state in registers, columns split across blocks
			return k.Launch(rc.dev, kc.Dim3{X: uint32(H), Y: uint32(rc.S), Z: uint32((Dh + kdaRegCols - 1) / kdaRegCols)}, kc.Dim3{X: kdaRegCols}, 0, &args)
		}
		return kc.LaunchKDARecurrent(rc.dev, kc.Dim3{X: uint32(H), Y: uint32(rc.S)}, kc.Dim3{X: bs}, 3*4*Dh, &args)
	}}, nil
}

func bindGatedRMSNorm(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	W, err := p.w(in[2])
	if err != nil {
		return nil, err
	}
	H := ir.AttrHeads.Get(n)
	P := in[0].Shape[1]
	eps := float64(float32(ir.AttrEps.Get(n)))
	return &kstep{run: func(rc *runCtx) error {
		args := kc.GatedNormArgs{O: rc.ptr(in[0]), G: rc.ptr(in[1]), W: W.ptr, WBf16: W.flag(), Y: rc.ptr(out), Rows: int64(rc.T * H), Dh: int64(P / H), Eps: eps}
		return kc.LaunchGatedRmsnorm(rc.dev, kc.Dim3{X: uint32(rc.T * H)}, kc.Dim3{X: 128}, 0, &args)
	}}, nil
}
