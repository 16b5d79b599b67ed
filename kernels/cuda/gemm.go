package cuda

// The GEMM kernels of src/gemm.cu sum every output in ascending k, in
// double, so which of them computes a row never changes its bits; they
// differ in how they spread the work. GemmLaunch picks one by row count.

// Row limits of the kernels for few rows (decode).
const (
	// ColMaxRows is the most rows glmf_gemm_col takes (one thread per
	// column streaming its weight row: the best at batch 1–2).
	ColMaxRows = 2
	// SkinnyMaxRows is the most rows glmf_gemm_skinny takes (a thread per
	// output, 32 columns × 8 rows per block); more go to glmf_gemm_tiled.
	SkinnyMaxRows = 8
)

// GemmLaunch is the kernel and launch shape for an M×N GEMM (G groups in
// grid.z) with GemmArgs.
func GemmLaunch(M, N, G int) (kernel GemmArgsKernel, grid, block Dim3) {
	switch {
	case M <= ColMaxRows:
		return KernelGemmCol, Dim3{X: uint32((N + 63) / 64), Y: 1, Z: uint32(G)}, Dim3{X: 64}
	case M <= SkinnyMaxRows:
		return KernelGemmSkinny, Dim3{X: uint32((N + 31) / 32), Y: 1, Z: uint32(G)}, Dim3{X: 256}
	}
	return KernelGemmTiled, Dim3{X: uint32((N + 63) / 64), Y: uint32((M + 63) / 64), Z: uint32(G)}, Dim3{X: 256}
}

// GemvRows is the most rows (or MoE tile rows) glmf_gemv takes.
const GemvRows = 8

// GemvWarps is the warps of a glmf_gemv block (they split K).
const GemvWarps = 4

// GemvCols is the columns a glmf_gemv block computes for args a: 8 weight
// rows ("slots") in bf16 precision (a.ARound: float sums), 4 in fp32
// precision (double sums); in dual mode (a.W2: MoE gate and up) half as
// many columns, each with its W and W2 rows.
func GemvCols(a *GemmArgs) int {
	slots := 4
	if a.ARound != 0 {
		slots = 8
	}
	if a.W2 != 0 {
		slots /= 2
	}
	return slots
}

// GemvSIMTLaunch is glmf_gemv's launch shape for args a (GemvCols(a) columns
// of a.N a block, GemvWarps warps splitting K) for at most rows rows (a.M,
// or a MoE tile's most rows) over tiles (MoE tile mode, else 1) and G
// groups. The kernel is the one for the precision (float or double sums)
// and the fewest rows a pass (1, 2, 4 or 8; fp32 weights: 8) that take
// rows: all give the same bits, fewer rows a pass need fewer registers.
// Where it is glmf_gemv_f1 on fp8 weights, any of GemvFP8Kernels may run
// instead on its GemvGrid (the CUDA backend's GEMM policy picks).
func GemvSIMTLaunch(a *GemmArgs, rows, tiles, G int) (kernel GemmArgsKernel, grid, block Dim3) {
	c := int64(GemvCols(a))
	r := 1
	for r < rows && r < GemvRows {
		r *= 2
	}
	if a.WType == 0 {
		r = GemvRows
	}
	p := "d"
	if a.ARound != 0 {
		p = "f"
	}
	kernel, _ = GemvSIMTKernel(p, r)
	grid = Dim3{X: uint32((a.N + c - 1) / c), Y: uint32(tiles), Z: uint32(G)}
	return kernel, grid, Dim3{X: 32 * GemvWarps}
}

// GemvFP8Applies says whether one of GemvFP8Kernels may stand in for
// kernel on args a: glmf_gemv_f1 (one row a pass, float sums) on fp8
// weights, which all of them compute with the same bits.
func GemvFP8Applies(a *GemmArgs, kernel GemmArgsKernel) bool {
	return kernel == KernelGemvF1 && a.WType == 2
}

