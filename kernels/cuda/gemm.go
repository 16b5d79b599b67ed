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

// GemvLaunch is glmf_gemv's launch shape for N columns (a warp each, 8
// a block) over tiles (MoE tile mode, else 1) and G groups.
func GemvLaunch(N, tiles, G int) (kernel string, grid, block Dim3) {
	return "glmf_gemv", Dim3{X: uint32((N + 7) / 8), Y: uint32(tiles), Z: uint32(G)}, Dim3{X: 256}
}
