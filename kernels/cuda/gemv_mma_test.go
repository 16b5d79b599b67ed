package cuda_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	kc "github.com/glmflash/glmflash/kernels/cuda"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/kernels/moe"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/stretchr/testify/require"
)

// mma_bf16_16816 (the tensor cores on a GPU, the emulator's scratch
// version here) and mma_bf16_16816_shfl compute a plain matrix product
// D = A·B + C from fragments in the PTX layout. Every slot of every
// fragment holds a distinct integer (exact in bf16, every sum exact in
// float), so a slot in the wrong place changes the bits.
func TestMMAFragmentLayout(t *testing.T) {
	d := openDevice(t)
	var A [16][16]float32
	var B [16][8]float32
	var C [16][8]float32
	for m := 0; m < 16; m++ {
		for k := 0; k < 16; k++ {
			A[m][k] = float32(m*16 + k + 1)
		}
		for n := 0; n < 8; n++ {
			C[m][n] = float32(1000 * (m*8 + n + 1))
		}
	}
	for k := 0; k < 16; k++ {
		for n := 0; n < 8; n++ {
			B[k][n] = float32(k*8 + n + 1)
			if (k+n)%3 == 0 {
				B[k][n] = -B[k][n]
			}
		}
	}
	bits := func(v float32) uint32 { return math.Float32bits(v) >> 16 }
	pair := func(lo, hi float32) uint32 { return bits(lo) | bits(hi)<<16 }
	a, b, c := make([]uint32, 128), make([]uint32, 64), make([]float32, 128)
	for l := 0; l < 32; l++ {
		g, q := l/4, l%4
		a[4*l+0] = pair(A[g][2*q], A[g][2*q+1])
		a[4*l+1] = pair(A[g+8][2*q], A[g+8][2*q+1])
		a[4*l+2] = pair(A[g][2*q+8], A[g][2*q+9])
		a[4*l+3] = pair(A[g+8][2*q+8], A[g+8][2*q+9])
		b[2*l+0] = pair(B[2*q][g], B[2*q+1][g])
		b[2*l+1] = pair(B[2*q+8][g], B[2*q+9][g])
		c[4*l+0], c[4*l+1] = C[g][2*q], C[g][2*q+1]
		c[4*l+2], c[4*l+3] = C[g+8][2*q], C[g+8][2*q+1]
	}
	want := make([]float32, 128)
	for l := 0; l < 32; l++ {
		g, q := l/4, l%4
		for i := 0; i < 4; i++ {
			m, n := g+8*(i/2), 2*q+i%2
			s := C[m][n]
			for k := 0; k < 16; k++ {
				s += A[m][k] * B[k][n]
			}
			want[4*l+i] = s
		}
	}
	Ab, Bb, Cb := upload(t, d, a), upload(t, d, b), upload(t, d, c)
	D1, D2 := poisoned[float32](t, d, 128), poisoned[float32](t, d, 128)
	args := kc.MMATestArgs{A: Ab.p, B: Bb.p, C: Cb.p, D: D1.p, D2: D2.p}
	launch(t, d, kc.KernelTestMMA, kc.Dim3{X: 1}, kc.Dim3{X: 32}, 0, &args)
	require.Equal(t, want, download[float32](t, D1), "mma_bf16_16816")
	require.Equal(t, want, download[float32](t, D2), "mma_bf16_16816_shfl")
}