// GemvGrid is kernel's grid for the column groups of grid (glmf_gemv's
// grid: a block per group along X) on a GPU of sms SMs: grid itself,
// except for the persistent glmf_gemv_f1_fp8p, whose blocks loop over the
// groups: then as many blocks as fit on the GPU at once (4 an SM, its
// launch bounds, over Y·Z), each taking the same number of groups (give or
// take one).
func GemvGrid(kernel GemmArgsKernel, grid Dim3, sms int) Dim3 {
	if kernel != KernelGemvF1Fp8p {
		return grid
	}
	n := int64(grid.X)
	gx := max(1, 4*int64(max(sms, 1))/(int64(grid.Y)*int64(grid.Z)))
	if gx < n {
		per := (n + gx - 1) / gx
		grid.X = uint32((n + per - 1) / per)
	}
	return grid
}

// GemvFP8Kernels are the one-row fp8 GEMV kernels, which give the same
// bits: glmf_gemv_f1 (128 registers, 4 blocks an SM), glmf_gemv_f1_fp8 (80
// registers, 6 blocks an SM) and glmf_gemv_f1_fp8p (persistent blocks,
// each issuing its next chunk's loads before computing the current one).
func GemvFP8Kernels() []GemmArgsKernel {
	return []GemmArgsKernel{KernelGemvF1, KernelGemvF1FP8, KernelGemvF1Fp8p}
}

// GemvMMAWarps is the warps of a glmf_gemv_mma block (they split K);
// GemvMMAWarpsK those of the *_t1k kernels (grids of few blocks).
const (
	GemvMMAWarps  = 8
	GemvMMAWarpsK = 16
)

// gemvMMAWideBlocks: with at least this many blocks of 32 columns
// (× tiles × groups) the kernels of two column tiles a warp run (half the
// activation reads), else those of one (more blocks for the SMs), with
// GemvMMAWarpsK warps splitting K where even blocks of 16 columns are
// fewer than gemvMMAFewBlocks (about the H200's 132 SMs).
const (
	gemvMMAWideBlocks = 264
	gemvMMAFewBlocks  = 132
)

// GemvMMAApplies says whether the tensor-core GEMV (src/gemv_mma.cu) takes
// args a: precision bf16 (a.ARound = 1: fp32 activations rounded to bf16),
// fp8 or bf16 weights, K a multiple of 64, 16-byte aligned weights (and
// group offsets) and activation rows.
func GemvMMAApplies(a *GemmArgs) bool {
	wsz := int64(1)
	switch a.WType {
	case 2:
	case 1:
		wsz = 2
	default:
		return false
	}
	return a.ARound == 1 && a.K > 0 && a.K%64 == 0 && a.N > 0 &&
		a.W%16 == 0 && a.W2%16 == 0 && (a.WGoff*wsz)%16 == 0 &&
		a.A%16 == 0 && a.Lda%4 == 0 && a.AGoff%4 == 0
}

// GemvMMALaunch is the launch of glmf_gemv_mma_* for args a over tiles
// (MoE tile mode, else 1) and G groups (ok false where GemvMMAApplies
// does not hold): 16 columns a block in dual mode (a.W2: W and W2 rows),
// else 32 or, with few blocks, 16; GemvMMAWarps warps splitting K
// (GemvMMAWarpsK with very few blocks). Any row count (passes of 8).
func GemvMMALaunch(a *GemmArgs, tiles, G int) (kernel GemmArgsKernel, grid, block Dim3, ok bool) {
	if !GemvMMAApplies(a) {
		return 0, Dim3{}, Dim3{}, false
	}
	w := "f8"
	if a.WType == 1 {
		w = "b16"
	}
	v, cols, warps := "t1", int64(16), GemvMMAWarps
	switch {
	case a.W2 != 0:
		v = "dual"
	case (a.N+31)/32*int64(tiles*G) >= gemvMMAWideBlocks:
		v, cols = "t2", 32
	case (a.N+15)/16*int64(tiles*G) < gemvMMAFewBlocks:
		v, warps = "t1k", GemvMMAWarpsK
	}
	kernel, _ = GemvMMAKernel(w, v)
	return kernel, Dim3{X: uint32((a.N + cols - 1) / cols), Y: uint32(tiles), Z: uint32(G)}, Dim3{X: uint32(32 * warps)}, true
}
