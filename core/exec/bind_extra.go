package exec

import "github.com/glmflash/glmflash/core/ir"

// bindMoEAppendExpert binds moe_append_expert: every token's routing gets
// one more expert (attr expert) with weight 1.0, after its routed ones. The
// router sorts a token's experts ascending and the appended id is the
// largest, so moe_experts still adds contributions in ascending expert order.
func (p *Program) bindMoEAppendExpert(n *ir.Node) (func(rc *runCtx) error, error) {
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