// glmf_gemv_mma_* (every variant) against the CPU's precision-bf16 GEMM
// (activations rounded to bf16, float sums; fp8 weights dequantized with
// their scales) for fp8 (every code but NaN: zeros, subnormals; power-of-two,
// odd and ≥ 2^7 block scales; a weight of only zero, subnormal and
// exponent-1 codes) and bf16 weights, 1–8 rows (and 11: two
// passes), N not a multiple of the block's columns, K a multiple of 64 but
// not of 128, groups with batched outputs, split outputs; a row alone
// gives the batch's bits.
func TestGemvMMAMatchesCPU(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(51, 52))
	for _, c := range []struct {
		wt, M, N, K, G int
		scale          float32 // fp8: multiplies the block scales
		splits         []int
	}{
		{2, 1, 40, 192, 1, 1, nil}, {2, 2, 130, 64, 1, 1, nil}, {2, 3, 256, 320, 2, 1, nil}, {2, 4, 17, 128, 1, 65536, nil},
		{2, 5, 72, 448, 1, 1, []int{8, 40, 24}}, {2, 6, 128, 256, 1, 40000, nil}, {2, 7, 33, 64, 1, 1, nil}, {2, 8, 200, 384, 1, 1, nil},
		{2, 11, 48, 192, 1, 1, nil},
		{1, 1, 40, 192, 1, 1, nil}, {1, 2, 100, 64, 2, 1, nil}, {1, 4, 33, 256, 1, 1, []int{1, 32}}, {1, 8, 130, 320, 1, 1, nil}, {1, 11, 20, 128, 1, 1, nil},
	} {
		x := randn(r, c.M*c.G*c.K, 1)
		xr := make([]float32, len(x))
		for i, v := range x {
			xr[i] = roundBF16(v)
		}
		var W, S buf
		sld := 0
		var deq []float32
		if c.wt == 2 {
			// each group its own block rows of scales: pad N to 128 a group
			np := (c.N + 127) / 128 * 128
			var codes []byte
			var scales []float32
			for g := 0; g < c.G; g++ {
				cg, sg, sl, dg := fp8Matrix(r, np, c.K, g%2 == 1)
				if c.M == 7 { // only zeros, subnormals and exponent 1 (the exact slow path)
					for i := range cg {
						cg[i] &= 0x8f
						dg[i] = safetensors.F8E4M3ToFloat32(cg[i]) * sg[(i/c.K/128)*sl+(i%c.K)/128]
					}
				}
				for i := range sg {
					sg[i] *= c.scale
				}
				for i := range dg {
					dg[i] *= c.scale
				}
				codes, scales, sld, deq = append(codes, cg...), append(scales, sg...), sl, append(deq, dg...)
			}
			W, S = upload(t, d, codes), upload(t, d, scales)
			// the unpadded weight: rows [g·np, g·np+N)
			d2 := make([]float32, 0, c.G*c.N*c.K)
			for g := 0; g < c.G; g++ {
				d2 = append(d2, deq[g*np*c.K:(g*np+c.N)*c.K]...)
			}
			deq = d2
		} else {
			wb, wf := toBF16(randn(r, c.G*c.N*c.K, 0.3))
			W, deq = upload(t, d, wb), wf
		}
		want := make([]float32, c.G*c.M*c.N)
		for g := 0; g < c.G; g++ {
			xg := make([]float32, c.M*c.K)
			for m := 0; m < c.M; m++ {
				copy(xg[m*c.K:(m+1)*c.K], xr[(m*c.G+g)*c.K:(m*c.G+g+1)*c.K])
			}
			gemm.MatMulT(want[g*c.M*c.N:(g+1)*c.M*c.N], xg, c.M, c.K, deq[g*c.N*c.K:(g+1)*c.N*c.K], c.N)
		}
		wgoff := c.N * c.K
		if c.wt == 2 {
			wgoff = (c.N + 127) / 128 * 128 * c.K
		}
		for _, v := range []string{"t1", "t2", "t1k"} {
			name := fmt.Sprintf("%+v/%s", c, v)
			run := func(x []float32, M int) []float32 {
				X := upload(t, d, x)
				a := kc.GemmArgs{A: X.p, Lda: int64(c.G * c.K), AGoff: int64(c.K), W: W.p, WType: int64(c.wt), Ws: S.p, WsLd: int64(sld),
					WGoff: int64(wgoff), WsGoff: int64((c.N + 127) / 128 * sld), M: int64(M), N: int64(c.N), K: int64(c.K), ARound: 1}
				var outs []buf
				if c.G > 1 || c.splits == nil {
					a.Nout, a.Batched = int64(c.G), 1
					for g := 0; g < c.G; g++ {
						outs = append(outs, poisoned[float32](t, d, M*c.N))
						a.Out[g], a.Ow[g] = outs[g].p, int64(c.N)
					}
				} else {
					a.Nout = int64(len(c.splits))
					for i, s := range c.splits {
						outs = append(outs, poisoned[float32](t, d, M*s))
						a.Out[i], a.Ow[i] = outs[i].p, int64(s)
					}
				}
				require.True(t, kc.GemvMMAApplies(&a), name)
				cols := map[string]int{"t1": 16, "t2": 32, "t1k": 16}[v]
				warps := map[string]int{"t1": kc.GemvMMAWarps, "t2": kc.GemvMMAWarps, "t1k": kc.GemvMMAWarpsK}[v]
				w := map[int]string{1: "b16", 2: "f8"}[c.wt]
				k, ok := kc.GemvMMAKernel(w, v)
				require.True(t, ok, "%s %s", w, v)
				launch(t, d, k, kc.Dim3{X: uint32((c.N + cols - 1) / cols), Y: 1, Z: uint32(c.G)}, kc.Dim3{X: uint32(32 * warps)}, 0, &a)
				got := make([]float32, c.G*M*c.N)
				if a.Batched == 1 {
					for g := range outs {
						copy(got[g*M*c.N:], download[float32](t, outs[g]))
					}
				} else {
					off := 0
					for i, s := range c.splits {
						o := download[float32](t, outs[i])
						for m := 0; m < M; m++ {
							copy(got[m*c.N+off:m*c.N+off+s], o[m*s:(m+1)*s])
						}
						off += s
					}
				}
				return got
			}
			got := run(x, c.M)
			require.Less(t, maxRelErr(t, got, want), 1e-4, name)
			last := run(x[(c.M-1)*c.G*c.K:], 1)
			for g := 0; g < c.G; g++ {
				require.Equal(t, got[(g*c.M+c.M-1)*c.N:(g*c.M+c.M)*c.N], last[g*c.N:(g+1)*c.N], "%s: row %d alone", name, c.M-1)
			}
		}
	}
}

