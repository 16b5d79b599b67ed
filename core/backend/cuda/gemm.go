package cuda

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/glmflash/glmflash/core/ir"
	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// GEMM kernel choices. Without prefill-autotune a GEMM of at most
// skinnyMaxRows rows runs the kernel kc.GemmLaunch picks (the column kernel
// for 1–2 rows, the skinny kernel for 3–8), more rows the tiled kernel for
// bf16 weights in fp32 precision and cuBLAS otherwise. prefill-autotune
// measures the alternatives per weight shape and token-count bucket
// (GEMMTuner) and writes its choices on the node (ir.AttrTuneBuckets,
// ir.AttrTuneKernels, ir.AttrTuneKind):
//
//	own       the kernel kc.GemmLaunch picks for the rows (the default for ≤ 8)
//	col:T     the column kernel with T threads (columns) a block, ≤ 2 rows
//	skinny    the shared-memory skinny kernel (32 columns × 8 rows a block), ≤ 8 rows
//	tiled     the 64×64 tiled kernel
//	skinny8   the skinny kernel over chunks of 8 rows (one launch each), ≤ 64 rows
//	gemv      the GEMV (≤ 8 rows; the default there for fp8 weights and in
//	          precision bf16: 16-byte weight loads, 4–8 columns a block,
//	          sums split across lanes and warps, so not bit-equal to the
//	          others, but the same whatever the row count)
//	cublas    cuBLAS (Sgemm, or the bf16 GemmEx after the activation cast)
//	lt:HEX    a cuBLASLt algorithm (the 64 bytes of its struct)
//
// The own kernels sum in ascending k in double whatever their launch
// shape, so their choices give the same bits; library choices are kept
// when their outputs agree with the default's within the pass's tolerance.
type gemmChoice struct {
	kind    int
	threads int
	algo    kc.LtAlgo
}

const (
	chDefault = iota // no choice made: gemmPolicy.plan's default applies
	chOwn            // the own kernel kc.GemmLaunch picks for the row count
	chCol
	chSkinny
	chTiled
	chSkinny8
	chCublas
	chLt
	chGemv
)

// GEMM kinds: the activations and weights a GEMM's kernels see.
const (
	kindF32BF16W  = "f32a-bf16w"  // fp32 precision, bf16 weights: own kernels only
	kindF32F32W   = "f32a-f32w"   // fp32 weights (not bf16-exact, or FP32Weights): cuBLAS for many rows
	kindBF16BF16W = "bf16a-bf16w" // precision bf16: bf16 activations, cuBLAS bf16 for many rows
	kindF32FP8W   = "f32a-fp8w"   // fp8 weights with block scales, fp32 precision: gemv or tiled
	kindBF16FP8W  = "bf16a-fp8w"  // fp8 weights, precision bf16: gemv, or cuBLAS bf16 on a dequantized copy
)

// skinny8MaxRows is the most rows skinny8 takes (eight launches).
const skinny8MaxRows = 64

// colTriedMin and colTriedMax bound the column kernel's block widths worth
// trying (the powers of two between).
const colTriedMin, colTriedMax = 32, 256

func parseChoice(s string) (gemmChoice, error) {
	switch {
	case s == "own":
		return gemmChoice{kind: chOwn}, nil
	case s == "skinny":
		return gemmChoice{kind: chSkinny}, nil
	case s == "tiled":
		return gemmChoice{kind: chTiled}, nil
	case s == "skinny8":
		return gemmChoice{kind: chSkinny8}, nil
	case s == "cublas":
		return gemmChoice{kind: chCublas}, nil
	case s == "gemv":
		return gemmChoice{kind: chGemv}, nil
	case strings.HasPrefix(s, "col:"):
		t, err := strconv.Atoi(strings.TrimPrefix(s, "col:"))
		if err != nil || t < 32 || t > 1024 || t%32 != 0 {
			return gemmChoice{}, fmt.Errorf("GEMM choice %q: the column kernel takes 32 to 1024 threads, a multiple of 32", s)
		}
		return gemmChoice{kind: chCol, threads: t}, nil
	case strings.HasPrefix(s, "lt:"):
		a, err := kc.ParseLtAlgo(strings.TrimPrefix(s, "lt:"))
		if err != nil {
			return gemmChoice{}, fmt.Errorf("GEMM choice: %w", err)
		}
		return gemmChoice{kind: chLt, algo: a}, nil
	}
	return gemmChoice{}, fmt.Errorf("GEMM choice %q: own, col:T, skinny, tiled, skinny8, gemv, cublas or lt:HEX", s)
}

func (c gemmChoice) String() string {
	switch c.kind {
	case chOwn:
		return "own"
	case chCol:
		return fmt.Sprintf("col:%d", c.threads)
	case chSkinny:
		return "skinny"
	case chTiled:
		return "tiled"
	case chSkinny8:
		return "skinny8"
	case chCublas:
		return "cublas"
	case chGemv:
		return "gemv"
	case chLt:
		return "lt:" + c.algo.String()
	}
	return "default"
}

// lib says whether the choice runs in the vendor library.
func (c gemmChoice) lib() bool { return c.kind == chCublas || c.kind == chLt }

// valid says whether the choice can run rows rows of kind.
func (c gemmChoice) valid(kind string, rows int) bool {
	switch c.kind {
	case chCol:
		return rows <= kc.ColMaxRows
	case chSkinny, chGemv:
		return rows <= skinnyMaxRows
	case chSkinny8:
		return rows <= skinny8MaxRows
	case chCublas, chLt:
		return kind != kindF32BF16W && kind != kindF32FP8W
	}
	return true
}

// gemmKind is the kind of a GEMM over weight W in this program.
func (p *Program) gemmKind(W devTensor) string { return p.b.gemm.kind(W) }

