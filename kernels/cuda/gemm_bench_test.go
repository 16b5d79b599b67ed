package cuda_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// BenchmarkGemmDecode times the GEMM kernels on decode shapes (few rows, a
// bf16 weight) beside two peers measured in the same run: cuBLAS's bf16
// tensor-core GEMM (bf16 activations: less exact than our fp32-parity
// kernels, so the faster bound) and a device-to-device copy of the weight's
// bytes (the memory roofline). Each figure is the device time per launch
// from CUDA events around a captured graph of `reps` launches, so host
// launch overhead is excluded (copies run in a row: their size hides it). Metrics: µs per launch and the weight bytes
// streamed per second (GB/s). Run with `make test-gpu` or:
//
//	go test -run - -bench GemmDecode ./kernels/cuda
func BenchmarkGemmDecode(b *testing.B) {
	d := openDevice(b)
	if d.Emulated {
		b.Skip("the emulator's timings mean nothing")
	}
	const reps = 50
	r := rand.New(rand.NewPCG(1, 2))
	for _, s := range []struct {
		name string
		N, K int
	}{{"lm_head", 32000, 1024}, {"square", 1024, 1024}, {"wide", 4096, 1024}, {"narrow", 1024, 4096}} {
		wb, _ := toBF16(randn(r, s.N*s.K, 0.3))
		W := upload(b, d, wb)
		x := randn(r, 8*s.K, 1)
		xb, _ := toBF16(x)
		X, XB := upload(b, d, x), upload(b, d, xb)
		out := poisoned[float32](b, d, 8*s.N)
		wbytes := float64(2 * s.N * s.K)
		timeIt := func(b *testing.B, graph bool, launch func() error) {
			timeLaunches(b, d, reps, graph, wbytes, launch)
		}
		dst := poisoned[uint16](b, d, s.N*s.K)
		b.Run(fmt.Sprintf("%s_%dx%d/copy", s.name, s.N, s.K), func(b *testing.B) {
			timeIt(b, false, func() error { return d.Copy(dst.p, W.p, int64(wbytes)) })
		})
		for _, M := range []int{1, 2, 4, 8} {
			a := kc.GemmArgs{A: X.p, Lda: int64(s.K), W: W.p, WType: 1, M: int64(M), N: int64(s.N), K: int64(s.K), Nout: 1}
			a.Out[0], a.Ow[0] = out.p, int64(s.N)
			for _, k := range []kc.GemmArgsKernel{kc.KernelGemmCol, kc.KernelGemmSkinny, kc.KernelGemmTiled} {
				if k == kc.KernelGemmCol && M > kc.ColMaxRows {
					continue
				}
				name, grid, block := kc.GemmLaunch(M, s.N, 1)
				if name != k { // the same kernel at its own launch shape
					name, grid, block = launchShape(k, M, s.N)
				}
				b.Run(fmt.Sprintf("%s_%dx%d/M%d/%s", s.name, s.N, s.K, M, k.String()[len("glmf_gemm_"):]), func(b *testing.B) {
					timeIt(b, true, func() error { return name.Launch(d, grid, block, 0, &a) })
				})
			}
			b.Run(fmt.Sprintf("%s_%dx%d/M%d/cublas-bf16", s.name, s.N, s.K, M), func(b *testing.B) {
				timeIt(b, true, func() error { return d.GemmBF16(M, s.N, s.K, XB.p, s.K, W.p, s.K, out.p, s.N) })
			})
		}
	}
}

// launchShape is a kernel's launch shape for any row count it takes.
func launchShape(kernel kc.GemmArgsKernel, M, N int) (kc.GemmArgsKernel, kc.Dim3, kc.Dim3) {
	switch kernel {
	case kc.KernelGemmCol:
		return kernel, kc.Dim3{X: uint32((N + 63) / 64)}, kc.Dim3{X: 64}
	case kc.KernelGemmSkinny:
		return kernel, kc.Dim3{X: uint32((N + 31) / 32)}, kc.Dim3{X: 256}
	}
	return kernel, kc.Dim3{X: uint32((N + 63) / 64), Y: uint32((M + 63) / 64)}, kc.Dim3{X: 256}
}

