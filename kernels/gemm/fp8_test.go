package gemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// randFP8 returns an [N][K] FP8 weight with random codes (no NaN) and
// block scales (powers of two when pow2, so every value is bf16-exact).
func randFP8(r *rand.Rand, N, K, br, bc int, pow2 bool) *FP8 {
	w := &FP8{Codes: make([]byte, N*K), BlockRows: br, BlockCols: bc, ScaleCols: (K + bc - 1) / bc}
	for i := range w.Codes {
		b := byte(r.IntN(256))
		if b&0x7f == 0x7f {
			b--
		}
		w.Codes[i] = b
	}
	w.Scales = make([]float32, (N+br-1)/br*w.ScaleCols)
	for i := range w.Scales {
		if pow2 {
			w.Scales[i] = float32(math.Ldexp(1, -r.IntN(8)))
		} else {
			w.Scales[i] = r.Float32()*0.01 + 1e-4
		}
	}
	return w
}

// The FP8 product equals MatMulT on the dequantized weights bit for bit,
// and MatMulTBF16 on them when they are bf16-exact, in every
// implementation, at shapes with tails (K past the vector width and the
// block, N past the tile, partial scale blocks).
func TestMatMulTFP8MatchesDequantized(t *testing.T) {
	defer func() { _ = SetImpl("") }()
	r := rand.New(rand.NewPCG(3, 4))
	old := fp8TileBytes
	defer func() { fp8TileBytes = old }()
	for _, name := range Impls() {
		require.NoError(t, SetImpl(name))
		for _, sh := range []struct{ T, N, K, br, bc int }{
			{1, 37, 300, 128, 128}, {3, 64, 129, 16, 32}, {8, 19, 17, 4, 8}, {13, 130, 256, 128, 128}, {1, 8, 2048, 128, 128},
		} {
			for _, pow2 := range []bool{false, true} {
				for _, tb := range []int{old, 4 * sh.K * 8} { // default tile, and 8-row tiles
					fp8TileBytes = tb
					w := randFP8(r, sh.N, sh.K, sh.br, sh.bc, pow2)
					x := make([]float32, sh.T*sh.K)
					for i := range x {
						x[i] = float32(r.NormFloat64())
					}
					deq := w.Dequant(sh.N, sh.K)
					for i, v := range deq { // one multiplication, as the checkpoint's loader does
						n, k := i/sh.K, i%sh.K
						require.Equal(t, FP8ToFloat32(w.Codes[i])*w.Scales[(n/sh.br)*w.ScaleCols+k/sh.bc], v)
					}
					want, got := make([]float32, sh.T*sh.N), make([]float32, sh.T*sh.N)
					MatMulT(want, x, sh.T, sh.K, deq, sh.N)
					MatMulTFP8Serial(got, x, sh.T, sh.K, w, sh.N)
					require.Equal(t, want, got, "%s %+v pow2=%v", name, sh, pow2)
					if pow2 {
						bf := make([]uint16, len(deq))
						for i, v := range deq {
							bf[i] = Float32ToBF16(v)
							require.Equal(t, v, BF16ToFloat32(bf[i]))
						}
						MatMulTBF16(want, x, sh.T, sh.K, bf, sh.N)
						require.Equal(t, want, got, "%s %+v bf16", name, sh)
					}
				}
			}
		}
	}
}

// A warm FP8 product allocates nothing.
func TestMatMulTFP8NoAlloc(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	w := randFP8(r, 64, 256, 128, 128, false)
	x, dst := make([]float32, 2*256), make([]float32, 2*64)
	MatMulTFP8Serial(dst, x, 2, 256, w, 64)
	if raceOn {
		t.Skip("sync.Pool drops items under the race detector")
	}
	require.Zero(t, testing.AllocsPerRun(10, func() { MatMulTFP8Serial(dst, x, 2, 256, w, 64) }))
}

func TestFP8TableMatchesDecode(t *testing.T) {
	for b := 0; b < 256; b++ {
		v := FP8ToFloat32(byte(b))
		if b&0x7f == 0x7f {
			require.True(t, math.IsNaN(float64(v)))
			continue
		}
		// exponent/mantissa bits placed in float32, scaled by 2^120
		f := math.Float32frombits(uint32(b&0x80)<<24|uint32(b&0x7f)<<20) * float32(math.Ldexp(1, 120))
		require.Equal(t, f, v, "code %#x", b)
	}
}

