package gemm

import (
	"math/rand/v2"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// guarded returns n bytes that end exactly where an inaccessible page
// begins, so that any read past the end faults (weights may be mmapped
// straight from a checkpoint file, where over-reading is not harmless).
func guarded(t *testing.T, n int) []byte {
	t.Helper()
	ps := syscall.Getpagesize()
	size := (n+ps-1)/ps*ps + ps
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Munmap(mem) })
	require.NoError(t, syscall.Mprotect(mem[size-ps:], syscall.PROT_NONE))
	return mem[size-ps-n : size-ps]
}

func guardedF32(t *testing.T, r *rand.Rand, n int) []float32 {
	b := guarded(t, 4*n)
	s := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

func guardedBF16(t *testing.T, r *rand.Rand, n int) []uint16 {
	b := guarded(t, 2*n)
	s := unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), n)
	for i := range s {
		s[i] = Float32ToBF16(float32(r.NormFloat64()))
	}
	return s
}

// TestNoOverread runs every kernel on operands that end at a guard page, with
// K tails of every length, so masked vector loads must not touch memory
// past the end.
func TestNoOverread(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	eachImpl(t, func(t *testing.T) {
		for K := 1; K <= 40; K++ {
			for _, T := range []int{1, 2, 5} {
				N := 3
				x := guardedF32(t, r, T*K)
				w := guardedF32(t, r, N*K)
				wb := guardedBF16(t, r, N*K)
				want := make([]float32, T*N)
				got := make([]float32, T*N)
				MatMulTNaive(want, x, T, K, w, N)
				MatMulT(got, x, T, K, w, N)
				require.Less(t, maxRelDiff(got, want), tol(K), "fp32 T=%d K=%d", T, K)
				MatMulTBF16Naive(want, x, T, K, wb, N)
				MatMulTBF16(got, x, T, K, wb, N)
				require.Less(t, maxRelDiff(got, want), tol(K), "bf16 T=%d K=%d", T, K)
			}
			a, b := guardedF32(t, r, K), guardedF32(t, r, K)
			require.InDelta(t, dotGo(a, b), Dot(a, b), tol(K)*(1+float64(K)))
			y := guardedF32(t, r, K)
			want := append([]float32(nil), y...)
			for i := range want {
				want[i] += 0.5 * a[i]
			}
			Axpy(y, 0.5, a)
			require.Less(t, maxRelDiff(y, want), 1e-6)
		}
	})
}
