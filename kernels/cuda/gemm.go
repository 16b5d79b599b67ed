package cuda

import "fmt"

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
func GemmLaunch(M, N, G int) (kernel string, grid, block Dim3) {
	switch {
	case M <= ColMaxRows:
		return "glmf_gemm_col", Dim3{X: uint32((N + 63) / 64), Y: 1, Z: uint32(G)}, Dim3{X: 64}
	case M <= SkinnyMaxRows:
		return "glmf_gemm_skinny", Dim3{X: uint32((N + 31) / 32), Y: 1, Z: uint32(G)}, Dim3{X: 256}
	}
	return "glmf_gemm_tiled", Dim3{X: uint32((N + 63) / 64), Y: uint32((M + 63) / 64), Z: uint32(G)}, Dim3{X: 256}
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

// GemvLaunch is glmf_gemv's launch shape for args a (GemvCols(a) columns
// of a.N a block, GemvWarps warps splitting K) for at most rows rows (a.M,
// or a MoE tile's most rows) over tiles (MoE tile mode, else 1) and G
// groups. The kernel is the one for the precision (float or double sums)
// and the fewest rows a pass (1, 2, 4 or 8; fp32 weights: 8) that take
// rows: all give the same bits, fewer rows a pass need fewer registers.
func GemvLaunch(a *GemmArgs, rows, tiles, G int) (kernel string, grid, block Dim3) {
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
	return fmt.Sprintf("glmf_gemv_%s%d", p, r), Dim3{X: uint32((a.N + c - 1) / c), Y: uint32(tiles), Z: uint32(G)}, Dim3{X: 32 * GemvWarps}
}
