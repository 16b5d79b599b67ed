package gemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/glmflash/glmflash/kernels/parallel"
	"github.com/stretchr/testify/require"
)

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

func randBF16(r *rand.Rand, n int) []uint16 {
	s := make([]uint16, n)
	for i := range s {
		s[i] = Float32ToBF16(float32(r.NormFloat64()))
	}
	return s
}

func maxRelDiff(a, b []float32) float64 {
	m := 0.0
	for i := range a {
		d := math.Abs(float64(a[i]-b[i])) / (1 + math.Abs(float64(b[i])))
		m = math.Max(m, d)
	}
	return m
}

// tol is the agreement asked of any summation order over K terms.
func tol(K int) float64 { return 1e-5 * math.Sqrt(float64(max(K, 1))) }

// eachImpl runs f once per implementation available on this machine.
func eachImpl(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	defer func() { require.NoError(t, SetImpl("")) }()
	for _, name := range Impls() {
		require.NoError(t, SetImpl(name))
		t.Run(name, f)
	}
}

func TestImpls(t *testing.T) {
	names := Impls()
	require.Equal(t, "go", names[0])
	require.Equal(t, names[len(names)-1], Impl(), "the best implementation is the default")
	require.Error(t, SetImpl("nope"))
	require.Equal(t, names[len(names)-1], Impl())
	require.NoError(t, SetImpl("go"))
	require.Equal(t, "go", Impl())
	require.NoError(t, SetImpl("auto"))
	require.Equal(t, names[len(names)-1], Impl())
	t.Logf("implementations: %v", names)
}

func TestMatMulTMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	shapes := [][3]int{{1, 1, 1}, {1, 7, 5}, {3, 13, 9}, {4, 16, 4}, {5, 33, 17}, {9, 64, 130}, {70, 31, 23}, {130, 64, 256}}
	params := []Params{{}, {ColGrain: 1, RowBlock: 1}, {ColGrain: 5, RowBlock: 3}, {ColGrain: 64, RowBlock: 256}}
	eachImpl(t, func(t *testing.T) {
		for _, s := range shapes {
			T, K, N := s[0], s[1], s[2]
			x, w := randSlice(r, T*K), randSlice(r, N*K)
			want := make([]float32, T*N)
			MatMulTNaive(want, x, T, K, w, N)
			for _, p := range params {
				got := make([]float32, T*N)
				MatMulTWith(p, got, x, T, K, w, N)
				require.Less(t, maxRelDiff(got, want), tol(K), "shape %v params %+v", s, p)
			}
		}
	})
}

// oddShapes crosses row counts, reduction lengths (vector tails, K
// blocking) and column counts (tile edges).
var (
	oddT = []int{1, 2, 3, 5, 8, 17, 64, 130}
	oddK = []int{1, 7, 16, 31, 64, 129, 1024, 1500}
	oddN = []int{1, 3, 4, 17, 130}
)

func TestMatMulTOddShapes(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	eachImpl(t, func(t *testing.T) {
		for _, K := range oddK {
			for _, N := range oddN {
				w := randSlice(r, N*K)
				wb := randBF16(r, N*K)
				for _, T := range oddT {
					if T*K*N > 4e6 {
						continue
					}
					x := randSlice(r, T*K)
					want := make([]float32, T*N)
					got := make([]float32, T*N)
					MatMulTNaive(want, x, T, K, w, N)
					MatMulT(got, x, T, K, w, N)
					require.Less(t, maxRelDiff(got, want), tol(K), "fp32 T=%d K=%d N=%d", T, K, N)
					clear(got)
					MatMulTSerial(got, x, T, K, w, N)
					require.Less(t, maxRelDiff(got, want), tol(K), "fp32 serial T=%d K=%d N=%d", T, K, N)

					MatMulTBF16Naive(want, x, T, K, wb, N)
					clear(got)
					MatMulTBF16(got, x, T, K, wb, N)
					require.Less(t, maxRelDiff(got, want), tol(K), "bf16 T=%d K=%d N=%d", T, K, N)
					clear(got)
					MatMulTBF16Serial(got, x, T, K, wb, N)
					require.Less(t, maxRelDiff(got, want), tol(K), "bf16 serial T=%d K=%d N=%d", T, K, N)
				}
			}
		}
	})
}

