package cuda_test

import (
	"math"
	"math/rand/v2"
	"testing"

	kc "github.com/glmflash/glmflash/kernels/cuda"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/kernels/moe"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/stretchr/testify/require"
)

// fp8Matrix is a random fp8 e4m3 matrix [n][k] with 128×128 block scales
// (every code but the NaN ones; scales powers of two or, with odd, not) and
// its dequantized float32 values as the CPU computes them.
func fp8Matrix(r *rand.Rand, n, k int, odd bool) (codes []byte, scales []float32, sld int, deq []float32) {
	codes = make([]byte, n*k)
	for i := range codes {
		c := byte(r.IntN(256))
		for c&0x7f == 0x7f {
			c = byte(r.IntN(256))
		}
		codes[i] = c
	}
	sld = (k + 127) / 128
	scales = make([]float32, (n+127)/128*sld)
	for i := range scales {
		scales[i] = float32(math.Ldexp(1, -8-r.IntN(3)))
		if odd {
			scales[i] *= 1 + float32(r.Float64())
		}
	}
	deq = make([]float32, n*k)
	for i := range deq {
		row, col := i/k, i%k
		deq[i] = safetensors.F8E4M3ToFloat32(codes[i]) * scales[(row/128)*sld+col/128]
	}
	return codes, scales, sld, deq
}

// Every GEMM kernel reads fp8 weights with their block scales as the CPU
// dequantizes them: the warp GEMV (vector and scalar paths, split
// outputs), the column, skinny and tiled kernels.
func TestGemmFP8MatchesCPU(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(21, 22))
	for _, c := range []struct {
		M, N, K int
		odd     bool
		splits  []int
	}{{1, 130, 256, false, nil}, {3, 200, 272, true, []int{72, 128}}, {8, 129, 40, false, nil}, {2, 17, 1000, true, nil}, {5, 300, 512, false, nil}, {40, 140, 160, true, nil}} {
		codes, scales, sld, deq := fp8Matrix(r, c.N, c.K, c.odd)
		x := randn(r, c.M*c.K, 1)
		want := make([]float32, c.M*c.N)
		gemm.MatMulT(want, x, c.M, c.K, deq, c.N)
		X, W, S := upload(t, d, x), upload(t, d, codes), upload(t, d, scales)
		splits := c.splits
		if splits == nil {
			splits = []int{c.N}
		}
		kernels := []string{"tiled"} // gemv: glmf_gemv_* (kc.GemvSIMTLaunch's pick)
		if c.M <= kc.GemvRows {
			kernels = append(kernels, "gemv", "skinny")
		}
		if c.M <= kc.ColMaxRows {
			kernels = append(kernels, "col")
		}
		for _, kernel := range kernels {
			a := kc.GemmArgs{A: X.p, Lda: int64(c.K), W: W.p, WType: 2, Ws: S.p, WsLd: int64(sld), M: int64(c.M), N: int64(c.N), K: int64(c.K), Nout: int64(len(splits))}
			outs := make([]buf, len(splits))
			for i, s := range splits {
				outs[i] = poisoned[float32](t, d, c.M*s)
				a.Out[i], a.Ow[i] = outs[i].p, int64(s)
			}
			var name kc.GemmArgsKernel
			var grid, block kc.Dim3
			switch kernel {
			case "gemv":
				name, grid, block = kc.GemvSIMTLaunch(&a, c.M, 1, 1)
			case "skinny":
				name, grid, block = launchShape(kc.KernelGemmSkinny, c.M, c.N)
			case "col":
				name, grid, block = launchShape(kc.KernelGemmCol, c.M, c.N)
			default:
				name, grid, block = launchShape(kc.KernelGemmTiled, c.M, c.N)
			}
			launch(t, d, name, grid, block, 0, &a)
			got := make([]float32, c.M*c.N)
			off := 0
			for i, s := range splits {
				o := download[float32](t, outs[i])
				for m := 0; m < c.M; m++ {
					copy(got[m*c.N+off:m*c.N+off+s], o[m*s:(m+1)*s])
				}
				off += s
			}
			require.Less(t, maxRelErr(t, got, want), 1e-5, "%s %+v", kernel, c)
		}
	}
}

// glmf_fp8_to_bf16 is the bf16 of the CPU's dequantized value (exact for
// power-of-two scales).
func TestFP8ToBF16(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(23, 24))
	for _, c := range []struct {
		odd    bool
		K      int
		kernel kc.FP8ToBF16ArgsKernel
		per    int // codes a thread
	}{{false, 260, kc.KernelFP8ToBF16, 1}, {true, 260, kc.KernelFP8ToBF16, 1},
		{false, 272, kc.KernelFP8ToBF16V16, 16}, {true, 272, kc.KernelFP8ToBF16V16, 16}} {
		N, K, odd := 150, c.K, c.odd
		codes, scales, sld, deq := fp8Matrix(r, N, K, odd)
		W, S, out := upload(t, d, codes), upload(t, d, scales), poisoned[uint16](t, d, N*K)
		a := kc.FP8ToBF16Args{W: W.p, Ws: S.p, WsLd: int64(sld), N: int64(N), K: int64(K), Out: out.p}
		launch(t, d, c.kernel, kc.Dim3{X: uint32((N*K/c.per + 255) / 256)}, kc.Dim3{X: 256}, 0, &a)
		got := download[uint16](t, out)
		want := make([]uint16, N*K)
		gemm.Float32sToBF16(want, deq)
		require.Equal(t, want, got, "%+v", c)
		if !odd {
			for i, v := range deq {
				require.Equal(t, v, math.Float32frombits(uint32(got[i])<<16), "element %d: a power-of-two scale keeps fp8 values exact in bf16", i)
			}
		}
	}
}

