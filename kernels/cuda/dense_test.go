package cuda_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/glmflash/glmflash/kernels/act"
	kc "github.com/glmflash/glmflash/kernels/cuda"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/kernels/mhc"
	"github.com/glmflash/glmflash/kernels/norm"
	"github.com/stretchr/testify/require"
)

// The tiled GEMM and the GEMV against the CPU GEMM: bf16 and fp32 weights,
// odd shapes, split outputs and batched groups.
func TestGemmMatchesCPU(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range []struct {
		M, N, K int
		bf16    bool
		splits  []int
	}{{1, 7, 33, true, nil}, {2, 40, 64, true, []int{8, 32}}, {1, 33, 200, true, nil}, {2, 65, 968, true, nil}, {2, 9, 24, false, nil}, {3, 130, 65, false, nil}, {8, 64, 64, true, []int{10, 20, 34}}, {9, 70, 17, true, nil},
		{130, 200, 96, true, []int{64, 64, 64, 4, 2, 2}}, {65, 1, 300, false, nil}, {200, 67, 129, true, nil}} {
		x := randn(r, c.M*c.K, 1)
		wb, wf := toBF16(randn(r, c.N*c.K, 0.3))
		want := make([]float32, c.M*c.N)
		gemm.MatMulT(want, x, c.M, c.K, wf, c.N)
		X := upload(t, d, x)
		var W buf
		if c.bf16 {
			W = upload(t, d, wb)
		} else {
			W = upload(t, d, wf)
		}
		splits := c.splits
		if splits == nil {
			splits = []int{c.N}
		}
		a := kc.GemmArgs{A: X.p, Lda: int64(c.K), W: W.p, M: int64(c.M), N: int64(c.N), K: int64(c.K), Nout: int64(len(splits))}
		if c.bf16 {
			a.WType = 1
		}
		outs := make([]buf, len(splits))
		for i, s := range splits {
			outs[i] = poisoned[float32](t, d, c.M*s)
			a.Out[i], a.Ow[i] = outs[i].p, int64(s)
		}
		name, grid, block := kc.GemmLaunch(c.M, c.N, 1)
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
		require.Less(t, maxRelErr(t, got, want), 1e-5, "%+v", c)
	}
}

func TestGemmBatchedMatchesCPU(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(7, 8))
	for _, M := range []int{1, 5, 77} {
		G, N, K := 2, 40, 24
		x := randn(r, M*G*K, 1)
		wb, wf := toBF16(randn(r, G*N*K, 0.3))
		ys := [][]float32{make([]float32, M*N), make([]float32, M*N)}
		gemm.BatchedMatMulT(ys, x, M, K, wf, N)
		X, W := upload(t, d, x), upload(t, d, wb)
		o0, o1 := poisoned[float32](t, d, M*N), poisoned[float32](t, d, M*N)
		a := kc.GemmArgs{A: X.p, Lda: int64(G * K), AGoff: int64(K), W: W.p, WType: 1, WGoff: int64(N * K), M: int64(M), N: int64(N), K: int64(K), Nout: 2, Batched: 1}
		a.Out[0], a.Out[1], a.Ow[0], a.Ow[1] = o0.p, o1.p, int64(N), int64(N)
		name, grid, block := kc.GemmLaunch(M, N, 2)
		launch(t, d, name, grid, block, 0, &a)
		require.Less(t, maxRelErr(t, download[float32](t, o0), ys[0]), 1e-5)
		require.Less(t, maxRelErr(t, download[float32](t, o1), ys[1]), 1e-5)
	}
}

func TestSgemmMatchesCPU(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(9, 9))
	M, N, K := 37, 45, 29
	x, w := randn(r, M*K, 1), randn(r, N*K, 0.3)
	want := make([]float32, M*N)
	gemm.MatMulT(want, x, M, K, w, N)
	X, W, C := upload(t, d, x), upload(t, d, w), poisoned[float32](t, d, M*N)
	require.NoError(t, d.Do(func() error { return d.Sgemm(M, N, K, X.p, K, W.p, C.p, N) }))
	require.Less(t, maxRelErr(t, download[float32](t, C), want), 1e-5)
}