// The tensor-core kernels apply exactly where they can run (precision
// bf16, fp8 or bf16 weights, K a multiple of 64, aligned pointers and
// strides); where they pay is core/backend/cuda's GEMM policy's to say
// (its TestGEMMPolicyGemv), which gemvPick mirrors.
func TestGemvMMALaunchChoice(t *testing.T) {
	base := kc.GemmArgs{A: 256, Lda: 128, W: 4096, WType: 2, N: 100, K: 128, ARound: 1}
	for _, c := range []struct {
		mod  func(a *kc.GemmArgs)
		want bool
	}{
		{func(a *kc.GemmArgs) {}, true},
		{func(a *kc.GemmArgs) { a.WType = 1 }, true},
		{func(a *kc.GemmArgs) { a.WType = 0 }, false},
		{func(a *kc.GemmArgs) { a.ARound = 0 }, false},
		{func(a *kc.GemmArgs) { a.ARound = 2 }, false},
		{func(a *kc.GemmArgs) { a.K = 96 }, false},
		{func(a *kc.GemmArgs) { a.Lda = 130 }, false},
		{func(a *kc.GemmArgs) { a.A += 4 }, false},
		{func(a *kc.GemmArgs) { a.W += 8 }, false},
		{func(a *kc.GemmArgs) { a.W2 = 4104 }, false},
		{func(a *kc.GemmArgs) { a.AGoff = 2 }, false},
		{func(a *kc.GemmArgs) { a.WGoff = 8 }, false},
		{func(a *kc.GemmArgs) { a.WType, a.WGoff = 1, 8 }, true},
	} {
		a := base
		c.mod(&a)
		require.Equal(t, c.want, kc.GemvMMAApplies(&a), "%+v", a)
		k, _, _, ok := kc.GemvMMALaunch(&a, 1, 1)
		require.Equal(t, c.want, ok, "%+v", a)
		if ok {
			require.True(t, strings.HasPrefix(k.String(), "glmf_gemv_mma_"), "%+v: %s", a, k)
		}
		for _, rows := range []int{1, 2, 5, 8} {
			k, _, _ := gemvPick(132, &a, rows, 1, 1)
			pays := rows >= 2
			if a.WType == 2 {
				pays = rows >= 6
			}
			require.Equal(t, c.want && pays, strings.HasPrefix(k.String(), "glmf_gemv_mma_"), "%+v rows %d: %s", a, rows, k)
		}
	}
}