// Within one implementation an output must not depend on T, N, Params or
// the tile it lands in: row t of a batched product equals the product of
// row t alone, bit for bit, and BF16 equals fp32 on the widened weights.
func TestBatchInvariance(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	eachImpl(t, func(t *testing.T) {
		for _, K := range []int{5, 33, 100, 1024, 1500} {
			T, N := 19, 37
			x, wb := randSlice(r, T*K), randBF16(r, N*K)
			w := make([]float32, N*K)
			BF16ToFloat32s(w, wb)
			full := make([]float32, T*N)
			MatMulTWith(Params{ColGrain: 7, RowBlock: 5}, full, x, T, K, w, N)
			bf := make([]float32, T*N)
			MatMulTBF16(bf, x, T, K, wb, N)
			require.Equal(t, full, bf, "K=%d: bf16 differs from fp32 on widened weights", K)
			row := make([]float32, N)
			for tt := 0; tt < T; tt++ {
				MatMulT(row, x[tt*K:(tt+1)*K], 1, K, w, N)
				require.Equal(t, full[tt*N:(tt+1)*N], row, "K=%d row %d", K, tt)
				for n := 0; n < N; n += 9 {
					one := []float32{0}
					MatMulT(one, x[tt*K:(tt+1)*K], 1, K, w[n*K:], 1)
					require.Equal(t, full[tt*N+n], one[0], "K=%d (%d,%d)", K, tt, n)
					require.Equal(t, full[tt*N+n], Dot(x[tt*K:(tt+1)*K], w[n*K:(n+1)*K]), "Dot K=%d (%d,%d)", K, tt, n)
				}
			}
		}
	})
}

func TestZeroSizes(t *testing.T) {
	eachImpl(t, func(t *testing.T) {
		MatMulT(nil, nil, 0, 5, nil, 3)
		MatMulT(nil, nil, 2, 5, nil, 0)
		dst := []float32{1, 2, 3, 4, 5, 6}
		MatMulT(dst, nil, 2, 0, nil, 3)
		require.Equal(t, make([]float32, 6), dst)
		dst = []float32{1, 2}
		MatMulTBF16(dst, nil, 1, 0, nil, 2)
		require.Equal(t, make([]float32, 2), dst)
		require.Equal(t, float32(0), Dot(nil, nil))
		Axpy(nil, 2, nil)
	})
}

func TestSpecialValues(t *testing.T) {
	inf := float32(math.Inf(1))
	nan := float32(math.NaN())
	eachImpl(t, func(t *testing.T) {
		K := 40
		x := make([]float32, K)
		w := make([]float32, 3*K)
		for k := range x {
			x[k] = 1
		}
		w[3] = inf       // row 0: +Inf
		w[K+39] = nan    // row 1: NaN in the vector tail
		w[2*K+5] = -0.75 // row 2: finite
		got := make([]float32, 3)
		MatMulT(got, x, 1, K, w, 3)
		require.True(t, math.IsInf(float64(got[0]), 1))
		require.True(t, math.IsNaN(float64(got[1])))
		require.Equal(t, float32(-0.75), got[2])
		wb := make([]uint16, len(w))
		Float32sToBF16(wb, w)
		MatMulTBF16(got, x, 1, K, wb, 3)
		require.True(t, math.IsInf(float64(got[0]), 1))
		require.True(t, math.IsNaN(float64(got[1])))
		require.Equal(t, float32(-0.75), got[2])
	})
}

