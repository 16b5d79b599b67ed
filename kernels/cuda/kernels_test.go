package cuda_test

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"
	"unsafe"

	kc "github.com/glmflash/glmflash/kernels/cuda"
	"github.com/stretchr/testify/require"
)

// openDevice opens GPU 0 (or the emulator GLMFLASH_CUDA_EMULATOR names) or
// skips the test, saying why.
func openDevice(t testing.TB) *kc.Device {
	t.Helper()
	d, err := kc.Open(0)
	if err != nil {
		if os.Getenv("GLMFLASH_REQUIRE_GPU") != "" {
			t.Fatalf("GLMFLASH_REQUIRE_GPU is set and the GPU cannot be opened: %v", err)
		}
		t.Skipf("no CUDA device (%v); `make test-gpu` runs this where a GPU exists, `make test-emu` on the CPU emulator", err)
	}
	t.Cleanup(func() { d.Close() })
	if d.Emulated {
		t.Logf("running on %s", d.Name)
	}
	return d
}

// buf is a device buffer holding a host slice's bytes.
type buf struct {
	d *kc.Device
	p kc.DevicePtr
	n int64
}

func upload[T any](t testing.TB, d *kc.Device, x []T) buf {
	t.Helper()
	n := int64(len(x)) * int64(unsafe.Sizeof(*new(T)))
	var b buf
	require.NoError(t, d.Do(func() error {
		p, err := d.Alloc(n)
		if err != nil {
			return err
		}
		b = buf{d, p, n}
		if n > 0 {
			return d.Upload(p, unsafe.Pointer(unsafe.SliceData(x)), n)
		}
		return nil
	}))
	t.Cleanup(func() { d.Do(func() error { return d.Free(b.p, b.n) }) })
	return b
}

// poisoned allocates n elements of T filled with NaN bytes (0xFF…), so an
// element a kernel fails to write shows.
func poisoned[T any](t testing.TB, d *kc.Device, n int) buf {
	x := make([]byte, n*int(unsafe.Sizeof(*new(T))))
	for i := range x {
		x[i] = 0xFF
	}
	return upload(t, d, x)
}

func download[T any](t *testing.T, b buf) []T {
	t.Helper()
	out := make([]T, b.n/int64(unsafe.Sizeof(*new(T))))
	require.NoError(t, b.d.Do(func() error {
		return b.d.Download(unsafe.Pointer(unsafe.SliceData(out)), b.p, b.n)
	}))
	return out
}

// kernelOf is a kernel taking argument struct T (one of the generated
// kernel types: kc.GemmArgsKernel for kc.GemmArgs, …).
type kernelOf[T any] interface {
	Launch(d *kc.Device, grid, block kc.Dim3, smem int, a *T) error
}

func launch[T any](t *testing.T, d *kc.Device, k kernelOf[T], grid, block kc.Dim3, smem int, a *T) {
	t.Helper()
	require.NoError(t, d.Do(func() error {
		if err := k.Launch(d, grid, block, smem, a); err != nil {
			return err
		}
		return d.Sync()
	}))
}

func randn(r *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * scale)
	}
	return x
}

// bf16 rounds to bfloat16 (truncation keeps values exactly representable).
func toBF16(x []float32) ([]uint16, []float32) {
	b := make([]uint16, len(x))
	f := make([]float32, len(x))
	for i, v := range x {
		b[i] = uint16(math.Float32bits(v) >> 16)
		f[i] = math.Float32frombits(uint32(b[i]) << 16)
	}
	return b, f
}

func maxRelErr(t *testing.T, got, want []float32) float64 {
	t.Helper()
	require.Equal(t, len(want), len(got))
	var num, den, worst float64
	for i := range want {
		if math.IsNaN(float64(got[i])) && !math.IsNaN(float64(want[i])) {
			t.Fatalf("element %d is NaN (unwritten?), want %v", i, want[i])
		}
		e := math.Abs(float64(got[i] - want[i]))
		num += e * e
		den += float64(want[i]) * float64(want[i])
		worst = max(worst, e)
	}
	if den == 0 {
		return worst
	}
	return math.Sqrt(num / den)
}

func TestMain(m *testing.M) { os.Exit(m.Run()) }

// gemvPick is the GEMV core/backend/cuda's default GEMM policy launches
// for args a over rows rows, tiles tiles and G groups on a GPU of sms SMs (its gemmPolicy.gemv,
// which its tests check; mirrored here so that these tests run the kernels
// it picks): the tensor-core kernel where it applies, for bf16 weights from
// 2 rows and fp8 weights from 6, else glmf_gemv_*, one-row fp8 GEMVs of
// 2,048 blocks or more on glmf_gemv_f1_fp8p.
func gemvPick(sms int, a *kc.GemmArgs, rows, tiles, G int) (kc.GemmArgsKernel, kc.Dim3, kc.Dim3) {
	pays := rows >= 2
	if a.WType == 2 {
		pays = rows >= 6
	}
	if pays {
		if k, g, b, ok := kc.GemvMMALaunch(a, tiles, G); ok {
			return k, g, b
		}
	}
	k, grid, block := kc.GemvSIMTLaunch(a, rows, tiles, G)
	if kc.GemvFP8Applies(a, k) && int64(grid.X)*int64(tiles)*int64(G) >= 2048 {
		k = kc.KernelGemvF1Fp8p
		grid = kc.GemvGrid(k, grid, sms)
	}
	return k, grid, block
}
