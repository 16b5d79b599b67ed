package cuda_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// BenchmarkMoEExperts times the MoE expert GEMMs (gate+up with the SwiGLU,
// then down scaled and scattered; the plan and the combine are left out)
// of precision bf16 on the gpu preset's shapes (hidden 4096, expert
// intermediate 2048) at 4096 and 32768 routed rows (512 and 4096 tokens at
// top-8) over 16 and 288 experts, fp8 (128×128 block scales) and bf16
// weights: glmf_moe_mma_bf16 (tensor cores, 128-row tiles, x cast to bf16
// once and act kept in bf16: what bindMoEExperts runs; the cast is timed
// with it), glmf_moe_mma (the same reading fp32 x and act) and the SIMT
// glmf_gemm_tiled (64-row tiles, activations rounded to bf16) that ran
// before them. Metrics: µs per layer (both GEMMs) and TFLOP/s of the routed
// work 2·rows·3·D·I (padding of partial tiles not counted). Device time
// from CUDA events around a captured graph of reps layers. Run on a GPU:
//
//	go test -run - -bench MoEExperts ./kernels/cuda
func BenchmarkMoEExperts(b *testing.B) {
	d := openDevice(b)
	if d.Emulated {
		b.Skip("the emulator's timings mean nothing")
	}
	const D, I, topK = 4096, 2048, 8
	r := rand.New(rand.NewPCG(5, 6))
	for _, wt := range []int64{2, 1} {
		wname := map[int64]string{1: "bf16", 2: "fp8"}[wt]
		for _, E := range []int{16, 288} {
			ex := benchExpertWeights(b, d, r, wt, E, I, D)
			G, U, Dn, GS, US, DS, sldGU, sldD := ex.G, ex.U, ex.Dn, ex.GS, ex.US, ex.DS, ex.sldGU, ex.sldD
			for _, R := range []int{4096, 32768} {
				T := R / topK
				idx, w := make([]int32, R), make([]float32, R)
				for i := range idx {
					idx[i], w[i] = int32(r.IntN(E)), float32(r.Float64())
				}
				X := upload(b, d, randn(r, T*D, 1))
				Idx, Wt := upload(b, d, idx), upload(b, d, w)
				act, contrib := poisoned[float32](b, d, R*I), poisoned[float32](b, d, R*D)
				xb := poisoned[uint16](b, d, T*D)
				for _, kernel := range []string{"mma-bf16", "mma", "tiled"} {
					bm := kc.MoEMMARows
					if kernel == "tiled" {
						bm = 64
					}
					if kernel != "tiled" && !kc.MoEMMA(d) {
						continue
					}
					bf16A := kernel == "mma-bf16"
					aRound, A := int64(1), X.p
					if bf16A {
						aRound, A = 2, xb.p
					}
					nt := (R+bm-1)/bm + min(E, R)
					perm, tiles := poisoned[int32](b, d, R), poisoned[int32](b, d, 1+3*nt)
					pa := kc.PlanArgs{Idx: Idx.p, TK: int64(R), E: int64(E), Bm: int64(bm), Perm: perm.p, Tiles: tiles.p}
					gu := kc.GemmArgs{A: A, Lda: D, W: G.p, WType: wt, WGoff: I * D, W2: U.p, M: int64(R), N: I, K: D,
						Nout: 1, Tiles: tiles.p, Perm: perm.p, ADiv: topK, Limit: 7, ARound: aRound}
					gu.Out[0], gu.Ow[0] = act.p, I
					dn := kc.GemmArgs{A: act.p, Lda: I, W: Dn.p, WType: wt, WGoff: D * I, M: int64(R), N: D, K: I,
						Nout: 1, Tiles: tiles.p, Perm: perm.p, RowScale: Wt.p, Scatter: contrib.p, ARound: aRound}
					dn.Out[0], dn.Ow[0] = contrib.p, D
					if wt == 2 {
						gu.Ws, gu.Ws2, gu.WsLd, gu.WsGoff = GS.p, US.p, int64(sldGU), int64((I/128)*sldGU)
						dn.Ws, dn.WsLd, dn.WsGoff = DS.p, int64(sldD), int64((D/128)*sldD)
					}
					cast := kc.ToBF16Args{X: X.p, Out: xb.p, N: int64(T * D)}
					layer := func() error {
						if bf16A { // x to bf16 once, as bindMoEExperts does
							if err := kc.LaunchToBF16(d, kc.Dim3{X: uint32((T*D + 255) / 256)}, kc.Dim3{X: 256}, 0, &cast); err != nil {
								return err
							}
						}
						for _, g := range []*kc.GemmArgs{&gu, &dn} {
							name, grid, block := kc.MoEMMALaunch(int(g.N), nt, g.W2 != 0, bf16A)
							if kernel == "tiled" {
								name, grid, block = kc.KernelGemmTiled, kc.Dim3{X: uint32((g.N + 63) / 64), Y: uint32(nt)}, kc.Dim3{X: 256}
							}
							if err := name.Launch(d, grid, block, 0, g); err != nil {
								return err
							}
						}
						return nil
					}
					if err := d.Do(func() error {
						return kc.LaunchMoEPlan(d, kc.Dim3{X: 1}, kc.Dim3{X: 1024}, 0, &pa)
					}); err != nil {
						b.Fatal(err)
					}
					reps := 5
					if kernel == "tiled" {
						reps = 1
					}
					b.Run(fmt.Sprintf("%s/E%d/rows%d/%s", wname, E, R, kernel), func(b *testing.B) {
						us := deviceMicros(b, d, reps, true, layer)
						b.ReportMetric(us, "us/layer")
						b.ReportMetric(2*float64(R)*3*D*I/us/1e6, "TFLOP/s")
					})
				}
			}
		}
	}
}

