package cuda

import (
	"fmt"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/sample"
	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// Dense ops: embedding, norms, GEMMs, elementwise ops and row selection.
func init() {
	bind(ir.OpEmbed, bindEmbed)
	bind(ir.OpRMSNorm, bindRMSNorm)
	bind(ir.OpLayerNorm, bindLayerNorm)
	bind(ir.OpLinear, bindLinear)
	bind(ir.OpLinearSplit, bindLinearSplit)
	bind(ir.OpLinearBatched, bindLinearBatched)
	bind(ir.OpSigmoid, bindElementwise(0))
	bind(ir.OpAdd, bindElementwise(1))
	bind(ir.OpSwiGLU, bindElementwise(2))
	bind(ir.OpSwiGLUPacked, bindSwiGLUPacked)
	bind(ir.OpStreamMean, bindStreamMean)
	bind(ir.OpLastRows, bindLastRows)
	bind(ir.OpSpanRows, bindSpanRows)
}

const threads = 256

// blocks is the number of 256-thread blocks covering n elements.
func blocks(n int64) kc.Dim3 { return kc.Dim3{X: uint32((n + threads - 1) / threads)} }

var block256 = kc.Dim3{X: threads}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func sampleTop(id int64, lp float64) sample.TokenLogprob {
	return sample.TokenLogprob{ID: int32(id), Logprob: float32(lp)}
}

func bindEmbed(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	if v0 := ir.AttrVocabStart.Get(n); v0 != 0 {
		return nil, fmt.Errorf("embedding: a vocabulary shard (vocab_start %d) is not implemented on the cuda backend yet", v0)
	}
	W, err := p.w(in[1])
	if err != nil {
		return nil, err
	}
	H, D := 1, out.Shape[1]  // plain rows [T,D]
	if len(out.Shape) == 3 { // streams [T,H,D]
		H, D = out.Shape[1], out.Shape[2]
	}
	return &kstep{run: func(rc *runCtx) error {
		a := kc.EmbedArgs{Ids: rc.ptr(in[0]), W: W.ptr, WBf16: W.flag(), Out: rc.ptr(out), T: int64(rc.T), H: int64(H), D: int64(D)}
		return kc.LaunchEmbed(rc.dev, blocks(int64(rc.T*D)), block256, 0, &a)
	}}, nil
}

func bindRMSNorm(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	W, err := p.w(in[1])
	if err != nil {
		return nil, err
	}
	D := in[0].Shape[1]
	eps := ir.AttrEps.Get(n)
	return &kstep{run: func(rc *runCtx) error {
		R := rc.rows(in[0])
		a := kc.NormArgs{X: rc.ptr(in[0]), W: W.ptr, WBf16: W.flag(), Y: rc.ptr(out), Rows: int64(R), D: int64(D), Eps: float64(float32(eps))}
		return kc.LaunchRmsnorm(rc.dev, kc.Dim3{X: uint32(R)}, block256, 0, &a)
	}}, nil
}

func bindLayerNorm(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	W, err := p.w(in[1])
	if err != nil {
		return nil, err
	}
	B, err := p.w(in[2])
	if err != nil {
		return nil, err
	}
	D := in[0].Shape[1]
	eps := ir.AttrEps.Get(n)
	return &kstep{run: func(rc *runCtx) error {
		R := rc.rows(in[0])
		a := kc.NormArgs{X: rc.ptr(in[0]), W: W.ptr, WBf16: W.flag(), B: B.ptr, BBf16: B.flag(), Y: rc.ptr(out), Rows: int64(R), D: int64(D), Eps: float64(float32(eps))}
		return kc.LaunchLayernorm(rc.dev, kc.Dim3{X: uint32(R)}, block256, 0, &a)
	}}, nil
}

// bf16Mode says whether GEMMs take bf16 activations (precision bf16):
// their inputs are rounded to bfloat16, large batches run on cuBLAS's
// tensor-core bf16 GEMM with fp32 accumulation, small ones on the skinny
// kernel rounding as it reads.
func (p *Program) bf16Mode(W devTensor) bool {
	return p.b.opts.Precision == "bf16" && (W.bf16 || W.fp8)
}

// dequantBF16 writes the bf16 (nearest) of fp8 weight W's dequantized
// values, all its matrices, at dst (the library GEMMs' weight in precision
// bf16).
func dequantBF16(dev *kc.Device, W devTensor, dst kc.DevicePtr) error {
	n := W.rows * W.cols
	for m := int64(0); m < W.matrixCount; m++ {
		a := kc.FP8ToBF16Args{W: W.ptr + kc.DevicePtr(m*n), Ws: W.scale + kc.DevicePtr(4*m*W.sgoff), WsLd: W.sld, N: W.rows, K: W.cols, Out: dst + kc.DevicePtr(2*m*n)}
		k, work := kc.KernelFP8ToBF16, n
		if W.cols%16 == 0 && a.W%16 == 0 && a.Out%16 == 0 { // 16 codes a thread
			k, work = kc.KernelFP8ToBF16V16, n/16
		}
		if err := k.Launch(dev, blocks(work), block256, 0, &a); err != nil {
			return err
		}
	}
	return nil
}

// libWeight is the weight pointer a library GEMM reads: W's own (bf16 or
// fp32), or its bf16 dequantization into tmp() for fp8 (2·n bytes; asked
// for only then: only fp8 GEMMs have that temporary).
func libWeight(dev *kc.Device, W devTensor, tmp func() kc.DevicePtr) (kc.DevicePtr, error) {
	if !W.fp8 {
		return W.ptr, nil
	}
	t := tmp()
	return t, dequantBF16(dev, W, t)
}

// libOperands are a library GEMM's inputs: the n activations at A, rounded
// to bf16 into temporary abf in precision bf16, and W's pointer, an fp8
// weight's bf16 dequantization into temporary wtmp (asked for only then:
// only fp8 GEMMs have that temporary).
func libOperands(rc *runCtx, bf bool, A kc.DevicePtr, n, abf int, W devTensor, wtmp int) (kc.DevicePtr, kc.DevicePtr, error) {
	if bf {
		if err := castBF16(rc.dev, A, n, rc.temps[abf]); err != nil {
			return 0, 0, err
		}
		A = rc.temps[abf]
	}
	Wp, err := libWeight(rc.dev, W, func() kc.DevicePtr { return rc.temps[wtmp] })
	return A, Wp, err
}

// libWeightTemp is the bytes of the bf16 copy a library GEMM of M rows
// needs of fp8 weight W (0 when it runs on W as stored).
func (g *gemmPolicy) libWeightTemp(W devTensor, kind string, M int) int64 {
	if !W.fp8 || !g.plan(kind, M).lib {
		return 0
	}
	return 2 * W.n
}

// castBF16 rounds n contiguous floats at x to bf16 at dst.
func castBF16(dev *kc.Device, x kc.DevicePtr, n int, dst kc.DevicePtr) error {
	a := kc.ToBF16Args{X: x, Out: dst, N: int64(n)}
	return kc.LaunchToBF16(dev, blocks(int64(n)), block256, 0, &a)
}

// skinnyMaxRows is the most rows the kernels for few rows take
// (kc.GemmLaunch: the column and skinny kernels); more rows go to the tiled
// kernel. All three sum in ascending k, so the choice (and so the batch's
// size) never changes a row's result. cuBLAS, used for fp32 weights on more
// rows, does not promise that: batch invariance holds for bf16 weights.
const skinnyMaxRows = kc.SkinnyMaxRows

// gateUpDual is how a linear whose output feeds only a swiglu_packed (the
// mlp-gate-up-fusion pass's form: W's first I rows are the gate's, the last
// I the up's) runs where its GEMM is the SIMT GEMV (decode): as one dual
// GEMV with SwiGLU in its epilogue (glmf_gemv's W2 mode, as the MoE
// experts'), gate and up streamed in one launch and no split or elementwise
// kernel. Its [M, I] result lands in the linear's output buffer (row
// stride I), which the swiglu_packed step copies to its output. The bits
// are the unfused kernels': each column sums as in the single GEMV, and the
// epilogue is the elementwise kernel's swiglu_clamped.
type gateUpDual struct {
	pol   *gemmPolicy
	W     devTensor
	kind  string
	tuned *tunedGEMM
	I, K  int
	bf    bool
	limit float64
}

// gateUpDualOf is lin's dual form, nil where it has none (not a linear
// feeding one swiglu_packed; fp32 weights; fp8 weights whose up half does
// not start a block of scales: the pass's concatenation of the gate's and
// the up's fp8 matrices keeps each one's scales). The linear's step and
// its swiglu_packed's share the one value (p.gateUps), so they cannot
// disagree on whether it runs.
func (p *Program) gateUpDualOf(lin *ir.Node) (*gateUpDual, error) {
	if lin == nil || lin.Op != ir.OpLinear {
		return nil, nil
	}
	if d, ok := p.gateUps[lin]; ok {
		return d, nil
	}
	d, err := p.newGateUpDual(lin)
	if err != nil {
		return nil, err
	}
	p.gateUps[lin] = d
	return d, nil
}

func (p *Program) newGateUpDual(lin *ir.Node) (*gateUpDual, error) {
	users := p.plan.Graph.Users(lin.Outputs[0])
	if len(users) != 1 || users[0].Op != ir.OpSwiGLUPacked {
		return nil, nil
	}
	W, err := p.w(lin.Inputs[1])
	if err != nil {
		return nil, err
	}
	I := lin.Outputs[0].Shape[1] / 2
	upScales := W.matrixCount == 2 && W.rows == int64(I) || W.matrixCount == 1 && I%128 == 0 // the up half's scales start a row block
	if W.wtype() == 0 || W.fp8 && !upScales {
		return nil, nil
	}
	tuned, err := p.tuning(lin, W)
	if err != nil {
		return nil, err
	}
	return &gateUpDual{pol: p.b.gemm, W: W, kind: p.gemmKind(W), tuned: tuned, I: I, K: lin.Inputs[0].Shape[1], bf: p.bf16Mode(W),
		limit: ir.AttrLimit.Get(users[0])}, nil
}

// runs says whether the dual GEMV runs at M rows: where the linear would
// run the SIMT GEMV (its epilogue takes all M rows in one pass), not the
// library or the tensor-core GEMV.
func (d *gateUpDual) runs(M int) bool {
	pl := d.pol.planTuned(d.tuned, d.kind, M)
	return !pl.lib && pl.ch.kind == chGemv && M >= 1 && M <= kc.GemvRows && !d.pol.mmaPays(d.W.wtype(), M)
}

// args are the dual GEMV's arguments for M rows of x into out.
func (d *gateUpDual) args(M int, x, out kc.DevicePtr) kc.GemmArgs {
	a := kc.GemmArgs{A: x, Lda: int64(d.K), M: int64(M), N: int64(d.I), K: int64(d.K), Nout: 1, ARound: b2i(d.bf),
		Limit: float64(float32(d.limit))}
	d.W.setW(&a)
	wsz := int64(2)
	if d.W.fp8 {
		wsz = 1
		if d.W.matrixCount == 2 { // the up matrix's own scales
			a.Ws2, a.WsGoff = a.Ws+kc.DevicePtr(4*d.W.sgoff), 0
		} else {
			a.Ws2 = a.Ws + kc.DevicePtr(4*int64(d.I/128)*a.WsLd)
		}
	}
	a.W2 = a.W + kc.DevicePtr(int64(d.I)*int64(d.K)*wsz)
	a.Out[0], a.Ow[0] = out, int64(d.I)
	return a
}

func bindLinear(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	W, err := p.w(in[1])
	if err != nil {
		return nil, err
	}
	K, N := in[0].Shape[1], out.Shape[1]
	bf := p.bf16Mode(W)
	kind := p.gemmKind(W)
	tuned, err := p.tuning(n, W)
	if err != nil {
		return nil, err
	}
	dual, err := p.gateUpDualOf(n)
	if err != nil {
		return nil, err
	}
	st := &kstep{}
	if bf {
		st.temps = func(rc *runCtx) []int64 {
			return []int64{2 * int64(rc.rows(in[0])*K), p.b.gemm.libWeightTemp(W, kind, rc.rows(in[0]))}
		}
	}
	st.run = func(rc *runCtx) error {
		M := rc.rows(in[0])
		if dual != nil && dual.runs(M) {
			a := dual.args(M, rc.ptr(in[0]), rc.ptr(out))
			k, grid, block := p.b.gemm.simt(&a, M, 1, 1)
			return k.Launch(rc.dev, grid, block, 0, &a)
		}
		pl := p.b.gemm.planTuned(tuned, kind, M)
		if pl.lib {
			A, Wp, err := libOperands(rc, bf, rc.ptr(in[0]), M*K, 0, W, 1)
			if err != nil {
				return err
			}
			return libGemm(rc.dev, pl.ch, bf, M, N, K, A, K, Wp, rc.ptr(out), N)
		}
		a := kc.GemmArgs{A: rc.ptr(in[0]), Lda: int64(K), M: int64(M), N: int64(N), K: int64(K), Nout: 1, ARound: b2i(bf)}
		W.setW(&a)
		a.Out[0], a.Ow[0] = rc.ptr(out), int64(N)
		return p.b.gemm.launchOwn(rc.dev, &a, 1, pl.ch)
	}
	return st, nil
}

func bindLinearSplit(p *Program, n *ir.Node) (*kstep, error) {
	in, outs := n.Inputs, n.Outputs
	W, err := p.w(in[1])
	if err != nil {
		return nil, err
	}
	K, N := in[0].Shape[1], in[1].Shape[0]
	splits := ir.AttrSplits.Get(n)
	if len(splits) > 8 {
		return nil, fmt.Errorf("%d splits; the CUDA kernels write at most 8", len(splits))
	}
	bf := p.bf16Mode(W)
	kind := p.gemmKind(W)
	tuned, err := p.tuning(n, W)
	if err != nil {
		return nil, err
	}
	st := &kstep{}
	if kind != kindF32BF16W && kind != kindF32FP8W { // the library writes one matrix, split afterwards
		st.temps = func(rc *runCtx) []int64 {
			M := int64(rc.rows(in[0]))
			return []int64{4 * M * int64(N), 2 * M * int64(K), p.b.gemm.libWeightTemp(W, kind, int(M))}
		}
	}
	st.run = func(rc *runCtx) error {
		M := rc.rows(in[0])
		a := kc.GemmArgs{A: rc.ptr(in[0]), Lda: int64(K), M: int64(M), N: int64(N), K: int64(K), Nout: int64(len(splits)), ARound: b2i(bf)}
		W.setW(&a)
		for i, s := range splits {
			a.Out[i], a.Ow[i] = rc.ptr(outs[i]), int64(s)
		}
		pl := p.b.gemm.planTuned(tuned, kind, M)
		if !pl.lib {
			return p.b.gemm.launchOwn(rc.dev, &a, 1, pl.ch)
		}
		tmp := rc.temps[0]
		A, Wp, err := libOperands(rc, bf, rc.ptr(in[0]), M*K, 1, W, 2)
		if err != nil {
			return err
		}
		if err := libGemm(rc.dev, pl.ch, bf, M, N, K, A, K, Wp, tmp, N); err != nil {
			return err
		}
		sa := kc.SplitArgs{X: tmp, R: int64(M), N: int64(N), Nout: a.Nout, Out: a.Out, W: a.Ow}
		return kc.LaunchSplitCols(rc.dev, blocks(int64(M*N)), block256, 0, &sa)
	}
	return st, nil
}

func bindLinearBatched(p *Program, n *ir.Node) (*kstep, error) {
	in, outs := n.Inputs, n.Outputs
	W, err := p.w(in[1])
	if err != nil {
		return nil, err
	}
	G, N, K := in[1].Shape[0], in[1].Shape[1], in[1].Shape[2]
	if G > 8 {
		return nil, fmt.Errorf("%d groups; the CUDA kernels write at most 8", G)
	}
	bf := p.bf16Mode(W)
	kind := p.gemmKind(W)
	tuned, err := p.tuning(n, W)
	if err != nil {
		return nil, err
	}
	st := &kstep{}
	if bf {
		st.temps = func(rc *runCtx) []int64 {
			return []int64{2 * int64(rc.rows(in[0])*G*K), p.b.gemm.libWeightTemp(W, kind, rc.rows(in[0]))}
		}
	}
	st.run = func(rc *runCtx) error {
		M := rc.rows(in[0])
		pl := p.b.gemm.planTuned(tuned, kind, M)
		if pl.lib {
			esz, wsz := 4, 4
			if bf {
				esz = 2
			}
			if W.bf16 || W.fp8 { // fp8: dequantized to bf16
				wsz = 2
			}
			A, Wp, err := libOperands(rc, bf, rc.ptr(in[0]), M*G*K, 0, W, 1)
			if err != nil {
				return err
			}
			for g := 0; g < G; g++ {
				if err := libGemm(rc.dev, pl.ch, bf, M, N, K, A+kc.DevicePtr(esz*g*K), G*K, Wp+kc.DevicePtr(wsz*g*N*K), rc.ptr(outs[g]), N); err != nil {
					return err
				}
			}
			return nil
		}
		a := kc.GemmArgs{A: rc.ptr(in[0]), Lda: int64(G * K), AGoff: int64(K), WGoff: int64(N * K),
			M: int64(M), N: int64(N), K: int64(K), Nout: int64(G), Batched: 1, ARound: b2i(bf)}
		W.setW(&a)
		for g := 0; g < G; g++ {
			a.Out[g], a.Ow[g] = rc.ptr(outs[g]), int64(N)
		}
		return p.b.gemm.launchOwn(rc.dev, &a, G, pl.ch)
	}
	return st, nil
}

func bindElementwise(op int64) binder {
	return func(p *Program, n *ir.Node) (*kstep, error) {
		in, out := n.Inputs, n.Outputs[0]
		limit := 0.0 // swiglu's clamp (sigmoid and add have none)
		if n.Op == ir.OpSwiGLU {
			limit = ir.AttrLimit.Get(n)
		}
		return &kstep{run: func(rc *runCtx) error {
			cnt := rc.bytesOf(out) / 4
			a := kc.EltArgs{X: rc.ptr(in[0]), Out: rc.ptr(out), N: cnt, Op: op, Limit: float64(float32(limit))}
			if len(in) > 1 {
				a.Y = rc.ptr(in[1])
			}
			return kc.LaunchElementwise(rc.dev, blocks(cnt), block256, 0, &a)
		}}, nil
	}
}

// bindSwiGLUPacked splits the packed [T,2I] input into g and u (the
// split_cols kernel) and applies the swiglu kernel to them; where its
// producer ran as a dual GEMV (gateUpDual), it copies that result.
func bindSwiGLUPacked(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs[0], n.Outputs[0]
	I := int64(out.Shape[1])
	limit := ir.AttrLimit.Get(n)
	dual, err := p.gateUpDualOf(in.Producer)
	if err != nil {
		return nil, err
	}
	st := &kstep{temps: func(rc *runCtx) []int64 {
		b := 4 * int64(rc.rows(in)) * I
		return []int64{b, b}
	}}
	st.run = func(rc *runCtx) error {
		R := int64(rc.rows(in))
		if R == 0 {
			return nil
		}
		if dual != nil && dual.runs(int(R)) {
			return rc.dev.Copy(rc.ptr(out), rc.ptr(in), 4*R*I)
		}
		g, u := rc.temps[0], rc.temps[1]
		sa := kc.SplitArgs{X: rc.ptr(in), R: R, N: 2 * I, Nout: 2}
		sa.Out[0], sa.W[0], sa.Out[1], sa.W[1] = g, I, u, I
		if err := kc.LaunchSplitCols(rc.dev, blocks(2*R*I), block256, 0, &sa); err != nil {
			return err
		}
		a := kc.EltArgs{X: g, Y: u, Out: rc.ptr(out), N: R * I, Op: 2, Limit: float64(float32(limit))}
		return kc.LaunchElementwise(rc.dev, blocks(R*I), block256, 0, &a)
	}
	return st, nil
}

func bindStreamMean(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	H, D := in[0].Shape[1], in[0].Shape[2]
	return &kstep{run: func(rc *runCtx) error {
		a := kc.StreamMeanArgs{X: rc.ptr(in[0]), Y: rc.ptr(out), T: int64(rc.T), H: int64(H), D: int64(D)}
		return kc.LaunchStreamMean(rc.dev, blocks(int64(rc.T*D)), block256, 0, &a)
	}}, nil
}

func bindLastRows(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	D := in[1].Shape[1]
	return &kstep{run: func(rc *runCtx) error {
		a := kc.GatherArgs{X: rc.ptr(in[1]), Rows: rc.meta.LastRow, Y: rc.ptr(out), R: int64(rc.S), D: int64(D)}
		return kc.LaunchGatherRows(rc.dev, blocks(int64(rc.S*D)), block256, 0, &a)
	}}, nil
}

// bindSpanRows gathers each sequence's last rows (its span's Rows of them).
func bindSpanRows(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	D := in[1].Shape[1]
	return &kstep{run: func(rc *runCtx) error {
		a := kc.GatherArgs{X: rc.ptr(in[1]), Rows: rc.spanRows, Y: rc.ptr(out), R: int64(rc.R), D: int64(D)}
		return kc.LaunchGatherRows(rc.dev, blocks(int64(rc.R*D)), block256, 0, &a)
	}}, nil
}
