package cuda

import (
	"fmt"
	"slices"

	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// GEMMOptions are the knobs of a CUDA backend's GEMM dispatch (its
// gemmPolicy); the zero value is the default, measured on the H200.
type GEMMOptions struct {
	// GemvFP8Kernel is the kernel of one-row fp8 GEMVs of at least
	// gemvFP8Blocks blocks (MoE expert tiles, the dense MLP's fused gate
	// and up), one of kc.GemvFP8Kernels, which all give the same bits:
	// glmf_gemv_f1_fp8p ("", the default: persistent blocks, each issuing
	// its next chunk's loads before computing the current one: on the H200
	// a 288-expert decode layer's gate/up and down GEMVs 72.7 µs,
	// BenchmarkMoEDecodeGemv), glmf_gemv_f1_fp8 (80 registers, 6 blocks an
	// SM: 78.2 µs) or glmf_gemv_f1 (128 registers, 4 blocks an SM: 86.3 µs).
	// Configuration sets it (cuda.gemv_fp8_kernel, so also the environment
	// variable GLMFLASH_CUDA__GEMV_FP8_KERNEL), e.g. to measure the choice
	// in a whole decode step.
	GemvFP8Kernel string
	// GemvMMAFP8Rows is the fewest rows at which fp8 weights take the
	// tensor-core GEMV in precision bf16 (0: 6, see gemmPolicy.mmaPays).
	GemvMMAFP8Rows int
	// NoGemvMMABF16 keeps bf16 weights off the tensor-core GEMV (fp8
	// weights still take it where it applies and pays).
	NoGemvMMABF16 bool
}

// gemvFP8Blocks is the fewest blocks a one-row fp8 GEMV takes the
// policy's fp8 kernel at (below, glmf_gemv_f1).
const gemvFP8Blocks = 2048

// defaultGemvMMAFP8Rows is GEMMOptions.GemvMMAFP8Rows's default.
const defaultGemvMMAFP8Rows = 6

// gemmPolicy is a CUDA backend's GEMM dispatch, built once from its
// options (newGEMMPolicy): which path (own kernel, GEMV, tensor-core GEMV,
// the fp8 GEMV kernel, cuBLAS, cuBLASLt) a GEMM of a kind and a row count
// takes. kernels/cuda gives the launch shapes and says where a kernel
// applies; what pays is decided here.
type gemmPolicy struct {
	precision  string
	fp8Kernel  kc.GemmArgsKernel
	mmaFP8Rows int
	mmaBF16    bool
	sms        int // the GPU's SMs (the persistent fp8 GEMV's grid)
}

// newGEMMPolicy is the policy of options o in a precision on a GPU of
// sms SMs.
func newGEMMPolicy(o GEMMOptions, precision string, sms int) (*gemmPolicy, error) {
	g := &gemmPolicy{precision: precision, fp8Kernel: kc.KernelGemvF1Fp8p, mmaFP8Rows: defaultGemvMMAFP8Rows, mmaBF16: !o.NoGemvMMABF16, sms: sms}
	if o.GemvFP8Kernel != "" {
		i := slices.IndexFunc(kc.GemvFP8Kernels(), func(k kc.GemmArgsKernel) bool { return k.String() == o.GemvFP8Kernel })
		if i < 0 {
			return nil, fmt.Errorf("cuda backend: GEMV fp8 kernel %q (cuda.gemv_fp8_kernel): not one of the one-row fp8 GEMV kernels %v", o.GemvFP8Kernel, kc.GemvFP8Kernels())
		}
		g.fp8Kernel = kc.GemvFP8Kernels()[i]
	}
	if o.GemvMMAFP8Rows > 0 {
		g.mmaFP8Rows = o.GemvMMAFP8Rows
	}
	return g, nil
}

// gemmPlan is what a GEMM node runs for a batch of M rows: the library
// (cuBLAS or a cuBLASLt algorithm) or one of the own kernels.
type gemmPlan struct {
	lib bool
	ch  gemmChoice
}

// kind is the kind of a GEMM over weight W.
func (g *gemmPolicy) kind(W devTensor) string {
	if W.fp8 {
		return fp8KindOf(g.precision)
	}
	return gemmKindOf(W.bf16, g.precision)
}

// plan decides for rows rows of kind when prefill-autotune chose nothing:
// the library for more than skinnyMaxRows rows of fp32 weights or in bf16
// precision, the GEMV for few rows of fp8 weights or in precision bf16,
// else the own kernel kc.GemmLaunch picks.
func (g *gemmPolicy) plan(kind string, rows int) gemmPlan {
	switch {
	case kind == kindBF16BF16W && rows > 1:
		// measured on the H200 (BenchmarkGemvDecode): at 2–8 rows cuBLAS
		// streams bf16 weights at ~3.6 TB/s, glmf_gemv at 0.8–1.5 TB/s;
		// at one row both are at the roofline (the tensor-core
		// glmf_gemv_mma_b16_* is not measured yet: BenchmarkGemvDecode's
		// mma-* lines say whether it should take 2–8 rows too)
		return gemmPlan{lib: true, ch: gemmChoice{kind: chCublas}}
	case rows <= skinnyMaxRows && (kind == kindBF16BF16W || kind == kindF32FP8W || kind == kindBF16FP8W):
		// the GEMV: in precision bf16 (fp8 weights, bf16 at one row) the
		// tensor-core glmf_gemv_mma_* where it applies and pays
		// (gemmPolicy.gemv), else glmf_gemv_*
		return gemmPlan{ch: gemmChoice{kind: chGemv}}
	case kind != kindF32BF16W && kind != kindF32FP8W && rows > skinnyMaxRows:
		return gemmPlan{lib: true, ch: gemmChoice{kind: chCublas}}
	}
	return gemmPlan{ch: gemmChoice{kind: chOwn}}
}

// planTuned is prefill-autotune's choice in t when it made one for this
// kind and it can run rows rows, else plan's.
func (g *gemmPolicy) planTuned(t *tunedGEMM, kind string, rows int) gemmPlan {
	if ch := t.choose(kind, rows); ch.kind != chDefault {
		return gemmPlan{lib: ch.lib(), ch: ch}
	}
	return g.plan(kind, rows)
}

// mmaPays says whether the tensor-core GEMV beats glmf_gemv at rows rows
// for weights of type wtype, as BenchmarkGemvDecode and
// BenchmarkMoEDecodeGemv measured them on the H200
// (docs/results/cuda-h200-gpu-preset/run-2314/ and run-2322/): bf16
// weights from 2 rows (3.5–4.1 TB/s against 1.2–1.5 at 8 rows; at 1 row
// equal or slower); fp8 weights from mmaFP8Rows rows (its per-chunk
// activation reads and packing bound it near 0.7–0.8 TB/s at any row
// count, where glmf_gemv streams 2.1–3.1 TB/s at 1–2 rows, 0.6–0.7 at 8).
func (g *gemmPolicy) mmaPays(wtype int64, rows int) bool {
	if wtype == 2 {
		return rows >= g.mmaFP8Rows
	}
	return rows >= 2
}

// mmaTakes says whether the tensor-core GEMV takes args a: where it
// applies (kc.GemvMMAApplies) and the policy lets the weights' type take
// it.
func (g *gemmPolicy) mmaTakes(a *kc.GemmArgs) bool {
	return kc.GemvMMAApplies(a) && (a.WType != 1 || g.mmaBF16)
}

// gemv is the launch for the GEMV of args a (a.M rows, or MoE tiles of at
// most rows rows, over tiles tiles, else 1, and G groups): the tensor-core
// glmf_gemv_mma_* where it takes a and pays at rows rows, else glmf_gemv_*
// (simt). In precision fp32 the tensor-core kernel never applies, so a
// row's bits do not depend on the batch there; in precision bf16 they may
// (as cuBLAS's do).
func (g *gemmPolicy) gemv(a *kc.GemmArgs, rows, tiles, G int) (kc.GemmArgsKernel, kc.Dim3, kc.Dim3) {
	if g.mmaPays(a.WType, rows) && g.mmaTakes(a) {
		if k, gr, b, ok := kc.GemvMMALaunch(a, tiles, G); ok {
			return k, gr, b
		}
	}
	return g.simt(a, rows, tiles, G)
}

// simt is glmf_gemv's launch for args a (kc.GemvSIMTLaunch), one-row fp8
// GEMVs of at least gemvFP8Blocks blocks on the policy's fp8 kernel
// (glmf_gemv_f1's bits) and its grid.
func (g *gemmPolicy) simt(a *kc.GemmArgs, rows, tiles, G int) (kc.GemmArgsKernel, kc.Dim3, kc.Dim3) {
	k, grid, block := kc.GemvSIMTLaunch(a, rows, tiles, G)
	if kc.GemvFP8Applies(a, k) && int64(grid.X)*int64(tiles)*int64(G) >= gemvFP8Blocks {
		k = g.fp8Kernel
		grid = kc.GemvGrid(k, grid, g.sms)
	}
	return k, grid, block
}

// moeGemv says whether MoE experts run TK routing slots over E experts as
// tiles of at most kc.GemvRows rows on the GEMV: when the slots average at
// most that many per expert (decode), for fp8 experts and in precision
// bf16 (round 1); else the tiled kernel or glmf_moe_mma (moeMMA).
func (g *gemmPolicy) moeGemv(fp8 bool, round int64, TK, E int) bool {
	return (fp8 || round == 1) && TK <= kc.GemvRows*E
}

// moeMMA says whether they run on the tensor-core glmf_moe_mma (precision
// bf16, more slots than the GEMV takes, a GPU that has it).
func (g *gemmPolicy) moeMMA(dev *kc.Device, fp8 bool, round int64, TK, E int) bool {
	return round == 1 && !g.moeGemv(fp8, round, TK, E) && kc.MoEMMA(dev)
}