// The MoE experts with fp8 weights: the warp GEMV over tiles of at most 8
// rows (decode) and the tiled kernel over 64-row tiles agree with the CPU's
// experts on the dequantized weights.
func TestMoEExpertsFP8MatchCPU(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(25, 26))
	for _, c := range []struct{ T, E, K, D, I, bm int }{{1, 8, 2, 256, 128, 8}, {6, 5, 3, 128, 136, 8}, {70, 4, 2, 256, 128, 64}} {
		x := randn(r, c.T*c.D, 1)
		ex := &moe.Experts{N: c.E, D: c.D, I: c.I, Limit: 1.5}
		var gc, uc, dc []byte
		var gs, us, ds []float32
		var sldGU, sldD int
		for e := 0; e < c.E; e++ {
			g, gsc, sl, gdq := fp8Matrix(r, c.I, c.D, false)
			u, usc, _, udq := fp8Matrix(r, c.I, c.D, false)
			dn, dsc, sl2, ddq := fp8Matrix(r, c.D, c.I, false)
			gc, uc, dc = append(gc, g...), append(uc, u...), append(dc, dn...)
			gs, us, ds = append(gs, gsc...), append(us, usc...), append(ds, dsc...)
			sldGU, sldD = sl, sl2
			ex.Gate, ex.Up, ex.Down = append(ex.Gate, gdq), append(ex.Up, udq), append(ex.Down, ddq)
		}
		logits := randn(r, c.T*c.E, 1)
		idx, w := make([]int32, c.T*c.K), make([]float32, c.T*c.K)
		(&moe.Router{Experts: c.E, TopK: c.K, Groups: 1, TopKGroup: 1, Normalize: true, Scaling: 1, Bias: make([]float32, c.E)}).Route(idx, w, logits, c.T)
		want := make([]float32, c.T*c.D)
		ex.Forward(want, x, idx, w, c.T, c.K)

		TK := c.T * c.K
		maxTiles := (TK+c.bm-1)/c.bm + min(c.E, TK)
		X, G, U, Dn := upload(t, d, x), upload(t, d, gc), upload(t, d, uc), upload(t, d, dc)
		GS, US, DS := upload(t, d, gs), upload(t, d, us), upload(t, d, ds)
		Idx, Wt := upload(t, d, idx), upload(t, d, w)
		perm, tiles := poisoned[int32](t, d, TK), poisoned[int32](t, d, 1+3*maxTiles)
		act, contrib, y := poisoned[float32](t, d, TK*c.I), poisoned[float32](t, d, TK*c.D), poisoned[float32](t, d, c.T*c.D)
		pa := kc.PlanArgs{Idx: Idx.p, TK: int64(TK), E: int64(c.E), Bm: int64(c.bm), Perm: perm.p, Tiles: tiles.p}
		launch(t, d, kc.KernelMoEPlan, kc.Dim3{X: 1}, kc.Dim3{X: 1024}, 0, &pa)
		gu := kc.GemmArgs{A: X.p, Lda: int64(c.D), W: G.p, WType: 2, Ws: GS.p, Ws2: US.p, WsLd: int64(sldGU), WsGoff: int64(len(gs) / c.E),
			WGoff: int64(c.I * c.D), W2: U.p, M: int64(TK), N: int64(c.I), K: int64(c.D), Nout: 1, Tiles: tiles.p, Perm: perm.p, ADiv: int64(c.K), Limit: 1.5}
		gu.Out[0], gu.Ow[0] = act.p, int64(c.I)
		dn := kc.GemmArgs{A: act.p, Lda: int64(c.I), W: Dn.p, WType: 2, Ws: DS.p, WsLd: int64(sldD), WsGoff: int64(len(ds) / c.E),
			WGoff: int64(c.D * c.I), M: int64(TK), N: int64(c.D), K: int64(c.I), Nout: 1, Tiles: tiles.p, Perm: perm.p, RowScale: Wt.p, Scatter: contrib.p}
		dn.Out[0], dn.Ow[0] = contrib.p, int64(c.D)
		for _, g := range []*kc.GemmArgs{&gu, &dn} {
			name, grid, block := kc.KernelGemmTiled, kc.Dim3{X: uint32((g.N + 63) / 64), Y: uint32(maxTiles)}, kc.Dim3{X: 256}
			if c.bm == kc.GemvRows { // precision fp32: glmf_gemv_d*
				name, grid, block = kc.GemvSIMTLaunch(g, c.T, maxTiles, 1)
			}
			launch(t, d, name, grid, block, 0, g)
		}
		ca := kc.CombineArgs{Contrib: contrib.p, Y: y.p, T: int64(c.T), K: int64(c.K), D: int64(c.D)}
		launch(t, d, kc.KernelMoECombine, kc.Dim3{X: uint32((c.T*c.D + 255) / 256)}, kc.Dim3{X: 256}, 0, &ca)
		require.Less(t, maxRelErr(t, download[float32](t, y), want), 1e-5, "%+v", c)
	}
}