func TestNormsAndElementwiseMatchCPU(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(11, 12))
	rows, D := 7, 130
	x, wv, bv := randn(r, rows*D, 2), randn(r, D, 1), randn(r, D, 1)
	wb, wf := toBF16(wv)
	X, W, B := upload(t, d, x), upload(t, d, wb), upload(t, d, bv)
	want := make([]float32, rows*D)
	norm.RMSNorm(want, x, rows, D, wf, 1e-5)
	Y := poisoned[float32](t, d, rows*D)
	a := kc.NormArgs{X: X.p, W: W.p, WBf16: 1, Y: Y.p, Rows: int64(rows), D: int64(D), Eps: float64(float32(1e-5))}
	launch(t, d, kc.KernelRmsnorm, kc.Dim3{X: uint32(rows)}, kc.Dim3{X: 256}, 0, &a)
	require.Less(t, maxRelErr(t, download[float32](t, Y), want), 1e-6, "rmsnorm")

	norm.LayerNorm(want, x, rows, D, wf, bv, 1e-6)
	a = kc.NormArgs{X: X.p, W: W.p, WBf16: 1, B: B.p, Y: Y.p, Rows: int64(rows), D: int64(D), Eps: float64(float32(1e-6))}
	launch(t, d, kc.KernelLayernorm, kc.Dim3{X: uint32(rows)}, kc.Dim3{X: 256}, 0, &a)
	require.Less(t, maxRelErr(t, download[float32](t, Y), want), 1e-6, "layernorm")

	H, Dh := 10, 13 // rows·D = T·H·Dh with T = 7
	g := randn(r, rows*D, 2)
	gw := randn(r, Dh, 1)
	norm.GatedRMSNorm(want, x, g, rows, H, Dh, gw, 1e-5)
	G, GW := upload(t, d, g), upload(t, d, gw)
	ga := kc.GatedNormArgs{O: X.p, G: G.p, W: GW.p, Y: Y.p, Rows: int64(rows * H), Dh: int64(Dh), Eps: float64(float32(1e-5))}
	launch(t, d, kc.KernelGatedRmsnorm, kc.Dim3{X: uint32(rows * H)}, kc.Dim3{X: 128}, 0, &ga)
	require.Less(t, maxRelErr(t, download[float32](t, Y), want), 1e-6, "gated_rmsnorm")

	n := rows * D
	// the CUDA kernels evaluate exp in double: the CPU's exact (float64)
	// activations are their reference, not the float32 vector kernels
	act.SwiGLUExact(want, x, g, 3)
	e := kc.EltArgs{X: X.p, Y: G.p, Out: Y.p, N: int64(n), Op: 2, Limit: 3}
	launch(t, d, kc.KernelElementwise, kc.Dim3{X: uint32((n + 255) / 256)}, kc.Dim3{X: 256}, 0, &e)
	require.Less(t, maxRelErr(t, download[float32](t, Y), want), 1e-6, "swiglu")
	for i, v := range x[:n] {
		want[i] = act.Sigmoid(v)
	}
	e.Op = 0
	launch(t, d, kc.KernelElementwise, kc.Dim3{X: uint32((n + 255) / 256)}, kc.Dim3{X: 256}, 0, &e)
	require.Equal(t, want, download[float32](t, Y), "sigmoid")

	lb := -5.0
	Hk, Dk := 5, 26
	alog, dt := randn(r, Hk, 0.5), randn(r, Hk*Dk, 0.5)
	for _, withLB := range []bool{true, false} {
		var lbp *float64
		if withLB {
			lbp = &lb
		}
		act.KDAGateExact(want, x, rows, Hk, Dk, alog, dt, lbp)
		A, DT := upload(t, d, alog), upload(t, d, dt)
		ka := kc.KDAGateArgs{Z: X.p, Alog: A.p, Dt: DT.p, G: Y.p, T: int64(rows), H: int64(Hk), Dh: int64(Dk), Lb: lb}
		if withLB {
			ka.HasLb = 1
		}
		launch(t, d, kc.KernelKDAGate, kc.Dim3{X: uint32((n + 255) / 256)}, kc.Dim3{X: 256}, 0, &ka)
		require.Less(t, maxRelErr(t, download[float32](t, Y), want), 1e-6, "kda_gate lb=%v", withLB)
	}
}

