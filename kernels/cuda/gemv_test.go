package cuda_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	kc "github.com/glmflash/glmflash/kernels/cuda"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/stretchr/testify/require"
)

// gemvWeight is a random weight [n][k] stored as wt (0 fp32, 1 bf16, 2
// fp8 with block scales), uploaded, and its values as the CPU reads them.
func gemvWeight(t *testing.T, d *kc.Device, r *rand.Rand, wt, n, k int) (w, s buf, sld int, deq []float32) {
	switch wt {
	case 0:
		deq = randn(r, n*k, 0.3)
		return upload(t, d, deq), buf{}, 0, deq
	case 1:
		wb, wf := toBF16(randn(r, n*k, 0.3))
		return upload(t, d, wb), buf{}, 0, wf
	}
	codes, scales, sld, deq := fp8Matrix(r, n, k, true)
	return upload(t, d, codes), upload(t, d, scales), sld, deq
}

// glmf_gemv against the CPU for every weight storage, both precisions
// (double sums; float sums of bf16-rounded activations), 1–8 rows, N not a
// multiple of the block's columns, K tails (the scalar path), K of several
// passes of the block's lanes, and groups
// with batched outputs; and its bits do not depend on the other rows (a
// row alone gives the batch's bits), nor on the 16-byte or scalar path
// (the same rows at an unaligned row stride).
func TestGemvMatchesCPU(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(41, 42))
	for _, c := range []struct{ wt, M, N, K, G int }{
		{1, 1, 13, 256, 1}, {1, 8, 130, 264, 1}, {1, 3, 9, 1000, 2}, {1, 5, 257, 40, 1},
		{2, 1, 130, 512, 1}, {2, 7, 128, 1024, 2}, {2, 2, 5, 40, 1}, {2, 8, 260, 384, 1},
		{0, 4, 21, 132, 1}, {0, 6, 17, 30, 1},
		// K past one pass of the block's lanes (the next chunk's weights
		// load during this one's: 1–2 rows), with a partial last pass
		{2, 1, 70, 4608, 1}, {1, 2, 33, 3072, 1}, {2, 2, 20, 4200, 1}, {0, 1, 9, 1300, 1},
	} {
		for _, round := range []int64{0, 1} {
			name := fmt.Sprintf("%+v/round%d", c, round)
			x := randn(r, c.M*c.G*c.K, 1)
			xr := x
			if round == 1 {
				xr = make([]float32, len(x))
				for i, v := range x {
					xr[i] = roundBF16(v)
				}
			}
			// one weight tensor for the G groups (fp8: N a multiple of 128,
			// so that each group has its own rows of block scales)
			W, S, sld, deqAll := gemvWeight(t, d, r, c.wt, c.G*c.N, c.K)
			want := make([]float32, c.G*c.M*c.N)
			for g := 0; g < c.G; g++ {
				xg := make([]float32, c.M*c.K)
				for m := 0; m < c.M; m++ {
					copy(xg[m*c.K:(m+1)*c.K], xr[(m*c.G+g)*c.K:(m*c.G+g+1)*c.K])
				}
				gemm.MatMulT(want[g*c.M*c.N:(g+1)*c.M*c.N], xg, c.M, c.K, deqAll[g*c.N*c.K:(g+1)*c.N*c.K], c.N)
			}
			var kernels []kc.GemmArgsKernel // each run's kernel
			run := func(x []float32, lda, M int) []float32 {
				X := upload(t, d, x)
				a := kc.GemmArgs{A: X.p, Lda: int64(lda), AGoff: int64(c.K), W: W.p, WType: int64(c.wt), Ws: S.p, WsLd: int64(sld),
					WGoff: int64(c.N * c.K), WsGoff: int64((c.N / 128) * sld), M: int64(M), N: int64(c.N), K: int64(c.K), Nout: int64(c.G), Batched: 1, ARound: round}
				outs := make([]buf, c.G)
				for g := range outs {
					outs[g] = poisoned[float32](t, d, M*c.N)
					a.Out[g], a.Ow[g] = outs[g].p, int64(c.N)
				}
				kn, grid, block := gemvPick(d.SMs, &a, M, 1, c.G)
				kernels = append(kernels, kn)
				launch(t, d, kn, grid, block, 0, &a)
				var got []float32
				for g := range outs {
					got = append(got, download[float32](t, outs[g])...)
				}
				return got
			}
			got := run(x, c.G*c.K, c.M)
			tol := 1e-5
			if round == 1 {
				tol = 1e-4 // float sums
			}
			require.Less(t, maxRelErr(t, got, want), tol, name)
			// the last row alone: the same bits on the same kernel (in
			// precision bf16 one row may take glmf_gemv where the batch took
			// the tensor-core GEMV: then both close to the CPU)
			last := run(x[(c.M-1)*c.G*c.K:], c.G*c.K, 1)
			sameKernel := kernels[len(kernels)-1] == kernels[len(kernels)-2]
			for g := 0; g < c.G; g++ {
				if sameKernel {
					require.Equal(t, got[(g*c.M+c.M-1)*c.N:(g*c.M+c.M)*c.N], last[g*c.N:(g+1)*c.N], "%s: row %d alone", name, c.M-1)
				} else {
					require.Less(t, maxRelErr(t, last[g*c.N:(g+1)*c.N], want[(g*c.M+c.M-1)*c.N:(g*c.M+c.M)*c.N]), tol, "%s: row %d alone on %s", name, c.M-1, kernels[len(kernels)-1])
				}
			}
			// an odd row stride (unaligned rows: the scalar path): the same bits
			lda := c.G*c.K + 1
			xu := make([]float32, c.M*lda)
			for m := 0; m < c.M; m++ {
				copy(xu[m*lda:], x[m*c.G*c.K:(m+1)*c.G*c.K])
			}
			mmaArgs := kc.GemmArgs{A: 4096, Lda: int64(c.G * c.K), AGoff: int64(c.K), W: 4096, WType: int64(c.wt), WGoff: int64(c.N * c.K), N: int64(c.N), K: int64(c.K), ARound: round}
			if kc.GemvMMAApplies(&mmaArgs) {
				// aligned rows ran on the tensor-core GEMV, unaligned ones
				// on glmf_gemv: both close to the CPU
				require.Less(t, maxRelErr(t, run(xu, lda, c.M), want), tol, "%s: unaligned rows", name)
			} else {
				require.Equal(t, got, run(xu, lda, c.M), "%s: unaligned rows", name)
			}
		}
	}
}

