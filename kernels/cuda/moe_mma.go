package cuda

// MoEMMARows is the most rows of one MoE tile glmf_moe_mma takes (MM_BM of
// src/moe_mma.cu): moe_plan's tile size for it.
const MoEMMARows = 128

// MoEMMA says whether glmf_moe_mma runs on d: it needs bf16 tensor cores
// (sm_80+), compiled only into the sm_90 PTX, which compute 9.0 and later
// load (the portable PTX holds an empty kernel).
func MoEMMA(d *Device) bool { return d.CC[0] >= 9 }

// MoEMMALaunch is the launch shape for N output columns over tiles tiles:
// 128 columns a block, 64 in dual (gate+up) mode; glmf_moe_mma_bf16 when
// bf16A (GemmArgs.ARound = 2: A holds bf16 bits and gate+up writes its
// output so), else glmf_moe_mma (fp32 A rounded as it is staged).
func MoEMMALaunch(N, tiles int, dual, bf16A bool) (kernel GemmArgsKernel, grid, block Dim3) {
	bn := 128
	if dual {
		bn = 64
	}
	kernel = KernelMoEMMA
	if bf16A {
		kernel = KernelMoEMMABF16
	}
	return kernel, Dim3{X: uint32((N + bn - 1) / bn), Y: uint32(tiles)}, Dim3{X: 256}
}