// The vector dequantization equals the table's code × scale for every
// code (subnormal codes, and products that underflow included), NaN codes
// give NaN.
func TestDequantFP8EveryCode(t *testing.T) {
	src := make([]byte, 256+7)
	for i := range src {
		src[i] = byte(i)
	}
	for _, s := range []float32{1, 0.0078125, 3.7e-3, 1e-38, 448, -2.5} {
		dst, want := make([]float32, len(src)), make([]float32, len(src))
		dequantFP8(dst, src, s)
		dequantFP8Go(want, src, s)
		for i := range src {
			if src[i]&0x7f == 0x7f {
				require.True(t, math.IsNaN(float64(dst[i])), "code %#x", src[i])
				continue
			}
			require.Equal(t, math.Float32bits(want[i]), math.Float32bits(dst[i]), "code %#x scale %v", src[i], s)
		}
	}
}

// The FP8 kernels (products of up to fp8FusedRows rows) and the tile path
// equal MatMulT on the dequantized weights bit for bit at every height up
// to 9, with K tails, N tails, scale row blocks that cut column tiles
// (BlockRows 20, 7), scale column blocks of 16 and 48, and scales whose
// products underflow to subnormals or come near the float32 limit.
func TestMatMulTFP8KernelsMatchDequantized(t *testing.T) {
	defer func() { _ = SetImpl("") }()
	r := rand.New(rand.NewPCG(11, 12))
	for _, name := range Impls() {
		require.NoError(t, SetImpl(name))
		for _, sh := range []struct{ N, K, br, bc int }{
			{37, 300, 128, 128}, {29, 17, 20, 16}, {50, 129, 7, 48}, {24, 1024, 128, 128}, {9, 16, 4, 16}, {8, 5, 128, 128},
		} {
			for _, sk := range []string{"rand", "tiny", "large"} {
				w := randFP8(r, sh.N, sh.K, sh.br, sh.bc, false)
				for i := range w.Scales {
					switch sk {
					case "tiny":
						w.Scales[i] = float32(math.Ldexp(1+r.Float64(), -130-r.IntN(8)))
					case "large":
						w.Scales[i] = float32(math.Ldexp(1+r.Float64(), 100+r.IntN(19)))
					}
				}
				deq := w.Dequant(sh.N, sh.K)
				for T := 1; T <= 9; T++ {
					x := make([]float32, T*sh.K)
					for i := range x {
						x[i] = float32(r.NormFloat64())
					}
					want, got := make([]float32, T*sh.N), make([]float32, T*sh.N)
					MatMulT(want, x, T, sh.K, deq, sh.N)
					MatMulTFP8Serial(got, x, T, sh.K, w, sh.N)
					for i := range want {
						require.Equal(t, math.Float32bits(want[i]), math.Float32bits(got[i]), "%s %+v %s T=%d i=%d", name, sh, sk, T, i)
					}
				}
			}
		}
	}
}

// Weights with a NaN code (or a scale too large for the fast paths) go
// the exact way: the product still equals MatMulT on the dequantized
// weights (NaN where a NaN weight is used).
func TestMatMulTFP8NaNCodes(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	const N, K = 19, 160
	for _, c := range []string{"nan", "scale"} {
		w := randFP8(r, N, K, 128, 128, false)
		if c == "nan" {
			w.Codes[5*K+33] = 0xff
		} else {
			w.Scales[0] = 3e36
		}
		require.False(t, w.fastOK())
		deq := w.Dequant(N, K)
		for _, T := range []int{1, 3, 12} {
			x := make([]float32, T*K)
			for i := range x {
				x[i] = float32(r.NormFloat64())
			}
			want, got := make([]float32, T*N), make([]float32, T*N)
			MatMulT(want, x, T, K, deq, N)
			MatMulTFP8Serial(got, x, T, K, w, N)
			for i := range want {
				if math.IsNaN(float64(want[i])) {
					require.True(t, math.IsNaN(float64(got[i])), "%s T=%d i=%d", c, T, i)
					continue
				}
				require.Equal(t, want[i], got[i], "%s T=%d i=%d", c, T, i)
			}
		}
	}
	for i := 0; i < 20; i++ { // the scan finds a NaN code at every offset
		b := make([]byte, 20)
		require.False(t, fp8HasNaN(b))
		b[i] = 0x7f | byte(i%2)<<7
		require.True(t, fp8HasNaN(b), "%d", i)
		b[i] = 0x7e
		require.False(t, fp8HasNaN(b), "%d", i)
	}
}