// fp8 decoding in the GEMV: every code (NaN codes too) times a power of
// two, an odd and a large scale (the unfolded products) is the CPU's
// value. Column n holds code n at k = 5, zeros elsewhere; x is one-hot at 5.
func TestGemvFP8Codes(t *testing.T) {
	d := openDevice(t)
	N, K := 256, 256
	codes := make([]byte, N*K)
	for n := 0; n < N; n++ {
		codes[n*K+5] = byte(n)
	}
	x := make([]float32, K)
	x[5] = 1
	X, W := upload(t, d, x), upload(t, d, codes)
	for _, s := range []float32{0.0078125, 0.3, 300} {
		for _, round := range []int64{0, 1} {
			S := upload(t, d, []float32{s, s, s, s})
			a := kc.GemmArgs{A: X.p, Lda: int64(K), W: W.p, WType: 2, Ws: S.p, WsLd: 2, M: 1, N: int64(N), K: int64(K), Nout: 1, ARound: round}
			out := poisoned[float32](t, d, N)
			a.Out[0], a.Ow[0] = out.p, int64(N)
			kn, grid, block := gemvPick(d.SMs, &a, 1, 1, 1)
			launch(t, d, kn, grid, block, 0, &a)
			got := download[float32](t, out)
			for n := 0; n < N; n++ {
				want := safetensors.F8E4M3ToFloat32(byte(n)) * s
				if math.IsNaN(float64(want)) {
					require.True(t, math.IsNaN(float64(got[n])), "code %#x scale %v", n, s)
					continue
				}
				require.Equal(t, want, got[n], "code %#x scale %v", n, s)
			}
		}
	}
}

