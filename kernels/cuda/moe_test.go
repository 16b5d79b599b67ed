package cuda_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	kc "github.com/glmflash/glmflash/kernels/cuda"
	"github.com/glmflash/glmflash/kernels/moe"
	"github.com/stretchr/testify/require"
)

func TestMoERouteMatchesCPU(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct{ T, E, K, G, TG int }{{1, 8, 2, 1, 1}, {37, 8, 2, 1, 1}, {70, 288, 8, 1, 1}, {33, 64, 6, 8, 3}, {9, 40, 8, 1, 1}, {3, 5, 5, 1, 1}, {6, 1024, 32, 1, 1}, {5, 33, 31, 1, 1}} {
		logits, bias := randn(r, c.T*c.E, 2), randn(r, c.E, 0.1)
		if c.E == 40 { // ties: the lower index wins, as the serial scan
			for i := range logits {
				logits[i] = float32(i%3) * 0.5
			}
			clear(bias)
		}
		rt := &moe.Router{Experts: c.E, TopK: c.K, Groups: c.G, TopKGroup: c.TG, Normalize: true, Scaling: 2.5, Bias: bias}
		wantIdx, wantW := make([]int32, c.T*c.K), make([]float32, c.T*c.K)
		rt.Route(wantIdx, wantW, logits, c.T)
		L, B := upload(t, d, logits), upload(t, d, bias)
		I, W := poisoned[int32](t, d, c.T*c.K), poisoned[float32](t, d, c.T*c.K)
		a := kc.RouteArgs{Logits: L.p, Bias: B.p, Idx: I.p, W: W.p, T: int64(c.T), E: int64(c.E), K: int64(c.K), G: int64(c.G), TG: int64(c.TG), Normalize: 1, Scaling: 2.5}
		launch(t, d, kc.KernelMoERoute, kc.Dim3{X: uint32((c.T + 63) / 64)}, kc.Dim3{X: 64}, 0, &a)
		require.Equal(t, wantIdx, download[int32](t, I), "%+v", c)
		require.Less(t, maxRelErr(t, download[float32](t, W), wantW), 1e-6, "%+v", c)
		if c.G == 1 { // the warp-per-token kernel: the same experts and weights
			I2, W2 := poisoned[int32](t, d, c.T*c.K), poisoned[float32](t, d, c.T*c.K)
			a.Idx, a.W = I2.p, W2.p
			launch(t, d, kc.KernelMoERouteWarp, kc.Dim3{X: uint32((c.T + 7) / 8)}, kc.Dim3{X: 256}, 0, &a)
			require.Equal(t, wantIdx, download[int32](t, I2), "warp kernel %+v", c)
			require.Equal(t, download[float32](t, W), download[float32](t, W2), "warp kernel %+v", c)
		}
	}
}

