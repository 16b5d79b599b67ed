package cuda

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/glmflash/glmflash/core/backend"
	kc "github.com/glmflash/glmflash/kernels/cuda"
)

func policy(t *testing.T, o GEMMOptions, precision string) *gemmPolicy {
	t.Helper()
	g, err := newGEMMPolicy(o, precision, 132)
	require.NoError(t, err)
	return g
}

// The options build the policy (configuration: cuda.gemv_fp8_kernel, no
// environment variable of its own), and a kernel that is not a one-row fp8
// GEMV fails when the backend's options are built, naming the key.
func TestGEMMPolicyOptions(t *testing.T) {
	require.Equal(t, kc.KernelGemvF1Fp8p, policy(t, GEMMOptions{}, "bf16").fp8Kernel, "the default")
	require.Equal(t, defaultGemvMMAFP8Rows, policy(t, GEMMOptions{}, "bf16").mmaFP8Rows)
	require.True(t, policy(t, GEMMOptions{}, "bf16").mmaBF16)
	for _, k := range kc.GemvFP8Kernels() {
		require.Equal(t, k, policy(t, GEMMOptions{GemvFP8Kernel: k.String()}, "bf16").fp8Kernel)
	}
	_, err := newGEMMPolicy(GEMMOptions{GemvFP8Kernel: "glmf_gemv_f2"}, "bf16", 132)
	require.ErrorContains(t, err, "cuda.gemv_fp8_kernel")
	require.Equal(t, GEMMOptions{GemvFP8Kernel: "glmf_gemv_f1_fp8"}, OptionsOf(backend.Options{Device: Options{GEMM: GEMMOptions{GemvFP8Kernel: "glmf_gemv_f1_fp8"}}}).GEMM)
	require.Equal(t, 3, policy(t, GEMMOptions{GemvMMAFP8Rows: 3}, "bf16").mmaFP8Rows)
}

// The tensor-core GEMV runs exactly where it applies (kc.GemvMMAApplies)
// and pays: bf16 weights from 2 rows, fp8 from GemvMMAFP8Rows (6); bf16
// weights not at all with NoGemvMMABF16.
func TestGEMMPolicyGemv(t *testing.T) {
	base := kc.GemmArgs{A: 256, Lda: 128, W: 4096, WType: 2, N: 100, K: 128, ARound: 1}
	def, noBF16, fp8At3 := policy(t, GEMMOptions{}, "bf16"), policy(t, GEMMOptions{NoGemvMMABF16: true}, "bf16"), policy(t, GEMMOptions{GemvMMAFP8Rows: 3}, "bf16")
	for _, c := range []struct {
		mod  func(a *kc.GemmArgs)
		want bool
	}{
		{func(a *kc.GemmArgs) {}, true},
		{func(a *kc.GemmArgs) { a.WType = 1 }, true},
		{func(a *kc.GemmArgs) { a.WType = 0 }, false},
		{func(a *kc.GemmArgs) { a.ARound = 0 }, false},
		{func(a *kc.GemmArgs) { a.K = 96 }, false},
		{func(a *kc.GemmArgs) { a.A += 4 }, false},
	} {
		a := base
		c.mod(&a)
		for _, rows := range []int{1, 2, 5, 6, 8} {
			pays := rows >= 2
			if a.WType == 2 {
				pays = rows >= 6
			}
			require.Equal(t, pays, def.mmaPays(a.WType, rows), "%+v rows %d", a, rows)
			k, _, _ := def.gemv(&a, rows, 1, 1)
			require.Equal(t, c.want && pays, strings.HasPrefix(k.String(), "glmf_gemv_mma_"), "%+v rows %d: %s", a, rows, k)
			k, _, _ = noBF16.gemv(&a, rows, 1, 1)
			require.Equal(t, c.want && pays && a.WType == 2, strings.HasPrefix(k.String(), "glmf_gemv_mma_"), "NoGemvMMABF16 %+v rows %d: %s", a, rows, k)
			k, _, _ = fp8At3.gemv(&a, rows, 1, 1)
			pays3 := pays
			if a.WType == 2 {
				pays3 = rows >= 3
			}
			require.Equal(t, c.want && pays3, strings.HasPrefix(k.String(), "glmf_gemv_mma_"), "GemvMMAFP8Rows 3 %+v rows %d: %s", a, rows, k)
		}
	}
}

