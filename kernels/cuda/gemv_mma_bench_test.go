package cuda_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// BenchmarkMoEDecodeGemv times one MoE expert layer of decode on the GEMV
// path of precision bf16 (tiles of ≤ kc.GemvRows rows; D 4096, I 2048,
// 288 experts, top-8 + the shared expert as a ninth slot) at 1, 8 and 64
// tokens: the tensor-core glmf_gemv_mma_* ("mma", what bindMoEExperts
// runs) against glmf_gemv_f* ("simt"), fp8 (block scales) and bf16
// experts. weightGB/s counts the bytes of the experts the routing touches
// (each read once a layer), the memory roofline's measure.
//
//	go test -run - -bench MoEDecodeGemv ./kernels/cuda
func BenchmarkMoEDecodeGemv(b *testing.B) {
	d := openDevice(b)
	if d.Emulated {
		b.Skip("the emulator's timings mean nothing")
	}
	const D, I, E, topK = 4096, 2048, 288, 9
	r := rand.New(rand.NewPCG(7, 8))
	for _, wt := range []int64{2, 1} {
		wname := map[int64]string{1: "bf16", 2: "fp8"}[wt]
		ex := benchExpertWeights(b, d, r, wt, E, I, D)
		G, U, Dn, GS, US, DS, sldGU, sldD, esz := ex.G, ex.U, ex.Dn, ex.GS, ex.US, ex.DS, ex.sldGU, ex.sldD, ex.esz
		for _, T := range []int{1, 8, 64} {
			R := T * topK
			idx, w := make([]int32, R), make([]float32, R)
			touched := map[int32]bool{}
			for t := 0; t < T; t++ {
				perm := r.Perm(E - 1)
				for k := 0; k < topK-1; k++ {
					idx[t*topK+k] = int32(perm[k])
				}
				idx[t*topK+topK-1] = E - 1 // the shared expert
				for k := 0; k < topK; k++ {
					w[t*topK+k] = float32(r.Float64())
					touched[idx[t*topK+k]] = true
				}
			}
			X := upload(b, d, randn(r, T*D, 1))
			Idx, Wt := upload(b, d, idx), upload(b, d, w)
			act, contrib := poisoned[float32](b, d, R*I), poisoned[float32](b, d, R*D)
			bm := kc.GemvRows
			nt := (R+bm-1)/bm + min(E, R)
			perm, tiles := poisoned[int32](b, d, R), poisoned[int32](b, d, 1+3*nt)
			pa := kc.PlanArgs{Idx: Idx.p, TK: int64(R), E: E, Bm: int64(bm), Perm: perm.p, Tiles: tiles.p}
			if err := d.Do(func() error { return kc.LaunchMoEPlan(d, kc.Dim3{X: 1}, kc.Dim3{X: 1024}, 0, &pa) }); err != nil {
				b.Fatal(err)
			}
			gu := kc.GemmArgs{A: X.p, Lda: D, W: G.p, WType: wt, WGoff: I * D, W2: U.p, M: int64(R), N: I, K: D,
				Nout: 1, Tiles: tiles.p, Perm: perm.p, ADiv: topK, Limit: 7, ARound: 1}
			gu.Out[0], gu.Ow[0] = act.p, I
			dn := kc.GemmArgs{A: act.p, Lda: I, W: Dn.p, WType: wt, WGoff: D * I, M: int64(R), N: D, K: I,
				Nout: 1, Tiles: tiles.p, Perm: perm.p, RowScale: Wt.p, Scatter: contrib.p, ARound: 1}
			dn.Out[0], dn.Ow[0] = contrib.p, D
			if wt == 2 {
				gu.Ws, gu.Ws2, gu.WsLd, gu.WsGoff = GS.p, US.p, int64(sldGU), int64((I/128)*sldGU)
				dn.Ws, dn.WsLd, dn.WsGoff = DS.p, int64(sldD), int64((D/128)*sldD)
			}
			wbytes := float64(len(touched)) * 3 * float64(esz)
			kernels := []string{"mma", "simt"}
			fp8 := map[string]kc.GemmArgsKernel{} // the one-row fp8 kernel of a simt-* line
			if wt == 2 && T == 1 {                // the one-row fp8 kernels, each
				kernels = []string{"mma"}
				for _, k := range kc.GemvFP8Kernels() {
					kernels = append(kernels, "simt-"+k.String())
					fp8["simt-"+k.String()] = k
				}
			}
			for _, kernel := range kernels {
				layer := func() error {
					for _, g := range []*kc.GemmArgs{&gu, &dn} {
						name, grid, block := kc.GemvSIMTLaunch(g, min(T, bm), nt, 1)
						if k, ok := fp8[kernel]; ok && kc.GemvFP8Applies(g, name) {
							name, grid = k, kc.GemvGrid(k, grid, d.SMs)
						}
						if kernel == "mma" {
							var ok bool
							if name, grid, block, ok = kc.GemvMMALaunch(g, nt, 1); !ok {
								return fmt.Errorf("the tensor-core GEMV does not apply")
							}
						}
						if err := name.Launch(d, grid, block, 0, g); err != nil {
							return err
						}
					}
					return nil
				}
				b.Run(fmt.Sprintf("%s/T%d/%s", wname, T, kernel), func(b *testing.B) {
					us := deviceMicros(b, d, 10, true, layer)
					b.ReportMetric(us, "us/layer")
					b.ReportMetric(wbytes/us/1e3, "weightGB/s")
				})
			}
		}
	}
}