// The one-row fp8 kernels (kc.GemvFP8Kernels) give the same bits: plain
// and dual (MoE gate and up, SwiGLU) weights, groups (plain weights; dual
// ones are MoE tiles' single group), N not a multiple of their columns, K
// tails and K of several passes of a block's lanes; they may stand in for
// glmf_gemv_f1 on fp8 weights only (kc.GemvFP8Applies; core/backend/cuda's
// GEMM policy says at which grids they do), the persistent one on
// kc.GemvGrid's grid.
func TestGemvFP8KernelsAgree(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(43, 44))
	for _, c := range []struct {
		N, K, G int
		dual    bool
	}{{130, 512, 1, false}, {128, 4608, 2, false}, {20, 4200, 1, false}, {256, 2048, 1, false}, {130, 512, 1, true}, {128, 4200, 1, true}} {
		x := randn(r, c.G*c.K, 1)
		for i, v := range x {
			x[i] = roundBF16(v)
		}
		X := upload(t, d, x)
		W, S, sld, _ := gemvWeight(t, d, r, 2, c.G*c.N, c.K)
		a := kc.GemmArgs{A: X.p, Lda: int64(c.G * c.K), AGoff: int64(c.K), W: W.p, WType: 2, Ws: S.p, WsLd: int64(sld),
			WGoff: int64(c.N * c.K), WsGoff: int64(((c.N + 127) / 128) * sld), M: 1, N: int64(c.N), K: int64(c.K), Nout: int64(c.G), Batched: 1, ARound: 1}
		if c.dual {
			W2, S2, _, _ := gemvWeight(t, d, r, 2, c.G*c.N, c.K)
			a.W2, a.Ws2, a.Limit = W2.p, S2.p, 7
		}
		kn, grid, block := kc.GemvSIMTLaunch(&a, 1, 1, c.G)
		require.Equal(t, kc.KernelGemvF1, kn, "no tiles")
		// run launches kernel k on grid g and returns the outputs' bits
		run := func(k kc.GemmArgsKernel, g kc.Dim3) []uint32 {
			bufs := make([]buf, c.G)
			for i := range bufs {
				bufs[i] = poisoned[float32](t, d, c.N)
				a.Out[i], a.Ow[i] = bufs[i].p, int64(c.N)
			}
			launch(t, d, k, g, block, 0, &a)
			var bits []uint32
			for i := range bufs {
				out := download[float32](t, bufs[i])
				for _, v := range out {
					require.False(t, math.IsNaN(float64(v)), "%+v: %s", c, k)
				}
				bits = append(bits, bitsOf(out)...)
			}
			return bits
		}
		var outs [][]uint32
		fp8Kernels := kc.GemvFP8Kernels()
		for _, k := range fp8Kernels {
			outs = append(outs, run(k, kc.GemvGrid(k, grid, d.SMs)))
		}
		for i := range outs[1:] {
			require.Equal(t, outs[0], outs[i+1], "%+v: %s against %s", c, fp8Kernels[i+1], fp8Kernels[0])
		}
		// the persistent kernel with 2 blocks along X, each taking many
		// groups (its loads run into the next group's)
		few := grid
		few.X = 2
		require.Equal(t, outs[0], run(kc.KernelGemvF1Fp8p, few), "%+v: glmf_gemv_f1_fp8p on 2 blocks", c)
	}
	a := kc.GemmArgs{WType: 2, ARound: 1, Tiles: 4096, N: 4096, K: 2048}
	kn, _, _ := kc.GemvSIMTLaunch(&a, 1, 9, 1)
	require.Equal(t, kc.KernelGemvF1, kn, "one-row fp8 MoE tiles: 4,608 blocks")
	require.True(t, kc.GemvFP8Applies(&a, kn), "the one-row fp8 kernels stand in")
	k, _, _ := gemvPick(d.SMs, &a, 1, 9, 1)
	require.Equal(t, kc.KernelGemvF1Fp8p, k, "the default policy's pick at 4,608 blocks")
	g := kc.GemvGrid(kc.KernelGemvF1Fp8p, kc.Dim3{X: 512, Y: 9, Z: 1}, d.SMs)
	require.EqualValues(t, 9, g.Y)
	require.LessOrEqual(t, int(g.X)*9, 4*d.SMs, "the persistent kernel's blocks all fit at once")
	per := (512 + int(g.X) - 1) / int(g.X)
	require.Less(t, (per-1)*int(g.X), 512, "every block takes %d or %d groups", per, per-1)
	a = kc.GemmArgs{WType: 2, ARound: 1, N: 4096, K: 12288}
	kn, _, _ = kc.GemvSIMTLaunch(&a, 1, 1, 1)
	require.Equal(t, kc.KernelGemvF1, kn, "512 blocks")
	k, _, _ = gemvPick(d.SMs, &a, 1, 1, 1)
	require.Equal(t, kc.KernelGemvF1, k, "the default policy's pick at 512 blocks")
	require.False(t, kc.GemvFP8Applies(&kc.GemmArgs{WType: 1, ARound: 1}, kc.KernelGemvF1), "bf16 weights")
	require.False(t, kc.GemvFP8Applies(&a, kc.KernelGemvF2), "two rows a pass")
	require.Equal(t, kc.Dim3{X: 512, Y: 9, Z: 1}, kc.GemvGrid(kc.KernelGemvF1, kc.Dim3{X: 512, Y: 9, Z: 1}, d.SMs), "only the persistent kernel's grid changes")
}