// mHC pre, post and the fused post+pre against kernels/mhc, the fused
// kernels bit-equal to the unfused ones, and a token's bits independent of
// the batch.
func TestMHCMatchesCPU(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(13, 14))
	// hc_mult 4: one full group of 24 mixing rows, chunks of 64 d (96 and
	// 200: a partial last chunk; 4096 the model's, 4200 past the h values
	// glmf_mhc_mix holds in registers); 5: a full group and a
	// partial one (35 rows), chunks of 51 d; 16: twelve groups, 16 d. T
	// from 1 to past a tile of 8 tokens, and partial tiles.
	for _, c := range []struct{ T, H, D int }{{5, 4, 96}, {3, 5, 64}, {1, 4, 96}, {64, 4, 200}, {1, 4, 4096}, {2, 4, 4200}, {11, 16, 40}, {2, 1, 300}} {
		t.Run(fmt.Sprintf("T%d_H%d_D%d", c.T, c.H, c.D), func(t *testing.T) { mhcMatchesCPU(t, d, r, c.T, c.H, c.D, false) })
	}
	// the projection weights in fp32 (the kernels' vector loads of them)
	for _, c := range []struct{ T, H, D int }{{1, 4, 4096}, {5, 4, 96}, {3, 5, 64}} {
		t.Run(fmt.Sprintf("T%d_H%d_D%d_fp32", c.T, c.H, c.D), func(t *testing.T) { mhcMatchesCPU(t, d, r, c.T, c.H, c.D, true) })
	}
}

// mhcChunks mirrors core/backend/cuda's: chunks of 256/H d values.
func mhcChunks(H, D int) int { dc := 256 / H; return (D + dc - 1) / dc }

// mhcStage1 is the grid of the pre's first stage (glmf_mhc_pre or
// glmf_mhc_post_pre: kc.MHCPreKernel, kc.MHCPostPreKernel) or of its
// few-token variant (tok: kernel_tok, T < 8).
func mhcStage1(tok bool, T, H, D int) kc.Dim3 {
	if tok {
		return kc.Dim3{X: uint32((mhcChunks(H, D) + 7) / 8), Y: uint32(((2+H)*H + 7) / 8), Z: uint32(T)}
	}
	return kc.Dim3{X: uint32(mhcChunks(H, D)), Y: uint32((T + 7) / 8)}
}

// mhcPre runs the pre (stage 1 on X, stage 2) over T tokens, with the
// optional norm weight nw (0: none), stage 1 by the few-token variant if tok.
func mhcPre(t *testing.T, d *kc.Device, dp kc.MHCParams, T int, X kc.DevicePtr, nw kc.DevicePtr, tok bool) (h, post, comb []float32) {
	H, D := int(dp.H), int(dp.D)
	part := poisoned[float64](t, d, T*mhcChunks(H, D)*((2+H)*H+1))
	launch(t, d, kc.MHCPreKernel(tok), mhcStage1(tok, T, H, D), kc.Dim3{X: 256}, 0, &kc.MHCPreArgs{P: dp, X: X, Part: part.p, T: int64(T)})
	return mhcMix(t, d, dp, T, X, part.p, nw)
}

func mhcMix(t *testing.T, d *kc.Device, dp kc.MHCParams, T int, X, part, nw kc.DevicePtr) (h, post, comb []float32) {
	H, D := int(dp.H), int(dp.D)
	Hd, Pd, Cd := poisoned[float32](t, d, T*D), poisoned[float32](t, d, T*H), poisoned[float32](t, d, T*H*H)
	ma := kc.MHCMixArgs{P: dp, X: X, Part: part, H: Hd.p, Post: Pd.p, Comb: Cd.p, NormW: nw, NormEps: float64(float32(1e-5)), T: int64(T)}
	launch(t, d, kc.KernelMHCMix, kc.MHCMixGrid(T), kc.Dim3{X: 256}, 0, &ma)
	return download[float32](t, Hd), download[float32](t, Pd), download[float32](t, Cd)
}