func TestDotAxpy(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	eachImpl(t, func(t *testing.T) {
		for _, n := range []int{0, 1, 3, 8, 15, 16, 17, 63, 64, 65, 100, 257} {
			a, b := randSlice(r, n), randSlice(r, n+3)
			var want float64
			for i := 0; i < n; i++ {
				want += float64(a[i]) * float64(b[i])
			}
			require.InDelta(t, want, Dot(a, b), 1e-5*math.Sqrt(float64(n+1))*(1+math.Abs(want)), "Dot n=%d", n)

			y := randSlice(r, n)
			y0 := append([]float32(nil), y...)
			Axpy(y, 0.37, b)
			for i := range y {
				require.InDelta(t, y0[i]+0.37*b[i], y[i], 1e-6*(1+math.Abs(float64(y[i]))), "Axpy n=%d i=%d", n, i)
			}
		}
	})
}

func TestMatMulAndAxpy(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	eachImpl(t, func(t *testing.T) {
		for _, s := range [][3]int{{5, 7, 3}, {4, 33, 70}} {
			M, K, N := s[0], s[1], s[2]
			a, b := randSlice(r, M*K), randSlice(r, K*N)
			got := make([]float32, M*N)
			MatMul(got, a, M, K, b, N)
			for i := 0; i < M; i++ {
				for j := 0; j < N; j++ {
					var s float64
					for k := 0; k < K; k++ {
						s += float64(a[i*K+k]) * float64(b[k*N+j])
					}
					require.InDelta(t, s, got[i*N+j], 1e-4)
				}
			}
		}
	})
}

func TestBF16Conversions(t *testing.T) {
	cases := []struct {
		f float32
		b uint16
	}{
		{0, 0}, {float32(math.Copysign(0, -1)), 0x8000}, {1, 0x3f80}, {-2, 0xc000},
		{float32(math.Inf(1)), 0x7f80}, {float32(math.Inf(-1)), 0xff80},
		{math.Float32frombits(0x3f808000), 0x3f80}, // tie, even stays
		{math.Float32frombits(0x3f818000), 0x3f82}, // tie, odd rounds up
		{math.Float32frombits(0x3f808001), 0x3f81}, // above half
		{math.MaxFloat32, 0x7f80},                  // rounds to +Inf
	}
	for _, c := range cases {
		require.Equal(t, c.b, Float32ToBF16(c.f), "%v", c.f)
	}
	require.True(t, math.IsNaN(float64(BF16ToFloat32(Float32ToBF16(float32(math.NaN()))))))
	require.True(t, math.IsNaN(float64(BF16ToFloat32(Float32ToBF16(math.Float32frombits(0x7f800001))))))
	for b := 0; b < 1<<16; b++ {
		f := BF16ToFloat32(uint16(b))
		if !math.IsNaN(float64(f)) {
			require.Equal(t, uint16(b), Float32ToBF16(f))
		}
	}
	src := []float32{1.5, -3.25, 1e-3}
	bs := make([]uint16, 3)
	Float32sToBF16(bs, src)
	back := make([]float32, 3)
	BF16ToFloat32s(back, bs)
	require.InDeltaSlice(t, []float64{1.5, -3.25, 1e-3}, []float64{float64(back[0]), float64(back[1]), float64(back[2])}, 1e-5)
}

func TestRaceParallel(t *testing.T) {
	// Concurrent callers share nothing but the implementation pointer.
	r := rand.New(rand.NewPCG(11, 12))
	T, K, N := 6, 1100, 50
	x, w := randSlice(r, T*K), randSlice(r, N*K)
	want := make([]float32, T*N)
	MatMulT(want, x, T, K, w, N)
	done := make(chan []float32)
	for g := 0; g < 4; g++ {
		go func() {
			got := make([]float32, T*N)
			MatMulT(got, x, T, K, w, N)
			done <- got
		}()
	}
	for g := 0; g < 4; g++ {
		require.Equal(t, want, <-done)
	}
	// Narrow outputs split rows across workers too.
	if parallel.Workers > 1 {
		T, N = 300, 3
		x = randSlice(r, T*K)
		want = make([]float32, T*N)
		MatMulTNaive(want, x, T, K, w, N)
		got := make([]float32, T*N)
		MatMulT(got, x, T, K, w, N)
		require.Less(t, maxRelDiff(got, want), tol(K))
	}
}

