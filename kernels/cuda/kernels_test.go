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

func launch[T any](t *testing.T, d *kc.Device, name string, grid, block kc.Dim3, smem int, a *T) {
	t.Helper()
	require.NoError(t, d.Do(func() error {
		if err := kc.Launch(d, name, grid, block, smem, a); err != nil {
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