func mhcMatchesCPU(t *testing.T, d *kc.Device, r *rand.Rand, T, H, D int, fp32Fn bool) {
	mix := (2 + H) * H
	fn, base, scale := randn(r, mix*H*D, 0.05), randn(r, mix, 0.5), []float32{0.9, 1.1, 1.3}
	fb, ff := toBF16(fn)
	prm := &mhc.Params{H: H, D: D, Fn: ff, Base: base, Scale: scale, NormEps: 1e-5, HCEps: 1e-6, Iterations: 20}
	X := randn(r, T*H*D, 1)
	h, post, comb := make([]float32, T*D), make([]float32, T*H), make([]float32, T*H*H)
	mhc.Pre(prm, h, post, comb, X, T)
	Base, Scale, Xd := upload(t, d, base), upload(t, d, scale), upload(t, d, X)
	dp := kc.MHCParams{FnBf16: 1, Base: Base.p, Scale: Scale.p, H: int64(H), D: int64(D), Iters: 20, NormEps: float64(float32(1e-5)), HcEps: float64(float32(1e-6))}
	if fp32Fn { // the same values (bf16-rounded) stored as fp32
		dp.Fn, dp.FnBf16 = upload(t, d, ff).p, 0
	} else {
		dp.Fn = upload(t, d, fb).p
	}
	gh, gp, gc := mhcPre(t, d, dp, T, Xd.p, 0, false)
	require.Less(t, maxRelErr(t, gh, h), 1e-5, "pre h")
	require.Less(t, maxRelErr(t, gp, post), 1e-5, "pre post")
	require.Less(t, maxRelErr(t, gc, comb), 1e-5, "pre comb")
	// batch invariance: the last token alone gives its bits in the batch,
	// by either variant of stage 1; below 8 tokens the few-token variant
	// gives the whole batch's bits too
	last := upload(t, d, X[(T-1)*H*D:])
	for _, tok := range []bool{false, true} {
		lh, lp, lc := mhcPre(t, d, dp, 1, last.p, 0, tok)
		require.Equal(t, gh[(T-1)*D:], lh, "h of the last token alone (few-token variant: %v)", tok)
		require.Equal(t, gp[(T-1)*H:], lp)
		require.Equal(t, gc[(T-1)*H*H:], lc)
	}
	if T < 8 {
		th, tp, tc := mhcPre(t, d, dp, T, Xd.p, 0, true)
		require.Equal(t, gh, th, "few-token variant")
		require.Equal(t, gp, tp)
		require.Equal(t, gc, tc)
	}

	o := randn(r, T*D, 1)
	out := make([]float32, T*H*D)
	mhc.Post(out, o, X, post, comb, T, H, D)
	Od := upload(t, d, o)
	Pin, Cin := upload(t, d, post), upload(t, d, comb)
	Outd := poisoned[float32](t, d, T*H*D)
	po := kc.MHCPostArgs{O: Od.p, R: Xd.p, Post: Pin.p, Comb: Cin.p, Out: Outd.p, T: int64(T), H: int64(H), D: int64(D)}
	launch(t, d, kc.KernelMHCPost, kc.Dim3{X: uint32((T*H*D + 255) / 256)}, kc.Dim3{X: 256}, 0, &po)
	unfusedOut := download[float32](t, Outd)
	require.Less(t, maxRelErr(t, unfusedOut, out), 1e-6, "post")

	// fused post+pre (+norm) = post, pre, rmsnorm kernels, bit for bit
	nw := randn(r, D, 1)
	NW := upload(t, d, nw)
	uh0, up, uc := mhcPre(t, d, dp, T, Outd.p, 0, false)
	Hn := upload(t, d, uh0)
	na := kc.NormArgs{X: Hn.p, W: NW.p, Y: Hn.p, Rows: int64(T), D: int64(D), Eps: float64(float32(1e-5))}
	launch(t, d, kc.KernelRmsnorm, kc.Dim3{X: uint32(T)}, kc.Dim3{X: 256}, 0, &na)
	uh := download[float32](t, Hn)
	// against the CPU's fused post+pre+norm
	want := mhc.PostPreArgs{Out: make([]float32, T*H*D), H2: make([]float32, T*D), Post2: make([]float32, T*H), Comb2: make([]float32, T*H*H),
		O: o, R: X, Post: post, Comb: comb, NormW: nw, NormEps: 1e-5}
	mhc.PostPre(prm, &want, T)
	require.Less(t, maxRelErr(t, uh, want.H2), 1e-5, "post+pre+norm h")
	require.Less(t, maxRelErr(t, up, want.Post2), 1e-5, "post+pre post")
	require.Less(t, maxRelErr(t, uc, want.Comb2), 1e-5, "post+pre comb")

	for _, tok := range []bool{false, true} {
		if tok && T >= 8 {
			continue
		}
		F := poisoned[float32](t, d, T*H*D)
		part := poisoned[float64](t, d, T*mhcChunks(H, D)*(mix+1))
		fa := kc.MHCPostPreArgs{P: dp, O: Od.p, R: Xd.p, Post: Pin.p, Comb: Cin.p, Out: F.p, Part: part.p, T: int64(T)}
		launch(t, d, kc.MHCPostPreKernel(tok), mhcStage1(tok, T, H, D), kc.Dim3{X: 256}, 0, &fa)
		fh, fp, fc := mhcMix(t, d, dp, T, F.p, part.p, NW.p)
		require.Equal(t, unfusedOut, download[float32](t, F), "few-token variant: %v", tok)
		require.Equal(t, uh, fh)
		require.Equal(t, up, fp)
		require.Equal(t, uc, fc)
	}
	require.False(t, math.IsNaN(float64(uh[0])))
}

