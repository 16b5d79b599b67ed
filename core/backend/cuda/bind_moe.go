package cuda

import (
	"fmt"

	"github.com/glmflash/glmflash/core/ir"
	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// MoE ops: routing, routed experts grouped by expert, and the plugin op
// that appends an always-selected expert.
func init() {
	bind(ir.OpMoERoute, bindMoERoute)
	bind(ir.OpMoEExperts, bindMoEExperts)
	bind(ir.OpMoEAppendExpert, bindMoEAppendExpert)
}

// moeMaxExperts is MOE_MAX_EXPERTS of moe.cu.
const moeMaxExperts = 1024

func bindMoERoute(p *Program, n *ir.Node) (*kstep, error) {
	in, outs := n.Inputs, n.Outputs
	bias, err := p.w(in[1])
	if err != nil {
		return nil, err
	}
	E := in[0].Shape[1]
	G := ir.AttrGroups.Get(n)
	if E > moeMaxExperts || G > 64 {
		return nil, fmt.Errorf("%d experts in %d groups exceed the kernel's %d experts / 64 groups", E, G, moeMaxExperts)
	}
	norm := int64(0)
	if ir.AttrNormalize.Get(n) {
		norm = 1
	}
	K, TG, scaling := int64(ir.AttrTopK.Get(n)), int64(ir.AttrTopKGroup.Get(n)), float64(float32(ir.AttrScaling.Get(n)))
	return &kstep{run: func(rc *runCtx) error {
		T := rc.rows(in[0])
		args := kc.RouteArgs{Logits: rc.ptr(in[0]), Bias: bias.ptr, BiasBf16: bias.flag(), Idx: rc.ptr(outs[0]), W: rc.ptr(outs[1]),
			T: int64(T), E: int64(E), K: K, G: int64(G), TG: TG, Normalize: norm, Scaling: scaling}
		if G == 1 && K <= routeWarpMaxK { // a warp per token
			return kc.LaunchMoERouteWarp(rc.dev, kc.Dim3{X: uint32((T + routeWarps - 1) / routeWarps)}, kc.Dim3{X: 32 * routeWarps}, 0, &args)
		}
		return kc.LaunchMoERoute(rc.dev, kc.Dim3{X: uint32((T + 63) / 64)}, kc.Dim3{X: 64}, 0, &args)
	}}, nil
}

// routeWarps is ROUTE_WARPS of moe.cu (tokens per block of
// glmf_moe_route_warp), routeWarpMaxK the most experts a token it takes.
const (
	routeWarps    = 8
	routeWarpMaxK = 32
)

// moeTile is the rows of one expert tile (BM of gemm.cu).
const moeTile = 64

func bindMoEExperts(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	gate, err := p.w(in[3])
	if err != nil {
		return nil, err
	}
	up, err := p.w(in[4])
	if err != nil {
		return nil, err
	}
	down, err := p.w(in[5])
	if err != nil {
		return nil, err
	}
	if gate.wtype() != up.wtype() || gate.wtype() != down.wtype() {
		return nil, fmt.Errorf("expert weights mix storage types (gate %d, up %d, down %d: 0 fp32, 1 bf16, 2 fp8)", gate.wtype(), up.wtype(), down.wtype())
	}
	E, I, D := in[3].Shape[0], in[3].Shape[1], in[3].Shape[2]
	if E > moeMaxExperts {
		return nil, fmt.Errorf("%d experts exceed the kernel's %d", E, moeMaxExperts)
	}
	K := in[1].Shape[1]
	limit := float64(float32(ir.AttrLimit.Get(n)))
	round := b2i(p.bf16Mode(gate))
	// gemv: tiles of at most kc.GemvRows rows on the GEMV (glmf_gemv_*)
	// when the routing slots average at most that many per expert (decode),
	// for fp8 experts and in precision bf16; else 64-row tiles on the tiled
	// kernel (bf16/fp32 experts in fp32 precision always: its sums are the
	// ascending-k ones every other kernel gives). In precision bf16 the
	// GEMV is the tensor-core glmf_gemv_mma_* (gemmPolicy.gemv: where K is
	// a multiple of 64 and the rows are aligned; one kernel whatever the
	// tile's rows, so a token's result does not depend on the batch).
	//
	// In precision bf16 (bf16 or fp8 experts) on compute 9.0+, tiles of
	// more rows go to the tensor-core kernel glmf_moe_mma in 128-row tiles
	// (bf16 products summed in fp32; fp8 weights rounded to bf16 as the
	// library GEMMs of precision bf16 take them), on its bf16-activation
	// variant: x cast to bf16 once (a fifth temporary), act kept in bf16
	// (the same roundings as reading fp32 with a_round, half the bytes).
	pol := p.b.gemm
	gemv := func(TK int) bool { return pol.moeGemv(gate.fp8, round, TK, E) }
	mma := func(TK int) bool { return pol.moeMMA(p.b.dev, gate.fp8, round, TK, E) }
	tileRows := func(TK int) int {
		switch {
		case gemv(TK):
			return kc.GemvRows
		case mma(TK):
			return kc.MoEMMARows
		}
		return moeTile
	}
	maxTiles := func(TK int) int { bm := tileRows(TK); return (TK+bm-1)/bm + min(E, TK) }
	return &kstep{
		temps: func(rc *runCtx) []int64 {
			TK := rc.rows(in[0]) * K
			xb := int64(0)
			if mma(TK) {
				xb = 2 * int64(rc.rows(in[0])*D)
			}
			return []int64{4 * int64(TK), 4 * int64(1+3*maxTiles(TK)), 4 * int64(TK*I), 4 * int64(TK*D), xb}
		},
		run: func(rc *runCtx) error {
			T := rc.rows(in[0])
			TK := T * K
			if TK == 0 {
				return nil
			}
			perm, tiles, act, contrib := rc.temps[0], rc.temps[1], rc.temps[2], rc.temps[3]
			pa := kc.PlanArgs{Idx: rc.ptr(in[1]), TK: int64(TK), E: int64(E), Bm: int64(tileRows(TK)), Perm: perm, Tiles: tiles}
			if err := kc.LaunchMoEPlan(rc.dev, kc.Dim3{X: 1}, kc.Dim3{X: 1024}, 0, &pa); err != nil {
				return err
			}
			nt := maxTiles(TK)
			gu := kc.GemmArgs{A: rc.ptr(in[0]), Lda: int64(D), WGoff: int64(I * D), W2: up.ptr,
				M: int64(TK), N: int64(I), K: int64(D), Nout: 1, Tiles: tiles, Perm: perm, ADiv: int64(K), Limit: limit, ARound: round}
			gate.setW(&gu)
			gu.Ws2 = up.scale
			gu.Out[0], gu.Ow[0] = act, int64(I)
			dn := kc.GemmArgs{A: act, Lda: int64(I), WGoff: int64(D * I),
				M: int64(TK), N: int64(D), K: int64(I), Nout: 1, Tiles: tiles, Perm: perm, ADiv: 0, RowScale: rc.ptr(in[2]), Scatter: contrib, ARound: round}
			down.setW(&dn)
			dn.Out[0], dn.Ow[0] = contrib, int64(D)
			if mma(TK) {
				xb := rc.temps[4]
				if err := castBF16(rc.dev, rc.ptr(in[0]), T*D, xb); err != nil {
					return err
				}
				gu.A, gu.ARound, dn.ARound = xb, 2, 2
			}
			for _, g := range []*kc.GemmArgs{&gu, &dn} {
				k, grid, block := kc.KernelGemmTiled, kc.Dim3{X: uint32((g.N + 63) / 64), Y: uint32(nt)}, block256
				switch {
				case gemv(TK):
					// a tile has at most T rows (one slot a token): the SIMT
					// kernel's passes take that many, so it is the row count
					// that decides (gemmPolicy.mmaPays)
					k, grid, block = pol.gemv(g, T, nt, 1)
				case mma(TK):
					k, grid, block = kc.MoEMMALaunch(int(g.N), nt, g.W2 != 0, true)
				}
				if err := k.Launch(rc.dev, grid, block, 0, g); err != nil {
					return err
				}
			}
			ca := kc.CombineArgs{Contrib: contrib, Y: rc.ptr(out), T: int64(T), K: int64(K), D: int64(D)}
			return kc.LaunchMoECombine(rc.dev, blocks(int64(T*D)), block256, 0, &ca)
		}}, nil
}

func bindMoEAppendExpert(p *Program, n *ir.Node) (*kstep, error) {
	in, outs := n.Inputs, n.Outputs
	K := in[0].Shape[1]
	e := int64(ir.AttrExpert.Get(n))
	return &kstep{run: func(rc *runCtx) error {
		T := rc.rows(in[1])
		a := kc.AppendArgs{Idx: rc.ptr(in[0]), W: rc.ptr(in[1]), Oidx: rc.ptr(outs[0]), Ow: rc.ptr(outs[1]), T: int64(T), K: int64(K), Expert: e}
		return kc.LaunchMoEAppendExpert(rc.dev, blocks(int64(T*(K+1))), block256, 0, &a)
	}}, nil
}