// One-row fp8 GEMVs of at least gemvFP8Blocks blocks take the policy's
// fp8 kernel on its grid (the persistent one: the GPU's blocks at once),
// fewer blocks glmf_gemv_f1; bf16 weights never.
func TestGEMMPolicyFP8Kernel(t *testing.T) {
	tiles := kc.GemmArgs{WType: 2, ARound: 1, Tiles: 4096, N: 4096, K: 2048}
	k, g, _ := policy(t, GEMMOptions{}, "bf16").simt(&tiles, 1, 9, 1)
	require.Equal(t, kc.KernelGemvF1Fp8p, k, "one-row fp8 MoE tiles: 4,608 blocks")
	require.Equal(t, kc.GemvGrid(kc.KernelGemvF1Fp8p, kc.Dim3{X: 512, Y: 9, Z: 1}, 132), g)
	require.LessOrEqual(t, int(g.X)*9, 4*132, "the persistent kernel's blocks all fit at once")
	k, g, _ = policy(t, GEMMOptions{GemvFP8Kernel: "glmf_gemv_f1_fp8"}, "bf16").simt(&tiles, 1, 9, 1)
	require.Equal(t, kc.KernelGemvF1FP8, k)
	require.Equal(t, kc.Dim3{X: 512, Y: 9, Z: 1}, g, "a plain kernel's grid")
	few := kc.GemmArgs{WType: 2, ARound: 1, N: 4096, K: 12288}
	k, _, _ = policy(t, GEMMOptions{}, "bf16").simt(&few, 1, 1, 1)
	require.Equal(t, kc.KernelGemvF1, k, "512 blocks")
	bf := tiles
	bf.WType = 1
	k, _, _ = policy(t, GEMMOptions{}, "bf16").simt(&bf, 1, 9, 1)
	require.Equal(t, kc.KernelGemvF1, k, "bf16 weights")
}

// The default plans by kind and rows, and a tuned choice that can run
// the rows wins over them.
func TestGEMMPolicyPlan(t *testing.T) {
	g := policy(t, GEMMOptions{}, "bf16")
	require.Equal(t, gemmPlan{lib: true, ch: gemmChoice{kind: chCublas}}, g.plan(kindBF16BF16W, 2))
	require.Equal(t, gemmPlan{ch: gemmChoice{kind: chGemv}}, g.plan(kindBF16BF16W, 1))
	require.Equal(t, gemmPlan{ch: gemmChoice{kind: chGemv}}, g.plan(kindBF16FP8W, 8))
	require.Equal(t, gemmPlan{lib: true, ch: gemmChoice{kind: chCublas}}, g.plan(kindBF16FP8W, 9))
	require.Equal(t, gemmPlan{ch: gemmChoice{kind: chGemv}}, g.plan(kindF32FP8W, 8))
	require.Equal(t, gemmPlan{ch: gemmChoice{kind: chOwn}}, g.plan(kindF32FP8W, 9), "no library GEMM on fp8 weights in fp32")
	require.Equal(t, gemmPlan{ch: gemmChoice{kind: chOwn}}, g.plan(kindF32BF16W, 100))
	require.Equal(t, gemmPlan{lib: true, ch: gemmChoice{kind: chCublas}}, g.plan(kindF32F32W, 9))
	require.Equal(t, gemmPlan{ch: gemmChoice{kind: chOwn}}, g.plan(kindF32F32W, 8))
	tuned := &tunedGEMM{buckets: []int{8}, choices: []gemmChoice{{kind: chSkinny}}}
	require.Equal(t, gemmPlan{ch: gemmChoice{kind: chSkinny}}, g.planTuned(tuned, kindF32F32W, 4))
	require.Equal(t, g.plan(kindF32F32W, 9), g.planTuned(tuned, kindF32F32W, 9), "skinny stops at 8 rows")
	require.Equal(t, kindBF16FP8W, g.kind(devTensor{fp8: true}))
	require.Equal(t, kindF32FP8W, policy(t, GEMMOptions{}, "fp32").kind(devTensor{fp8: true}))
	require.Equal(t, kindBF16BF16W, g.kind(devTensor{bf16: true}))
	require.Equal(t, kindF32F32W, g.kind(devTensor{}))
}

// The MoE experts' path: the GEMV for few slots an expert (fp8 or
// precision bf16), else glmf_moe_mma in precision bf16 where the GPU has
// it, else the tiled kernel.
func TestGEMMPolicyMoE(t *testing.T) {
	g := policy(t, GEMMOptions{}, "bf16")
	require.True(t, g.moeGemv(true, 0, 64, 8))
	require.False(t, g.moeGemv(true, 0, 65, 8))
	require.True(t, g.moeGemv(false, 1, 8, 1))
	require.False(t, g.moeGemv(false, 0, 1, 8), "bf16 experts in fp32: the tiled kernel")
}