// fp8KindOf is the GEMM kind of fp8 weights in a precision.
func fp8KindOf(precision string) string {
	if precision == "bf16" {
		return kindBF16FP8W
	}
	return kindF32FP8W
}

// gemmKindOf is the GEMM kind of weights kept in bf16 (or not) in a
// precision.
func gemmKindOf(bf16W bool, precision string) string {
	switch {
	case bf16W && precision == "bf16":
		return kindBF16BF16W
	case bf16W:
		return kindF32BF16W
	}
	return kindF32F32W
}

// tunedGEMM is a node's tuned choices per token bucket.
type tunedGEMM struct {
	buckets []int
	choices []gemmChoice
	usesLt  bool
}

// tuning reads a GEMM node's choices (nil when prefill-autotune chose
// nothing for it, or chose for another kind than the node has here: the
// defaults then apply).
func (p *Program) tuning(n *ir.Node, W devTensor) (*tunedGEMM, error) {
	if n.Def().GEMM == nil { // linear_batched: the tune attributes are the GEMM trait's
		return nil, nil
	}
	bs, ks := ir.AttrTuneBuckets.Get(n), ir.AttrTuneKernels.Get(n)
	if len(bs) == 0 || ks == "" || ir.AttrTuneKind.Get(n) != p.gemmKind(W) {
		return nil, nil
	}
	parts := strings.Split(ks, ";")
	if len(parts) != len(bs) {
		return nil, fmt.Errorf("%s: %d buckets but %d kernel choices", ir.AttrTuneKernels, len(bs), len(parts))
	}
	t := &tunedGEMM{buckets: bs}
	for _, s := range parts {
		c, err := parseChoice(s)
		if err != nil {
			return nil, err
		}
		t.usesLt = t.usesLt || c.kind == chLt
		t.choices = append(t.choices, c)
	}
	if t.usesLt {
		p.usesLt = true
	}
	return t, nil
}

// choose picks the choice of the smallest bucket that holds rows rows,
// else the largest bucket's (as on the CPU); the default where the choice
// cannot run that many rows.
func (t *tunedGEMM) choose(kind string, rows int) gemmChoice {
	if t == nil || len(t.buckets) == 0 {
		return gemmChoice{}
	}
	i := ir.TuneBucket(t.buckets, rows)
	if t.choices[i].valid(kind, rows) {
		return t.choices[i]
	}
	return gemmChoice{}
}

// launchOwn runs one of the GEMM kernels over args a and G groups: the
// column kernel (threads columns a block; rows ≤ 2), the skinny kernel
// (rows ≤ 8), the tiled kernel, the skinny kernel over chunks of 8 rows
// (rows' outputs offset per chunk), or (chOwn) the one kc.GemmLaunch picks.
func (g *gemmPolicy) launchOwn(dev *kc.Device, a *kc.GemmArgs, G int, ch gemmChoice) error {
	if a.M == 0 {
		return nil
	}
	grid := kc.Dim3{Z: uint32(G)}
	switch ch.kind {
	case chCol:
		grid.X = uint32((a.N + int64(ch.threads) - 1) / int64(ch.threads))
		return kc.LaunchGemmCol(dev, grid, kc.Dim3{X: uint32(ch.threads)}, 0, a)
	case chSkinny:
		name, grid, block := kc.GemmLaunch(kc.SkinnyMaxRows, int(a.N), G)
		return name.Launch(dev, grid, block, 0, a)
	case chSkinny8:
		name, grid, block := kc.GemmLaunch(kc.SkinnyMaxRows, int(a.N), G)
		for r0 := int64(0); r0 < a.M; r0 += skinnyMaxRows {
			b := *a
			b.A += kc.DevicePtr(4 * r0 * a.Lda)
			b.M = min(skinnyMaxRows, a.M-r0)
			for j := int64(0); j < a.Nout; j++ {
				w := a.Ow[j]
				if a.Batched != 0 {
					w = a.N
				}
				b.Out[j] += kc.DevicePtr(4 * r0 * w)
			}
			if err := name.Launch(dev, grid, block, 0, &b); err != nil {
				return err
			}
		}
		return nil
	case chTiled:
		grid.X, grid.Y = uint32((a.N+63)/64), uint32((a.M+63)/64)
		return kc.LaunchGemmTiled(dev, grid, block256, 0, a)
	case chGemv:
		k, grid, block := g.gemv(a, int(a.M), 1, G)
		return k.Launch(dev, grid, block, 0, a)
	}
	name, grid, block := kc.GemmLaunch(int(a.M), int(a.N), G)
	return name.Launch(dev, grid, block, 0, a)
}

// libGemm runs C[M][N] = A[M][K]·W[N][K]ᵀ in the vendor library: a
// cuBLASLt algorithm, or cuBLAS (Sgemm, or GemmEx when bf: A and W bf16).
// A cuBLASLt algorithm that cannot run this row count falls back to cuBLAS.
func libGemm(dev *kc.Device, ch gemmChoice, bf bool, M, N, K int, A kc.DevicePtr, lda int, W kc.DevicePtr, C kc.DevicePtr, ldc int) error {
	if ch.kind == chLt {
		spec := kc.LtSpec{M: M, N: N, K: K, Lda: lda, Ldw: K, Ldc: ldc, BF16: bf}
		if dev.LtCheck(spec, ch.algo) == nil {
			return dev.LtMatmul(spec, ch.algo, A, W, C)
		}
	}
	if bf {
		return dev.GemmBF16(M, N, K, A, lda, W, K, C, ldc)
	}
	return dev.Sgemm(M, N, K, A, lda, W, C, ldc)
}
