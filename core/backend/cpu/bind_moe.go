package cpu

import (
	"github.com/glmflash/glmflash/core/ir"
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
	in, outs, a := n.Inputs, n.Outputs, n.Attrs
	r := &moe.Router{Experts: in[0].Shape[1], TopK: a.Int("topk", 0), Groups: a.Int("groups", 1), TopKGroup: a.Int("topk_group", 1),
		Normalize: a.Bool("normalize"), Scaling: float32(a.Float("scaling", 1)), Bias: p.constant(in[1])}
	return func(rc *runCtx) error {
		T := rc.rows(in[0])
		idx, w := rc.outI(outs[0]), rc.out(outs[1])
		r.Route(idx, w, rc.in(in[0]), T)
		return nil
	}, nil
}

func bindMoEExperts(p *Program, n *ir.Node) (func(rc *runCtx) error, error) {
	in, outs, a := n.Inputs, n.Outputs, n.Attrs
	g, u, d := p.constant(in[3]), p.constant(in[4]), p.constant(in[5])
	E, I, D := in[3].Shape[0], in[3].Shape[1], in[3].Shape[2]
	ex := &moe.Experts{N: E, D: D, I: I, Limit: float32(a.Float("limit", 0))}
	gb, ub, db := p.bf16(in[3]), p.bf16(in[4]), p.bf16(in[5])
	for e := 0; e < E; e++ {
		if gb != nil && ub != nil && db != nil {
			ex.GateB = append(ex.GateB, gb[e*I*D:(e+1)*I*D])
			ex.UpB = append(ex.UpB, ub[e*I*D:(e+1)*I*D])
			ex.DownB = append(ex.DownB, db[e*D*I:(e+1)*D*I])
			continue
		}
		ex.Gate = append(ex.Gate, g[e*I*D:(e+1)*I*D])
		ex.Up = append(ex.Up, u[e*I*D:(e+1)*I*D])
		ex.Down = append(ex.Down, d[e*D*I:(e+1)*D*I])
	}
	K := in[1].Shape[1]
	return func(rc *runCtx) error {
		T := rc.rows(in[0])
		ex.Forward(rc.out(outs[0]), rc.in(in[0]), rc.i[in[1]], rc.in(in[2]), T, K)
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
	e := int32(n.Attrs.Int("expert", 0))
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
