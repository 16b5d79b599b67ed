package cpu

import (
	"fmt"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/kernels/moe"
)

// MoE ops: routing, routed experts and the plugin op that appends an
// always-selected expert.
func init() {
	bind(ir.OpMoERoute, bindMoERoute)
	bind(ir.OpMoEExperts, bindMoEExperts)
	bind(ir.OpMoEAppendExpert, bindMoEAppendExpert)
}

func bindMoERoute(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	r := &moe.Router{Experts: in[0].Shape[1], TopK: ir.AttrTopK.Get(n), Groups: ir.AttrGroups.Get(n), TopKGroup: ir.AttrTopKGroup.Get(n),
		Normalize: ir.AttrNormalize.Get(n), Scaling: float32(ir.AttrScaling.Get(n)), Bias: p.constant(in[1])}
	return func(rc *runCtx) error {
		T := rc.rows(in[0])
		idx, w := rc.outI(outs[0]), rc.out(outs[1])
		r.RouteWith(&rc.p.moeWS, idx, w, rc.in(in[0]), T)
		return nil
	}, nil
}

func bindMoEExperts(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	E, I, D := in[3].Shape[0], in[3].Shape[1], in[3].Shape[2]
	ex := &moe.Experts{N: E, D: D, I: I, Limit: float32(ir.AttrLimit.Get(n)), BF16Act: p.bf16Act()}
	var bf [3][][]uint16
	var f [3][]float32
	var f8 [3][]*gemm.FP8
	for i := range 3 {
		b, err := p.stackedWeight(in[3+i])
		if err != nil {
			return nil, fmt.Errorf("moe_experts: %w", err)
		}
		bf[i], f[i], f8[i] = b.parts, b.f, b.fp8
	}
	switch {
	case f8[0] != nil && f8[1] != nil && f8[2] != nil:
		ex.GateF8, ex.UpF8, ex.DownF8 = f8[0], f8[1], f8[2]
	case bf[0] != nil && bf[1] != nil && bf[2] != nil:
		ex.GateB, ex.UpB, ex.DownB = bf[0], bf[1], bf[2]
	default:
		// not all bf16: every projection in float32, as one kernel path
		for i := range 3 {
			if f[i] == nil {
				var err error
				if f[i], err = p.w.float32(p.plan, in[3+i]); err != nil {
					return nil, fmt.Errorf("moe_experts: %w", err)
				}
			}
		}
		for e := 0; e < E; e++ {
			ex.Gate = append(ex.Gate, f[0][e*I*D:(e+1)*I*D])
			ex.Up = append(ex.Up, f[1][e*I*D:(e+1)*I*D])
			ex.Down = append(ex.Down, f[2][e*D*I:(e+1)*D*I])
		}
	}
	K := in[1].Shape[1]
	return func(rc *runCtx) error {
		T := rc.rows(in[0])
		ex.ForwardWith(&rc.p.moeWS, rc.out(outs[0]), rc.in(in[0]), rc.i[in[1]], rc.in(in[2]), T, K)
		return nil
	}, nil
}

// bindMoEAppendExpert binds moe_append_expert: every token's routing gets
// one more expert (attr expert) with weight 1.0, after its routed ones. The
// router sorts a token's experts ascending and the appended id is the
// largest, so moe_experts still adds contributions in ascending expert order.
func bindMoEAppendExpert(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs := n.Inputs, n.Outputs
	K := in[0].Shape[1]
	e := int32(ir.AttrExpert.Get(n))
	return func(rc *runCtx) error {
		T := rc.rows(in[1])
		idx, w := rc.i[in[0]], rc.in(in[1])
		oi, ow := rc.outI(outs[0]), rc.out(outs[1])
		for t := 0; t < T; t++ {
			copy(oi[t*(K+1):t*(K+1)+K], idx[t*K:(t+1)*K])
			copy(ow[t*(K+1):t*(K+1)+K], w[t*K:(t+1)*K])
			oi[t*(K+1)+K] = e
			ow[t*(K+1)+K] = 1
		}
		return nil
	}, nil
}