// The MoE experts on the GEMV (tiles of ≤ 8 rows) in precision bf16:
// the tensor-core kernels (dual gate/up with the clamped SwiGLU, down
// scaled and scattered) agree with the CPU's precision-bf16 experts and
// with glmf_gemv_f*, on fp8 (power-of-two and odd scales) and bf16
// experts, with experts of no rows and tiles of fewer than 8 rows.
func TestMoEGemvMMAMatchesCPU(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(53, 54))
	for _, k := range []struct {
		T, E, K, D, I int
		fp8, odd      bool
		dead          int
	}{
		{1, 8, 2, 128, 192, true, false, 0},
		{5, 6, 3, 192, 64, true, true, 2},
		{12, 4, 2, 64, 128, true, false, 1},
		{3, 5, 2, 128, 64, false, false, 1},
	} {
		c := newMoECase(r, k.T, k.E, k.K, k.D, k.I, k.fp8, k.odd, k.dead)
		ex := &moe.Experts{N: c.E, D: c.D, I: c.I, Limit: 1.5, BF16Act: true}
		if k.fp8 {
			fp8 := func(codes []byte, s []float32, e, N, K int) *gemm.FP8 {
				nb, sl := (N+127)/128, (K+127)/128
				return &gemm.FP8{Codes: codes[e*N*K : (e+1)*N*K], Scales: s[e*nb*sl : (e+1)*nb*sl], BlockRows: 128, BlockCols: 128, ScaleCols: sl}
			}
			for e := 0; e < c.E; e++ {
				ex.GateF8 = append(ex.GateF8, fp8(c.gate, c.gs, e, c.I, c.D))
				ex.UpF8 = append(ex.UpF8, fp8(c.up, c.us, e, c.I, c.D))
				ex.DownF8 = append(ex.DownF8, fp8(c.dn, c.ds, e, c.D, c.I))
			}
		} else {
			for e := 0; e < c.E; e++ {
				ex.GateB = append(ex.GateB, c.gateB[e*c.I*c.D:(e+1)*c.I*c.D])
				ex.UpB = append(ex.UpB, c.upB[e*c.I*c.D:(e+1)*c.I*c.D])
				ex.DownB = append(ex.DownB, c.dnB[e*c.D*c.I:(e+1)*c.D*c.I])
			}
		}
		want := make([]float32, c.T*c.D)
		ex.Forward(want, c.x, c.idx, c.w, c.T, c.K)
		got := c.runGemv(t, d, true)
		simt := c.runGemv(t, d, false)
		eCPU, eSIMT := maxRelErr(t, got, want), maxRelErr(t, got, simt)
		t.Logf("%+v: mma vs cpu %.3g, mma vs glmf_gemv %.3g", k, eCPU, eSIMT)
		require.Less(t, eCPU, 1e-4, "%+v vs CPU", k)
		require.Less(t, eSIMT, 1e-4, "%+v vs glmf_gemv", k)
	}
}

// The one-row fp8 kernels (kc.GemvFP8Kernels) give the same bits on MoE
// tiles too (the gate and up pair with SwiGLU, the down projection's
// scaled scatter): one row a tile (the persistent kernel's pipelined path,
// K of one and of two chunks a thread), several (its per-group path), and
// the persistent kernel on grids of a few blocks, each taking many groups.
func TestMoEGemvFP8KernelsAgree(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(63, 64))
	for _, k := range []struct{ T, E, K, D, I int }{{1, 8, 2, 4096, 256}, {1, 6, 3, 128, 192}, {3, 5, 2, 128, 64}} {
		c := newMoECase(r, k.T, k.E, k.K, k.D, k.I, true, false, 0)
		want := c.runGemvWith(t, d, "", kc.KernelGemvF1, 0)
		for _, kn := range kc.GemvFP8Kernels()[1:] {
			for _, gx := range []uint32{0, 1, 3} {
				if gx > 0 && kn != kc.KernelGemvF1Fp8p {
					continue
				}
				got := c.runGemvWith(t, d, "", kn, gx)
				require.Equal(t, bitsOf(want), bitsOf(got), "%+v: %s (grid x %d) against glmf_gemv_f1", k, kn, gx)
			}
		}
	}
}

func bitsOf(v []float32) []uint32 {
	b := make([]uint32, len(v))
	for i, x := range v {
		b[i] = math.Float32bits(x)
	}
	return b
}