// The column, skinny and tiled GEMMs give a row the same bits (the row's
// result does not depend on the batch size).
func TestGemmKernelsAgreeBitForBit(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(15, 16))
	for _, K := range []int{300, 256} { // scalar and 16-byte weight loads
		gemmKernelsAgree(t, d, r, 20, 70, K)
	}
}

func gemmKernelsAgree(t *testing.T, d *kc.Device, r *rand.Rand, M, N, K int) {
	x := randn(r, M*K, 1)
	wb, _ := toBF16(randn(r, N*K, 0.3))
	X, W := upload(t, d, x), upload(t, d, wb)
	a := kc.GemmArgs{A: X.p, Lda: int64(K), W: W.p, WType: 1, N: int64(N), K: int64(K), Nout: 1}
	run := func(rows int, want kc.GemmArgsKernel) []float32 {
		out := poisoned[float32](t, d, rows*N)
		a.M, a.Out[0], a.Ow[0] = int64(rows), out.p, int64(N)
		name, grid, block := kc.GemmLaunch(rows, N, 1)
		require.Equal(t, want, name)
		launch(t, d, name, grid, block, 0, &a)
		return download[float32](t, out)
	}
	tiled := run(M, kc.KernelGemmTiled)
	require.Equal(t, tiled[:8*N], run(8, kc.KernelGemmSkinny), "K=%d", K)
	require.Equal(t, tiled[:3*N], run(3, kc.KernelGemmSkinny), "K=%d", K)
	require.Equal(t, tiled[:2*N], run(2, kc.KernelGemmCol), "K=%d", K)
	require.Equal(t, tiled[:N], run(1, kc.KernelGemmCol), "K=%d", K)
}

// bf16 precision pieces: the cast rounds to nearest even like the CPU's
// conversion; cuBLAS's bf16 GEMM and the GEMM kernels with bf16-rounded
// inputs agree with the CPU GEMM on rounded inputs.
func TestBF16PrecisionPieces(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(31, 32))
	M, N, K := 19, 70, 130
	x := randn(r, M*K, 1)
	x[0], x[1] = 1.00390625, -3.0078125 // ties: round to even
	xr := make([]float32, len(x))
	for i, v := range x {
		xr[i] = roundBF16(v)
	}
	X := upload(t, d, x)
	B := poisoned[uint16](t, d, M*K)
	ca := kc.ToBF16Args{X: X.p, Out: B.p, N: int64(M * K)}
	launch(t, d, kc.KernelToBF16, kc.Dim3{X: uint32((M*K + 255) / 256)}, kc.Dim3{X: 256}, 0, &ca)
	for i, b := range download[uint16](t, B) {
		require.Equal(t, math.Float32bits(xr[i])>>16, uint32(b), "element %d (%v)", i, x[i])
	}
	wb, wf := toBF16(randn(r, N*K, 0.3))
	want := make([]float32, M*N)
	gemm.MatMulT(want, xr, M, K, wf, N)
	W := upload(t, d, wb)
	C := poisoned[float32](t, d, M*N)
	require.NoError(t, d.Do(func() error { return d.GemmBF16(M, N, K, B.p, K, W.p, K, C.p, N) }))
	require.Less(t, maxRelErr(t, download[float32](t, C), want), 1e-5, "cuBLAS bf16 GEMM")
	a := kc.GemmArgs{A: X.p, Lda: int64(K), W: W.p, WType: 1, M: int64(M), N: int64(N), K: int64(K), Nout: 1, ARound: 1}
	a.Out[0], a.Ow[0] = C.p, int64(N)
	launch(t, d, kc.KernelGemmTiled, kc.Dim3{X: uint32((N + 63) / 64), Y: uint32((M + 63) / 64)}, kc.Dim3{X: 256}, 0, &a)
	require.Less(t, maxRelErr(t, download[float32](t, C), want), 1e-6, "tiled, rounding as it reads")
}

// roundBF16 rounds to the nearest bfloat16, ties to even.
func roundBF16(v float32) float32 {
	u := math.Float32bits(v)
	u += 0x7fff + (u>>16)&1
	return math.Float32frombits(u & 0xffff0000)
}
