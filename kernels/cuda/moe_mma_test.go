package cuda_test

import (
	"math/rand/v2"
	"testing"

	kc "github.com/glmflash/glmflash/kernels/cuda"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/kernels/moe"
	"github.com/stretchr/testify/require"
)

// moeCase is one MoE expert layer on the device: x [T][D], routing, and
// expert weights stored as bf16 (wtype 1) or fp8 with block scales (2).
type moeCase struct {
	T, E, K, D, I int
	wtype         int64
	x             []float32
	idx           []int32
	w             []float32
	gate, up, dn  []byte // per expert, stacked: bf16 bits (little endian) or fp8 codes
	gs, us, ds    []float32
	sldGU, sldD   int
	// the bf16 weights the library path of precision bf16 uses (fp8:
	// glmf_fp8_to_bf16's values)
	gateB, upB, dnB []uint16
}

func bf16Bytes(b []uint16) []byte {
	out := make([]byte, 2*len(b))
	for i, v := range b {
		out[2*i], out[2*i+1] = byte(v), byte(v>>8)
	}
	return out
}

// newMoECase draws a case; `dead` experts get no routing slot.
func newMoECase(r *rand.Rand, T, E, K, D, I int, fp8, odd bool, dead int) *moeCase {
	c := &moeCase{T: T, E: E, K: K, D: D, I: I, wtype: 1, x: randn(r, T*D, 1)}
	if fp8 {
		c.wtype = 2
		for e := 0; e < E; e++ {
			g, gsc, sl, gdq := fp8Matrix(r, I, D, odd)
			u, usc, _, udq := fp8Matrix(r, I, D, odd)
			dn, dsc, sl2, ddq := fp8Matrix(r, D, I, odd)
			c.gate, c.up, c.dn = append(c.gate, g...), append(c.up, u...), append(c.dn, dn...)
			c.gs, c.us, c.ds = append(c.gs, gsc...), append(c.us, usc...), append(c.ds, dsc...)
			c.sldGU, c.sldD = sl, sl2
			for _, p := range []struct {
				dst *[]uint16
				src []float32
			}{{&c.gateB, gdq}, {&c.upB, udq}, {&c.dnB, ddq}} {
				b := make([]uint16, len(p.src))
				gemm.Float32sToBF16(b, p.src)
				*p.dst = append(*p.dst, b...)
			}
		}
	} else {
		c.gateB, _ = toBF16(randn(r, E*I*D, 0.2))
		c.upB, _ = toBF16(randn(r, E*I*D, 0.2))
		c.dnB, _ = toBF16(randn(r, E*D*I, 0.2))
		c.gate, c.up, c.dn = bf16Bytes(c.gateB), bf16Bytes(c.upB), bf16Bytes(c.dnB)
	}
	logits := randn(r, T*E, 1)
	for t := 0; t < T; t++ {
		for e := E - dead; e < E; e++ {
			logits[t*E+e] = -40
		}
	}
	c.idx, c.w = make([]int32, T*K), make([]float32, T*K)
	(&moe.Router{Experts: E, TopK: K, Groups: 1, TopKGroup: 1, Normalize: true, Scaling: 1, Bias: make([]float32, E)}).Route(c.idx, c.w, logits, T)
	return c
}

// cpu is the CPU's precision-bf16 result on the bf16 weights.
func (c *moeCase) cpu() []float32 {
	ex := &moe.Experts{N: c.E, D: c.D, I: c.I, Limit: 1.5, BF16Act: true}
	for e := 0; e < c.E; e++ {
		ex.GateB = append(ex.GateB, c.gateB[e*c.I*c.D:(e+1)*c.I*c.D])
		ex.UpB = append(ex.UpB, c.upB[e*c.I*c.D:(e+1)*c.I*c.D])
		ex.DownB = append(ex.DownB, c.dnB[e*c.D*c.I:(e+1)*c.D*c.I])
	}
	want := make([]float32, c.T*c.D)
	ex.Forward(want, c.x, c.idx, c.w, c.T, c.K)
	return want
}