func TestBatchedMatMulTMatchesSeparateGEMMs(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 1))
	for _, s := range [][4]int{{1, 2, 5, 3}, {7, 2, 16, 70}, {65, 3, 9, 33}} {
		T, G, K, N := s[0], s[1], s[2], s[3]
		x, w := randSlice(r, T*G*K), randSlice(r, G*N*K)
		ys := make([][]float32, G)
		for g := range ys {
			ys[g] = make([]float32, T*N)
		}
		// bf16 weights: w rounded to bf16, so both paths see the same values
		wb := make([]uint16, len(w))
		Float32sToBF16(wb, w)
		BF16ToFloat32s(w, wb)
		ysb := make([][]float32, G)
		for g := range ysb {
			ysb[g] = make([]float32, T*N)
		}
		BatchedMatMulT(ys, x, T, K, w, N)
		BatchedMatMulTBF16(ysb, x, T, K, wb, N)
		for g := 0; g < G; g++ {
			xg := make([]float32, T*K)
			for ti := 0; ti < T; ti++ {
				copy(xg[ti*K:(ti+1)*K], x[ti*G*K+g*K:ti*G*K+(g+1)*K])
			}
			want := make([]float32, T*N)
			MatMulTNaive(want, xg, T, K, w[g*N*K:(g+1)*N*K], N)
			require.Less(t, maxRelDiff(ys[g], want), 1e-5, "shape %v group %d", s, g)
			require.Less(t, maxRelDiff(ysb[g], want), 1e-5, "bf16: shape %v group %d", s, g)
		}
	}
}

func BenchmarkMatMulT(b *testing.B) {
	benchShapes(b, false)
}

func BenchmarkMatMulTBF16(b *testing.B) {
	benchShapes(b, true)
}

// benchShapes reports GFLOP/s (and weight GB/s) per implementation for
// decode (T=1, 8) and prefill (T=512) shapes, square and LM head.
func benchShapes(b *testing.B, bf bool) {
	r := rand.New(rand.NewPCG(1, 2))
	b.Cleanup(func() { _ = SetImpl("") }) // back to the automatic choice, which always exists
	for _, s := range [][3]int{{1, 1024, 1024}, {8, 1024, 1024}, {512, 1024, 1024}, {1, 1024, 32000}, {8, 1024, 32000}, {512, 1024, 32000}} {
		T, K, N := s[0], s[1], s[2]
		x, d := randSlice(r, T*K), make([]float32, T*N)
		var w []float32
		var wb []uint16
		wbytes := 4
		if bf {
			wb, wbytes = randBF16(r, N*K), 2
		} else {
			w = randSlice(r, N*K)
		}
		for _, im := range Impls() {
			if T*K*N > 1e9 && im == "go" && testing.Short() {
				continue
			}
			b.Run(fmt.Sprintf("%s/T%d_K%d_N%d", im, T, K, N), func(b *testing.B) {
				if err := SetImpl(im); err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					if bf {
						MatMulTBF16(d, x, T, K, wb, N)
					} else {
						MatMulT(d, x, T, K, w, N)
					}
				}
				sec := b.Elapsed().Seconds()
				b.ReportMetric(float64(2*T*K*N)*float64(b.N)/sec/1e9, "GFLOP/s")
				b.ReportMetric(float64(wbytes*K*N)*float64(b.N)/sec/1e9, "wGB/s")
			})
		}
	}
}

func BenchmarkDotAxpy(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	b.Cleanup(func() { _ = SetImpl("") }) // back to the automatic choice, which always exists
	for _, n := range []int{64, 128, 1024} {
		x, y := randSlice(r, n), randSlice(r, n)
		for _, im := range Impls() {
			b.Run(fmt.Sprintf("Dot/%s/n%d", im, n), func(b *testing.B) {
				if err := SetImpl(im); err != nil {
					b.Fatal(err)
				}
				var s float32
				for b.Loop() {
					s += Dot(x, y)
				}
				_ = s
			})
			b.Run(fmt.Sprintf("Axpy/%s/n%d", im, n), func(b *testing.B) {
				if err := SetImpl(im); err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					Axpy(y, 1e-3, x)
				}
			})
		}
	}
}