// benchExpertWeights puts E copies of one expert's random gate, up (I×D)
// and down (D×I) weights of storage wt on the device (fp8 codes without
// NaNs; bf16 values of magnitude about 2^-7..2^0, either sign), with fp8
// block scales of 1/256: the weights of the MoE benchmarks.
func benchExpertWeights(b *testing.B, d *kc.Device, r *rand.Rand, wt int64, E, I, D int) benchExperts {
	esz := int64(I * D)
	if wt == 1 {
		esz *= 2
	}
	one := make([]byte, esz)
	for i := range one {
		c := byte(r.Uint32())
		if wt == 2 && c&0x7f == 0x7f {
			c = 0x3c
		}
		if wt == 1 && i%2 == 1 { // bf16 high byte
			c = 0x3c + byte(r.IntN(4)) | c&0x80
		}
		one[i] = c
	}
	src := upload(b, d, one)
	alloc := func() buf {
		var p kc.DevicePtr
		if err := d.Do(func() error {
			var err error
			if p, err = d.Alloc(int64(E) * esz); err != nil {
				return err
			}
			for e := 0; e < E; e++ {
				if err := d.Copy(p+kc.DevicePtr(int64(e)*esz), src.p, esz); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { d.Do(func() error { return d.Free(p, int64(E)*esz) }) }) //nolint:errcheck // cleanup
		return buf{d, p, int64(E) * esz}
	}
	scales := func(n int) buf {
		s := make([]float32, n)
		for i := range s {
			s[i] = 1.0 / 256
		}
		return upload(b, d, s)
	}
	ex := benchExperts{esz: esz, sldGU: (D + 127) / 128, sldD: (I + 127) / 128}
	ex.G, ex.U, ex.Dn = alloc(), alloc(), alloc()
	ex.GS, ex.US, ex.DS = scales(E*(I/128)*ex.sldGU), scales(E*(I/128)*ex.sldGU), scales(E*(D/128)*ex.sldD)
	return ex
}

// benchExperts are benchExpertWeights' buffers: the weights, their block
// scales, one expert's weight bytes and the scales' row lengths.
type benchExperts struct {
	G, U, Dn, GS, US, DS buf
	esz                  int64
	sldGU, sldD          int
}