// run computes the layer on the device in precision bf16: kernel "mma"
// (glmf_moe_mma, 128-row tiles, fp32 x and act), "mma-bf16"
// (glmf_moe_mma_bf16: x turned into bf16 by glmf_to_bf16 first, act kept
// in bf16) or "tiled", the existing path (64-row tiles on glmf_gemm_tiled
// rounding A to bf16, fp8 weights turned into bf16 by glmf_fp8_to_bf16
// first).
func (c *moeCase) run(t *testing.T, d *kc.Device, kernel string) []float32 {
	tiled, bf16A := kernel == "tiled", kernel == "mma-bf16"
	T, E, K, D, I := c.T, c.E, c.K, c.D, c.I
	TK := T * K
	bm := kc.MoEMMARows
	if tiled {
		bm = 64
	}
	maxTiles := (TK+bm-1)/bm + min(E, TK)
	X, G, U, Dn := upload(t, d, c.x), upload(t, d, c.gate), upload(t, d, c.up), upload(t, d, c.dn)
	wtype := c.wtype
	var GS, US, DS buf
	if wtype == 2 {
		GS, US, DS = upload(t, d, c.gs), upload(t, d, c.us), upload(t, d, c.ds)
		if tiled { // dequantize to bf16 on the device, as the library path does
			conv := func(W, S buf, N, Kd, sld int) buf {
				out := poisoned[uint16](t, d, E*N*Kd)
				for e := 0; e < E; e++ {
					a := kc.FP8ToBF16Args{W: W.p + kc.DevicePtr(e*N*Kd), Ws: S.p + kc.DevicePtr(4*e*((N+127)/128)*sld), WsLd: int64(sld),
						N: int64(N), K: int64(Kd), Out: out.p + kc.DevicePtr(2*e*N*Kd)}
					launch(t, d, kc.KernelFP8ToBF16, kc.Dim3{X: uint32((N*Kd + 255) / 256)}, kc.Dim3{X: 256}, 0, &a)
				}
				return out
			}
			G, U, Dn = conv(G, GS, I, D, c.sldGU), conv(U, US, I, D, c.sldGU), conv(Dn, DS, D, I, c.sldD)
			wtype = 1
		}
	}
	aRound := int64(1)
	if bf16A {
		xb := poisoned[uint16](t, d, T*D)
		a := kc.ToBF16Args{X: X.p, Out: xb.p, N: int64(T * D)}
		launch(t, d, kc.KernelToBF16, kc.Dim3{X: uint32((T*D + 255) / 256)}, kc.Dim3{X: 256}, 0, &a)
		X, aRound = xb, 2
	}
	Idx, Wt := upload(t, d, c.idx), upload(t, d, c.w)
	perm, tiles := poisoned[int32](t, d, TK), poisoned[int32](t, d, 1+3*maxTiles)
	act, contrib, y := poisoned[float32](t, d, TK*I), poisoned[float32](t, d, TK*D), poisoned[float32](t, d, T*D)
	pa := kc.PlanArgs{Idx: Idx.p, TK: int64(TK), E: int64(E), Bm: int64(bm), Perm: perm.p, Tiles: tiles.p}
	launch(t, d, kc.KernelMoEPlan, kc.Dim3{X: 1}, kc.Dim3{X: 1024}, 0, &pa)
	gu := kc.GemmArgs{A: X.p, Lda: int64(D), W: G.p, WType: wtype, WGoff: int64(I * D), W2: U.p, M: int64(TK), N: int64(I), K: int64(D),
		Nout: 1, Tiles: tiles.p, Perm: perm.p, ADiv: int64(K), Limit: 1.5, ARound: aRound}
	gu.Out[0], gu.Ow[0] = act.p, int64(I)
	dn := kc.GemmArgs{A: act.p, Lda: int64(I), W: Dn.p, WType: wtype, WGoff: int64(D * I), M: int64(TK), N: int64(D), K: int64(I),
		Nout: 1, Tiles: tiles.p, Perm: perm.p, RowScale: Wt.p, Scatter: contrib.p, ARound: aRound}
	dn.Out[0], dn.Ow[0] = contrib.p, int64(D)
	if wtype == 2 {
		gu.Ws, gu.Ws2, gu.WsLd, gu.WsGoff = GS.p, US.p, int64(c.sldGU), int64(len(c.gs)/E)
		dn.Ws, dn.WsLd, dn.WsGoff = DS.p, int64(c.sldD), int64(len(c.ds)/E)
	}
	for _, g := range []*kc.GemmArgs{&gu, &dn} {
		name, grid, block := kc.MoEMMALaunch(int(g.N), maxTiles, g.W2 != 0, bf16A)
		if tiled {
			name, grid, block = kc.KernelGemmTiled, kc.Dim3{X: uint32((g.N + 63) / 64), Y: uint32(maxTiles)}, kc.Dim3{X: 256}
		}
		launch(t, d, name, grid, block, 0, g)
	}
	ca := kc.CombineArgs{Contrib: contrib.p, Y: y.p, T: int64(T), K: int64(K), D: int64(D)}
	launch(t, d, kc.KernelMoECombine, kc.Dim3{X: uint32((T*D + 255) / 256)}, kc.Dim3{X: 256}, 0, &ca)
	return download[float32](t, y)
}

// glmf_moe_mma (tensor cores, fp32 sums of bf16 products) agrees with the
// bits of glmf_moe_mma_bf16 (the same on bf16 x and act), and with the
// CPU's precision-bf16 experts and with the existing path (the tiled
// kernel on glmf_fp8_to_bf16's weights) at shapes with row tails (experts
// whose rows are not a multiple of 128, a tile of fewer than 64 rows), N
// and K tails, unaligned rows (scalar loads), experts with no rows, bf16
// and fp8 weights (power-of-two and other block scales).
func TestMoEMMAMatchesCPU(t *testing.T) {
	d := openDevice(t)
	if !kc.MoEMMA(d) {
		t.Skip("glmf_moe_mma needs compute 9.0+")
	}
	r := rand.New(rand.NewPCG(41, 42))
	for _, k := range []struct {
		T, E, K, D, I int
		fp8, odd      bool
		dead          int
	}{
		{300, 4, 2, 136, 72, false, false, 0},
		{300, 4, 2, 33, 40, false, false, 1},
		{200, 8, 2, 256, 136, true, false, 3},
		{150, 3, 3, 128, 192, true, true, 0},
		{5, 6, 2, 64, 64, true, false, 2},
	} {
		c := newMoECase(r, k.T, k.E, k.K, k.D, k.I, k.fp8, k.odd, k.dead)
		want := c.cpu()
		got := c.run(t, d, "mma")
		ref := c.run(t, d, "tiled")
		require.Equal(t, got, c.run(t, d, "mma-bf16"), "%+v: bf16 x and act give the same bits", k)
		eCPU, eRef, eRefCPU := maxRelErr(t, got, want), maxRelErr(t, got, ref), maxRelErr(t, ref, want)
		t.Logf("%+v: mma vs cpu %.3g, mma vs tiled %.3g, tiled vs cpu %.3g", k, eCPU, eRef, eRefCPU)
		require.Less(t, eCPU, 1e-4, "%+v vs CPU", k)
		require.Less(t, eRef, 1e-4, "%+v vs the tiled kernel", k)
	}
}