// timeLaunches reports the device time per launch of reps launches,
// captured in a graph when graph is set (kernels: no host launch
// overhead), else issued in a row (copies, whose size hides it), and the
// weight bytes (wbytes a launch) streamed per second.
func timeLaunches(b *testing.B, d *kc.Device, reps int, graph bool, wbytes float64, launch func() error) {
	us := deviceMicros(b, d, reps, graph, launch)
	b.ReportMetric(us, "us/launch")
	b.ReportMetric(wbytes/us/1e3, "weightGB/s")
}

// deviceMicros returns the device µs of one call of launch, from CUDA
// events around reps calls (a captured graph of them when graph is set),
// averaged over b.N runs.
func deviceMicros(b *testing.B, d *kc.Device, reps int, graph bool, launch func() error) float64 {
	all := func() error {
		for i := 0; i < reps; i++ {
			if err := launch(); err != nil {
				return err
			}
		}
		return nil
	}
	var g *kc.Graph
	if err := d.Do(func() error {
		if !graph {
			return nil
		}
		var err error
		g, err = d.Capture(all)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	defer d.Do(func() error { d.Destroy(g); return nil }) //nolint:errcheck // cannot fail
	var total float64
	for i := 0; i < b.N; i++ {
		if err := d.Do(func() error {
			e0, err := d.Record()
			if err != nil {
				return err
			}
			if graph {
				err = d.Replay(g)
			} else {
				err = all()
			}
			if err != nil {
				return err
			}
			e1, err := d.Record()
			if err != nil {
				return err
			}
			ms, err := d.Elapsed(e0, e1)
			total += ms
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
	return 1e3 * total / float64(b.N*reps)
}

// BenchmarkGemvDecode times glmf_gemv on the gpu preset's decode shapes
// (N×K) at 1, 2, 4 and 8 rows, bf16 and fp8 weights (block scales), in
// precision bf16 (float sums) and fp32 (double sums), and in precision
// bf16 the tensor-core glmf_gemv_mma_* (mma-t1, mma-t2, mma-t1k;
// "-picked": the shape kc.GemvMMALaunch takes), beside a device copy of the bf16 weight's
// bytes (the roofline) and cuBLAS's bf16 GEMM. weightGB/s
// counts the weight's bytes as stored (fp8: one a weight, scales apart).
//
//	go test -run - -bench GemvDecode ./kernels/cuda
func BenchmarkGemvDecode(b *testing.B) {
	d := openDevice(b)
	if d.Emulated {
		b.Skip("the emulator's timings mean nothing")
	}
	const reps = 20
	r := rand.New(rand.NewPCG(3, 4))
	for _, s := range []struct{ N, K int }{
		{24896, 4096}, {12288, 4096}, {4096, 12288}, {4096, 4096}, {4096, 8192}, {2048, 4096}, {4096, 2048},
		{1536, 4096}, {16384, 1536}, {154880, 4096}, {512, 4096}, {128, 4096}, {32, 4096},
	} {
		// weights: a bf16 and an fp8 matrix, scales of one
		wb, _ := toBF16(randn(r, 1<<20, 0.3))
		wfull := make([]uint16, s.N*s.K)
		for i := 0; i < len(wfull); i += len(wb) {
			copy(wfull[i:], wb)
		}
		codes := make([]byte, s.N*s.K)
		for i := range codes {
			c := byte(i*131 + i>>9)
			if c&0x7f == 0x7f {
				c ^= 1 // no NaN codes (their fix-up is the slow path)
			}
			codes[i] = c
		}
		sld := (s.K + 127) / 128
		scales := make([]float32, (s.N+127)/128*sld)
		for i := range scales {
			scales[i] = 1
		}
		W, W8, S := upload(b, d, wfull), upload(b, d, codes), upload(b, d, scales)
		x := randn(r, 8*s.K, 1)
		xb, _ := toBF16(x)
		X, XB := upload(b, d, x), upload(b, d, xb)
		out := poisoned[float32](b, d, 8*s.N)
		bbytes := float64(2 * s.N * s.K)
		dst := poisoned[uint16](b, d, s.N*s.K)
		shape := fmt.Sprintf("%dx%d", s.N, s.K)
		b.Run(shape+"/copy", func(b *testing.B) {
			timeLaunches(b, d, reps, false, bbytes, func() error { return d.Copy(dst.p, W.p, int64(bbytes)) })
		})
		for _, M := range []int{1, 2, 4, 8} {
			for _, w := range []struct {
				name  string
				wt    int64
				bytes float64
			}{{"bf16", 1, bbytes}, {"fp8", 2, bbytes / 2}} {
				for _, round := range []int64{1, 0} {
					a := kc.GemmArgs{A: X.p, Lda: int64(s.K), W: W.p, WType: w.wt, M: int64(M), N: int64(s.N), K: int64(s.K), Nout: 1, ARound: round}
					if w.wt == 2 {
						a.W, a.Ws, a.WsLd = W8.p, S.p, int64(sld)
					}
					a.Out[0], a.Ow[0] = out.p, int64(s.N)
					prec := map[int64]string{1: "bf16", 0: "fp32"}[round]
					name, grid, block := kc.GemvSIMTLaunch(&a, M, 1, 1)
					variants := []kc.GemmArgsKernel{name}
					if kc.GemvFP8Applies(&a, name) { // the one-row fp8 kernels, each
						variants = kc.GemvFP8Kernels()
					}
					for _, v := range variants {
						b.Run(fmt.Sprintf("%s/M%d/gemv-%sw-%sprec/%s", shape, M, w.name, prec, v), func(b *testing.B) {
							vg := grid
							if len(variants) > 1 { // a block a group, then the variant's grid
								cols := int64(kc.GemvCols(&a))
								vg = kc.GemvGrid(v, kc.Dim3{X: uint32((a.N + cols - 1) / cols), Y: 1, Z: 1}, d.SMs)
							}
							timeLaunches(b, d, reps, true, w.bytes, func() error { return v.Launch(d, vg, block, 0, &a) })
						})
					}
					if round == 0 || !kc.GemvMMAApplies(&a) {
						continue
					}
					// the tensor-core GEMV, every variant (kc.GemvMMALaunch picks
					// t2 from 264 blocks of 32 columns on, t1k under 132 of 16)
					pick, _, _, _ := kc.GemvMMALaunch(&a, 1, 1)
					for _, v := range []struct {
						name  string
						cols  int64
						warps int
					}{{"t1", 16, kc.GemvMMAWarps}, {"t2", 32, kc.GemvMMAWarps}, {"t1k", 16, kc.GemvMMAWarpsK}} {
						kn, _ := kc.GemvMMAKernel(map[int64]string{1: "b16", 2: "f8"}[w.wt], v.name)
						grid, block := kc.Dim3{X: uint32((a.N + v.cols - 1) / v.cols), Y: 1, Z: 1}, kc.Dim3{X: uint32(32 * v.warps)}
						mark := ""
						if kn == pick {
							mark = "-picked"
						}
						b.Run(fmt.Sprintf("%s/M%d/mma-%s-%sw%s", shape, M, v.name, w.name, mark), func(b *testing.B) {
							timeLaunches(b, d, reps, true, w.bytes, func() error {
								return kn.Launch(d, grid, block, 0, &a)
							})
						})
					}
				}
			}
			b.Run(fmt.Sprintf("%s/M%d/cublas-bf16", shape, M), func(b *testing.B) {
				timeLaunches(b, d, reps, true, bbytes, func() error { return d.GemmBF16(M, s.N, s.K, XB.p, s.K, W.p, s.K, out.p, s.N) })
			})
		}
	}
}