// runGemv computes the layer on the GEMV path of precision bf16 (tiles of
// kc.GemvRows rows): the tensor-core kernels (mma) or glmf_gemv_f*.
func (c *moeCase) runGemv(t *testing.T, d *kc.Device, mma bool) []float32 {
	if mma {
		return c.runGemvWith(t, d, "mma", 0, 0)
	}
	return c.runGemvWith(t, d, "", 0, 0)
}

// runGemvWith is runGemv on path "mma" (the tensor-core kernels) or ""
// (glmf_gemv_*): kc.GemvSIMTLaunch's pick, or (kernel not 0) that kernel
// on its kc.GemvGrid or, gridX > 0, that many blocks along X.
func (c *moeCase) runGemvWith(t *testing.T, d *kc.Device, path string, kernel kc.GemmArgsKernel, gridX uint32) []float32 {
	mma := path == "mma"
	T, E, K, D, I := c.T, c.E, c.K, c.D, c.I
	TK := T * K
	bm := kc.GemvRows
	maxTiles := (TK+bm-1)/bm + min(E, TK)
	X, G, U, Dn := upload(t, d, c.x), upload(t, d, c.gate), upload(t, d, c.up), upload(t, d, c.dn)
	Idx, Wt := upload(t, d, c.idx), upload(t, d, c.w)
	perm, tiles := poisoned[int32](t, d, TK), poisoned[int32](t, d, 1+3*maxTiles)
	act, contrib, y := poisoned[float32](t, d, TK*I), poisoned[float32](t, d, TK*D), poisoned[float32](t, d, T*D)
	pa := kc.PlanArgs{Idx: Idx.p, TK: int64(TK), E: int64(E), Bm: int64(bm), Perm: perm.p, Tiles: tiles.p}
	launch(t, d, kc.KernelMoEPlan, kc.Dim3{X: 1}, kc.Dim3{X: 1024}, 0, &pa)
	gu := kc.GemmArgs{A: X.p, Lda: int64(D), W: G.p, WType: c.wtype, WGoff: int64(I * D), W2: U.p, M: int64(TK), N: int64(I), K: int64(D),
		Nout: 1, Tiles: tiles.p, Perm: perm.p, ADiv: int64(K), Limit: 1.5, ARound: 1}
	gu.Out[0], gu.Ow[0] = act.p, int64(I)
	dn := kc.GemmArgs{A: act.p, Lda: int64(I), W: Dn.p, WType: c.wtype, WGoff: int64(D * I), M: int64(TK), N: int64(D), K: int64(I),
		Nout: 1, Tiles: tiles.p, Perm: perm.p, RowScale: Wt.p, Scatter: contrib.p, ARound: 1}
	dn.Out[0], dn.Ow[0] = contrib.p, int64(D)
	if c.wtype == 2 {
		GS, US, DS := upload(t, d, c.gs), upload(t, d, c.us), upload(t, d, c.ds)
		gu.Ws, gu.Ws2, gu.WsLd, gu.WsGoff = GS.p, US.p, int64(c.sldGU), int64(len(c.gs)/E)
		dn.Ws, dn.WsLd, dn.WsGoff = DS.p, int64(c.sldD), int64(len(c.ds)/E)
	}
	for _, g := range []*kc.GemmArgs{&gu, &dn} {
		name, grid, block := kc.GemvSIMTLaunch(g, min(T, bm), maxTiles, 1)
		if kernel != 0 && !mma {
			cols := int64(kc.GemvCols(g)) // one group a block along X, then the kernel's grid
			name, grid = kernel, kc.GemvGrid(kernel, kc.Dim3{X: uint32((g.N + cols - 1) / cols), Y: uint32(maxTiles), Z: 1}, d.SMs)
			if gridX > 0 {
				grid.X = gridX
			}
		}
		if mma {
			var ok bool
			name, grid, block, ok = kc.GemvMMALaunch(g, maxTiles, 1)
			require.True(t, ok, "the tensor-core GEMV applies")
		}
		launch(t, d, name, grid, block, 0, g)
	}
	ca := kc.CombineArgs{Contrib: contrib.p, Y: y.p, T: int64(T), K: int64(K), D: int64(D)}
	launch(t, d, kc.KernelMoECombine, kc.Dim3{X: uint32((T*D + 255) / 256)}, kc.Dim3{X: 256}, 0, &ca)
	return download[float32](t, y)
}