// Dot sums in MatMulT's order (bit-identical to a one-row, one-column
// product) and does not allocate, with every implementation.
func TestDotMatchesMatMulTAndDoesNotAllocate(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	eachImpl(t, func(t *testing.T) {
		for _, n := range []int{1, 7, 16, 17, 64, 100, 257} {
			a, b := randSlice(r, n), randSlice(r, n)
			got := make([]float32, 1)
			MatMulT(got, a, 1, n, b, 1)
			require.Equal(t, math.Float32bits(got[0]), math.Float32bits(Dot(a, b)), "n=%d", n)
			require.Zero(t, testing.AllocsPerRun(20, func() { Dot(a, b) }), "n=%d", n)
		}
	})
}

// A tall product (a prefill's rows: more strips than the callers' stack
// arrays hold) allocates nothing once its pools are warm, by every kernel
// kind: its strip lists are pooled with its packed activations.
func TestTallProductsDoNotAllocate(t *testing.T) {
	if raceOn {
		t.Skip("sync.Pool drops items under the race detector")
	}
	r := rand.New(rand.NewPCG(7, 8))
	const T, K, N = 300, 96, 64
	x, dst := make([]float32, T*K), make([]float32, T*N)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	wf := make([]float32, N*K)
	wb := make([]uint16, N*K)
	for i := range wf {
		wf[i] = float32(r.NormFloat64())
		wb[i] = Float32ToBF16(wf[i])
	}
	w8 := randFP8(r, N, K, 32, 32, false)
	for name, f := range map[string]func(){
		"fp32":        func() { MatMulTSerial(dst, x, T, K, wf, N) },
		"fp32 shared": func() { MatMulT(dst, x, T, K, wf, N) },
		"bf16":        func() { MatMulTBF16Serial(dst, x, T, K, wb, N) },
		"bf16 act":    func() { MatMulTBF16ActSerial(dst, x, T, K, wb, N) },
		"fp8":         func() { MatMulTFP8Serial(dst, x, T, K, w8, N) },
	} {
		f()
		require.Zero(t, testing.AllocsPerRun(10, f), name)
	}
}

// A tall product split over columns packs its activations once for every
// worker (prepack): its results are those of the same product on one
// goroutine, which packs them itself, and of each row alone, bit for bit,
// whatever the workers, K (tails, several row blocks) and Params.
func TestSharedPackingMatchesSerial(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	old := parallel.Workers
	defer func() { parallel.Workers = old }()
	eachImpl(t, func(t *testing.T) {
		for _, workers := range []int{2, 3} {
			parallel.Workers = workers
			for _, K := range []int{33, 100, 1500} {
				for _, T := range []int{sharedPackRows, 150, 301} {
					N := 70
					x, wb := randSlice(r, T*K), randBF16(r, N*K)
					w := make([]float32, N*K)
					BF16ToFloat32s(w, wb)
					shared, serial, bf := make([]float32, T*N), make([]float32, T*N), make([]float32, T*N)
					MatMulTWith(Params{ColGrain: 8, RowBlock: 24}, shared, x, T, K, w, N)
					MatMulTSerial(serial, x, T, K, w, N)
					require.Equal(t, serial, shared, "workers %d K=%d T=%d", workers, K, T)
					MatMulTBF16With(Params{ColGrain: 8}, bf, x, T, K, wb, N)
					require.Equal(t, serial, bf, "bf16 weights: workers %d K=%d T=%d", workers, K, T)
					row := make([]float32, N)
					for _, tt := range []int{0, T / 2, T - 1} {
						MatMulT(row, x[tt*K:(tt+1)*K], 1, K, w, N)
						require.Equal(t, serial[tt*N:(tt+1)*N], row, "workers %d K=%d T=%d row %d", workers, K, T, tt)
					}
				}
			}
		}
	})
}