// The fast dequantization equals the table's code × scale for every
// non-NaN code, subnormal codes and products included.
func TestDequantFP8FastEveryCode(t *testing.T) {
	var src []byte
	for i := 0; i < 256+7; i++ {
		if b := byte(i); b&0x7f != 0x7f {
			src = append(src, b)
		}
	}
	for _, s := range []float32{1, 0.0078125, 3.7e-3, 1e-38, 1e-44, 448, -2.5, 1e36} {
		dst, want := make([]float32, len(src)), make([]float32, len(src))
		dequantFP8Fast(dst, src, s)
		dequantFP8Go(want, src, s)
		for i := range src {
			require.Equal(t, math.Float32bits(want[i]), math.Float32bits(dst[i]), "code %#x scale %v", src[i], s)
		}
	}
}

// BenchmarkExpertFP8 compares the bench preset's expert-shaped products
// (gate/up: K=1024, N=512; down: K=512, N=1024) on FP8 weights with the
// same weights in bf16, at decode (T=1…8) and prefill (T=64) heights, on
// one goroutine, with the weights resident in cache (one matrix).
func BenchmarkExpertFP8(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, sh := range [][2]int{{1024, 512}, {512, 1024}} {
		K, N := sh[0], sh[1]
		w := randFP8(r, N, K, 128, 128, true)
		deq := w.Dequant(N, K)
		bf := make([]uint16, len(deq))
		Float32sToBF16(bf, deq)
		for _, T := range []int{1, 2, 4, 8, 64} {
			x, dst := make([]float32, T*K), make([]float32, T*N)
			for i := range x {
				x[i] = float32(r.NormFloat64())
			}
			b.Run(fmt.Sprintf("K=%d/N=%d/fp8/T=%d", K, N, T), func(b *testing.B) {
				b.SetBytes(int64(N * K))
				for range b.N {
					MatMulTFP8Serial(dst, x, T, K, w, N)
				}
			})
			b.Run(fmt.Sprintf("K=%d/N=%d/bf16/T=%d", K, N, T), func(b *testing.B) {
				b.SetBytes(int64(2 * N * K))
				for range b.N {
					MatMulTBF16Serial(dst, x, T, K, bf, N)
				}
			})
		}
	}
}

// BenchmarkExpertFP8Cold is BenchmarkExpertFP8 at the gate/up shape with
// the weights streamed from memory, as in a model's decode: each op takes
// the next of 64 matrices (32 MiB of FP8, 64 MiB of bf16).
func BenchmarkExpertFP8Cold(b *testing.B) {
	r := rand.New(rand.NewPCG(9, 10))
	const K, N, E = 1024, 512, 64
	ws := make([]*FP8, E)
	bfs := make([][]uint16, E)
	for e := range ws {
		ws[e] = randFP8(r, N, K, 128, 128, false)
		bfs[e] = make([]uint16, N*K)
		Float32sToBF16(bfs[e], ws[e].Dequant(N, K))
	}
	for _, T := range []int{1, 4, 8} {
		x, dst := make([]float32, T*K), make([]float32, T*N)
		for _, w := range ws { // the one-time code scan (fastOK) out of the timing
			MatMulTFP8Serial(dst, x, T, K, w, N)
		}
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		b.Run(fmt.Sprintf("fp8/T=%d", T), func(b *testing.B) {
			b.SetBytes(int64(N * K))
			for i := range b.N {
				MatMulTFP8Serial(dst, x, T, K, ws[i%E], N)
			}
		})
		b.Run(fmt.Sprintf("bf16/T=%d", T), func(b *testing.B) {
			b.SetBytes(int64(2 * N * K))
			for i := range b.N {
				MatMulTBF16Serial(dst, x, T, K, bfs[i%E], N)
			}
		})
	}
}
