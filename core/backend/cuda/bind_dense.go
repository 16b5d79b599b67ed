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
	bind(ir.OpStreamMean, bindStreamMean)
	bind(ir.OpLastRows, bindLastRows)
}

const threads = 256

// blocks is the number of 256-thread blocks covering n elements.
func blocks(n int64) kc.Dim3 { return kc.Dim3{X: uint32((n + threads - 1) / threads)} }

var block256 = kc.Dim3{X: threads}

func sampleTop(id int64, lp float64) sample.TokenLogprob {
	return sample.TokenLogprob{ID: int32(id), Logprob: float32(lp)}
}

func bindEmbed(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
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
		return kc.Launch(rc.dev, "glmf_embed", blocks(int64(rc.T*D)), block256, 0, &a)
	}}, nil
}

func bindRMSNorm(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	W, err := p.w(in[1])
	if err != nil {
		return nil, err
	}
	D := in[0].Shape[1]
	eps := n.Attrs.Float("eps", 1e-5)
	return &kstep{run: func(rc *runCtx) error {
		R := rc.rows(in[0])
		a := kc.NormArgs{X: rc.ptr(in[0]), W: W.ptr, WBf16: W.flag(), Y: rc.ptr(out), Rows: int64(R), D: int64(D), Eps: float64(float32(eps))}
		return kc.Launch(rc.dev, "glmf_rmsnorm", kc.Dim3{X: uint32(R)}, block256, 0, &a)
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
	eps := n.Attrs.Float("eps", 1e-6)
	return &kstep{run: func(rc *runCtx) error {
		R := rc.rows(in[0])
		a := kc.NormArgs{X: rc.ptr(in[0]), W: W.ptr, WBf16: W.flag(), B: B.ptr, BBf16: B.flag(), Y: rc.ptr(out), Rows: int64(R), D: int64(D), Eps: float64(float32(eps))}
		return kc.Launch(rc.dev, "glmf_layernorm", kc.Dim3{X: uint32(R)}, block256, 0, &a)
	}}, nil
}

// skinnyMaxRows is the most rows the skinny GEMM takes; more rows go to the
// tiled kernel. Both sum in ascending k, so the choice (and so the batch's
// size) never changes a row's result. cuBLAS, used for fp32 weights on more
// rows, does not promise that: batch invariance holds for bf16 weights.
const skinnyMaxRows = 8

// gemm launches y = x·Wᵀ over M rows for weight W ([G][N][K] when batched)
// writing through args' outputs; fp32 weights go to cuBLAS when the outputs
// are one plain matrix.
func gemm(rc *runCtx, a *kc.GemmArgs, G int) error {
	if a.M == 0 {
		return nil
	}
	grid := kc.Dim3{Z: uint32(G)}
	if a.M <= skinnyMaxRows {
		grid.X = uint32((a.N + 31) / 32)
		return kc.Launch(rc.dev, "glmf_gemm_skinny", grid, block256, 0, a)
	}
	grid.X, grid.Y = uint32((a.N+63)/64), uint32((a.M+63)/64)
	return kc.Launch(rc.dev, "glmf_gemm_tiled", grid, block256, 0, a)
}

func bindLinear(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	W, err := p.w(in[1])
	if err != nil {
		return nil, err
	}
	K, N := in[0].Shape[1], out.Shape[1]
	return &kstep{run: func(rc *runCtx) error {
		M := rc.rows(in[0])
		if !W.bf16 && M > skinnyMaxRows {
			return rc.dev.Sgemm(M, N, K, rc.ptr(in[0]), K, W.ptr, rc.ptr(out), N)
		}
		a := kc.GemmArgs{A: rc.ptr(in[0]), Lda: int64(K), W: W.ptr, WBf16: W.flag(), M: int64(M), N: int64(N), K: int64(K), Nout: 1}
		a.Out[0], a.Ow[0] = rc.ptr(out), int64(N)
		return gemm(rc, &a, 1)
	}}, nil
}

func bindLinearSplit(p *Program, n *ir.Node) (*kstep, error) {
	in, outs := n.Inputs, n.Outputs
	W, err := p.w(in[1])
	if err != nil {
		return nil, err
	}
	K, N := in[0].Shape[1], in[1].Shape[0]
	splits := n.Attrs.Ints("splits")
	if len(splits) > 8 {
		return nil, fmt.Errorf("%d splits; the CUDA kernels write at most 8", len(splits))
	}
	st := &kstep{}
	if !W.bf16 {
		st.temps = func(rc *runCtx) []int64 { return []int64{4 * int64(rc.rows(in[0])) * int64(N)} }
	}
	st.run = func(rc *runCtx) error {
		M := rc.rows(in[0])
		a := kc.GemmArgs{A: rc.ptr(in[0]), Lda: int64(K), W: W.ptr, WBf16: W.flag(), M: int64(M), N: int64(N), K: int64(K), Nout: int64(len(splits))}
		for i, s := range splits {
			a.Out[i], a.Ow[i] = rc.ptr(outs[i]), int64(s)
		}
		if W.bf16 || M <= skinnyMaxRows {
			return gemm(rc, &a, 1)
		}
		tmp := rc.temps[0]
		if err := rc.dev.Sgemm(M, N, K, rc.ptr(in[0]), K, W.ptr, tmp, N); err != nil {
			return err
		}
		sa := kc.SplitArgs{X: tmp, R: int64(M), N: int64(N), Nout: a.Nout, Out: a.Out, W: a.Ow}
		return kc.Launch(rc.dev, "glmf_split_cols", blocks(int64(M*N)), block256, 0, &sa)
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
	return &kstep{run: func(rc *runCtx) error {
		M := rc.rows(in[0])
		if !W.bf16 && M > skinnyMaxRows {
			for g := 0; g < G; g++ {
				if err := rc.dev.Sgemm(M, N, K, rc.ptr(in[0])+kc.DevicePtr(4*g*K), G*K, W.ptr+kc.DevicePtr(4*g*N*K), rc.ptr(outs[g]), N); err != nil {
					return err
				}
			}
			return nil
		}
		a := kc.GemmArgs{A: rc.ptr(in[0]), Lda: int64(G * K), AGoff: int64(K), W: W.ptr, WBf16: W.flag(), WGoff: int64(N * K),
			M: int64(M), N: int64(N), K: int64(K), Nout: int64(G), Batched: 1}
		for g := 0; g < G; g++ {
			a.Out[g], a.Ow[g] = rc.ptr(outs[g]), int64(N)
		}
		return gemm(rc, &a, G)
	}}, nil
}

func bindElementwise(op int64) binder {
	return func(p *Program, n *ir.Node) (*kstep, error) {
		in, out := n.Inputs, n.Outputs[0]
		limit := n.Attrs.Float("limit", 0)
		return &kstep{run: func(rc *runCtx) error {
			cnt := rc.bytesOf(out) / 4
			a := kc.EltArgs{X: rc.ptr(in[0]), Out: rc.ptr(out), N: cnt, Op: op, Limit: float64(float32(limit))}
			if len(in) > 1 {
				a.Y = rc.ptr(in[1])
			}
			return kc.Launch(rc.dev, "glmf_elementwise", blocks(cnt), block256, 0, &a)
		}}, nil
	}
}

func bindStreamMean(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	H, D := in[0].Shape[1], in[0].Shape[2]
	return &kstep{run: func(rc *runCtx) error {
		a := kc.StreamMeanArgs{X: rc.ptr(in[0]), Y: rc.ptr(out), T: int64(rc.T), H: int64(H), D: int64(D)}
		return kc.Launch(rc.dev, "glmf_stream_mean", blocks(int64(rc.T*D)), block256, 0, &a)
	}}, nil
}

func bindLastRows(p *Program, n *ir.Node) (*kstep, error) {
	in, out := n.Inputs, n.Outputs[0]
	D := in[1].Shape[1]
	return &kstep{run: func(rc *runCtx) error {
		a := kc.GatherArgs{X: rc.ptr(in[1]), Rows: rc.meta.LastRow, Y: rc.ptr(out), R: int64(rc.S), D: int64(D)}
		return kc.Launch(rc.dev, "glmf_gather_rows", blocks(int64(rc.S*D)), block256, 0, &a)
	}}, nil
}