func TestMoEExpertsMatchCPU(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range []struct{ T, E, K, D, I int }{{1, 8, 2, 64, 32}, {130, 8, 2, 64, 32}, {67, 5, 3, 40, 72}, {300, 4, 2, 33, 17}} {
		x := randn(r, c.T*c.D, 1)
		gb, gf := toBF16(randn(r, c.E*c.I*c.D, 0.2))
		ub, uf := toBF16(randn(r, c.E*c.I*c.D, 0.2))
		db, df := toBF16(randn(r, c.E*c.D*c.I, 0.2))
		logits := randn(r, c.T*c.E, 1)
		idx, w := make([]int32, c.T*c.K), make([]float32, c.T*c.K)
		(&moe.Router{Experts: c.E, TopK: c.K, Groups: 1, TopKGroup: 1, Normalize: true, Scaling: 1, Bias: make([]float32, c.E)}).Route(idx, w, logits, c.T)
		ex := &moe.Experts{N: c.E, D: c.D, I: c.I, Limit: 1.5}
		for e := 0; e < c.E; e++ {
			ex.Gate = append(ex.Gate, gf[e*c.I*c.D:(e+1)*c.I*c.D])
			ex.Up = append(ex.Up, uf[e*c.I*c.D:(e+1)*c.I*c.D])
			ex.Down = append(ex.Down, df[e*c.D*c.I:(e+1)*c.D*c.I])
		}
		want := make([]float32, c.T*c.D)
		ex.Forward(want, x, idx, w, c.T, c.K)

		TK := c.T * c.K
		maxTiles := (TK+63)/64 + min(c.E, TK)
		X, G, U, Dn := upload(t, d, x), upload(t, d, gb), upload(t, d, ub), upload(t, d, db)
		Idx, Wt := upload(t, d, idx), upload(t, d, w)
		perm, tiles := poisoned[int32](t, d, TK), poisoned[int32](t, d, 1+3*maxTiles)
		act, contrib, y := poisoned[float32](t, d, TK*c.I), poisoned[float32](t, d, TK*c.D), poisoned[float32](t, d, c.T*c.D)
		pa := kc.PlanArgs{Idx: Idx.p, TK: int64(TK), E: int64(c.E), Bm: 64, Perm: perm.p, Tiles: tiles.p}
		launch(t, d, kc.KernelMoEPlan, kc.Dim3{X: 1}, kc.Dim3{X: 1024}, 0, &pa)
		gu := kc.GemmArgs{A: X.p, Lda: int64(c.D), W: G.p, WType: 1, WGoff: int64(c.I * c.D), W2: U.p, M: int64(TK), N: int64(c.I), K: int64(c.D),
			Nout: 1, Tiles: tiles.p, Perm: perm.p, ADiv: int64(c.K), Limit: 1.5}
		gu.Out[0], gu.Ow[0] = act.p, int64(c.I)
		launch(t, d, kc.KernelGemmTiled, kc.Dim3{X: uint32((c.I + 63) / 64), Y: uint32(maxTiles)}, kc.Dim3{X: 256}, 0, &gu)
		dn := kc.GemmArgs{A: act.p, Lda: int64(c.I), W: Dn.p, WType: 1, WGoff: int64(c.D * c.I), M: int64(TK), N: int64(c.D), K: int64(c.I),
			Nout: 1, Tiles: tiles.p, Perm: perm.p, RowScale: Wt.p, Scatter: contrib.p}
		launch(t, d, kc.KernelGemmTiled, kc.Dim3{X: uint32((c.D + 63) / 64), Y: uint32(maxTiles)}, kc.Dim3{X: 256}, 0, &dn)
		ca := kc.CombineArgs{Contrib: contrib.p, Y: y.p, T: int64(c.T), K: int64(c.K), D: int64(c.D)}
		launch(t, d, kc.KernelMoECombine, kc.Dim3{X: uint32((c.T*c.D + 255) / 256)}, kc.Dim3{X: 256}, 0, &ca)
		require.Less(t, maxRelErr(t, download[float32](t, y), want), 1e-5, "%+v", c)
	}
}

// glmf_moe_plan against a reference: tiles of at most bm rows in ascending
// expert order (expert, first place, rows), and each expert's places
// holding exactly its slots; invalid experts (-1, E) skipped. Up to 32
// slots run the one-warp plan, more the block's.
func TestMoEPlanMatchesReference(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(31, 32))
	for _, TK := range []int{1, 9, 17, 32, 33, 100} {
		for _, E := range []int{16, 288} {
			for _, bm := range []int{8, 64} {
				idx := make([]int32, TK)
				for i := range idx {
					idx[i] = int32(r.IntN(E))
					if i%11 == 5 {
						idx[i] = -1
					} else if i%13 == 7 {
						idx[i] = int32(E)
					}
				}
				cnt := make([]int, E)
				for _, e := range idx {
					if e >= 0 && int(e) < E {
						cnt[e]++
					}
				}
				var want []int32
				off := make([]int, E)
				p := 0
				for e := 0; e < E; e++ {
					off[e] = p
					for i := 0; i < cnt[e]; i += bm {
						want = append(want, int32(e), int32(p+i), int32(min(bm, cnt[e]-i)))
					}
					p += cnt[e]
				}
				Idx := upload(t, d, idx)
				perm, tiles := poisoned[int32](t, d, TK), poisoned[int32](t, d, 1+3*(TK+E))
				pa := kc.PlanArgs{Idx: Idx.p, TK: int64(TK), E: int64(E), Bm: int64(bm), Perm: perm.p, Tiles: tiles.p}
				launch(t, d, kc.KernelMoEPlan, kc.Dim3{X: 1}, kc.Dim3{X: 1024}, 0, &pa)
				got := download[int32](t, tiles)
				name := fmt.Sprintf("TK %d, E %d, bm %d", TK, E, bm)
				require.EqualValues(t, len(want)/3, got[0], name)
				require.Equal(t, want, got[1:1+len(want)], name)
				pg := download[int32](t, perm)
				for e := 0; e < E; e++ {
					var slots, placed []int32
					for s, x := range idx {
						if int(x) == e {
							slots = append(slots, int32(s))
						}
					}
					placed = append(placed, pg[off[e]:off[e]+cnt[e]]...)
					slices.Sort(placed)
					require.Equal(t, slots, placed, "%s: expert %d's places", name, e)
				}
			}
		}
	}
}
