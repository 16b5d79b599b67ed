package cuda

import (
	"os"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/stretchr/testify/require"
)

// openGPU opens the backend on GPU 0 (or the emulator) or skips.
func openGPU(t *testing.T, o backend.Options) *Backend {
	t.Helper()
	b, err := Open(o)
	if err != nil {
		if os.Getenv("GLMFLASH_REQUIRE_GPU") != "" {
			t.Fatalf("GLMFLASH_REQUIRE_GPU is set and the CUDA backend cannot open: %v", err)
		}
		t.Skipf("CUDA backend unavailable (%v): `make test-gpu` or `make test-emu` runs this", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// The tuner measures every candidate of a shape on the device and names
// the fastest whose output agrees with the default's; the choice is one the
// binding reads back. Its kinds follow the weights and the precision.
func TestTuneGEMMChoosesAmongCandidates(t *testing.T) {
	b := openGPU(t, backend.Options{})
	require.Equal(t, kindF32BF16W, b.GEMMKind("BF16"))
	require.Equal(t, kindF32FP8W, b.GEMMKind("F8_E4M3"), "FP8 weights stay FP8")
	require.Equal(t, []string{"gemv"}, b.GEMMCandidates(kindF32FP8W, 4), "one kernel per row count for fp8 weights")
	require.Equal(t, []string{"own"}, b.GEMMCandidates(kindF32FP8W, 40))
	require.Equal(t, kindF32F32W, b.GEMMKind("F32"))
	require.Equal(t, []string{"tiled"}, b.GEMMCandidates(kindF32BF16W, 512), "nothing to choose for many rows of bf16 weights in fp32")
	require.Contains(t, b.GEMMCandidates(kindF32F32W, 512), "lt")
	require.Contains(t, b.GEMMCandidates(kindF32BF16W, 1), "col:128")
	require.Contains(t, b.GEMMCandidates(kindF32BF16W, 5), "skinny")
	require.NotContains(t, b.GEMMCandidates(kindF32BF16W, 5), "col:128")
	require.Contains(t, b.GEMMCandidates(kindF32BF16W, 16), "skinny8")
	info := b.TunerInfo()
	require.Equal(t, "cuda", info.Device)
	require.Equal(t, b.dev.Name, info.Model)
	require.True(t, strings.HasPrefix(info.Library, "cuBLASLt "))
	for _, c := range []struct {
		kind string
		rows int
	}{{kindF32F32W, 1}, {kindF32F32W, 16}, {kindF32BF16W, 1}, {kindF32BF16W, 24}} {
		ch, err := b.TuneGEMM(ir.GEMMTune{Kind: c.kind, N: 40, K: 24, Rows: c.rows, Reps: 2, Tolerance: 1e-4})
		require.NoError(t, err)
		t.Logf("%s at %d rows: %s (%s), %d ns against %d ns by default; %d measured, %d rejected", c.kind, c.rows, ch.Kernel, ch.Name, ch.TunedNs, ch.DefaultNs, ch.Measured, ch.Rejected)
		_, err = parseChoice(ch.Kernel)
		require.NoError(t, err)
		require.LessOrEqual(t, ch.TunedNs, ch.DefaultNs)
		require.Zero(t, ch.Rejected)
		require.GreaterOrEqual(t, ch.Measured, 2)
	}
	// fp8 kinds: the one kernel is measured (the bench's GEMM report)
	for _, c := range []struct {
		kind string
		rows int
	}{{kindF32FP8W, 3}, {kindF32FP8W, 40}, {kindBF16FP8W, 3}, {kindBF16FP8W, 40}} {
		ch, err := b.TuneGEMM(ir.GEMMTune{Kind: c.kind, N: 200, K: 256, Rows: c.rows, Reps: 2, Tolerance: 1e-4})
		require.NoError(t, err)
		require.Equal(t, 1, ch.Measured)
		require.Positive(t, ch.DefaultNs)
		t.Logf("%s at %d rows: %s, %d ns", c.kind, c.rows, ch.Kernel, ch.DefaultNs)
	}
	_, err := b.TuneGEMM(ir.GEMMTune{Kind: "int8", N: 4, K: 4, Rows: 1})
	require.ErrorContains(t, err, `no GEMM kind "int8"`)
}

// A candidate whose output differs from the default's beyond the tolerance
// is rejected, never chosen (the emulator's fourth cuBLASLt algorithm is
// wrong by 1% when GLMFLASH_CUDAEMU_LT_BAD_ALGO is set).
func TestTuneGEMMRejectsWrongCandidates(t *testing.T) {
	t.Setenv("GLMFLASH_CUDAEMU_LT_BAD_ALGO", "1")
	b := openGPU(t, backend.Options{})
	if !b.dev.Emulated {
		t.Skip("the wrong algorithm is the emulator's")
	}
	for range 3 {
		ch, err := b.TuneGEMM(ir.GEMMTune{Kind: kindF32F32W, N: 40, K: 24, Rows: 16, Reps: 1, Tolerance: 1e-4})
		require.NoError(t, err)
		require.Equal(t, 1, ch.Rejected)
		c, err := parseChoice(ch.Kernel)
		require.NoError(t, err)
		require.False(t, c.kind == chLt && c.algo.Data[0] == 99, "the wrong algorithm is never chosen")
	}
}

// Choice strings round-trip and are checked; a bucket's choice applies up
// to its size, the largest bucket's beyond, and a choice that cannot run
// a batch gives way to the default.
func TestGEMMChoices(t *testing.T) {
	for _, s := range []string{"own", "col:128", "skinny", "tiled", "skinny8", "cublas", "lt:" + strings.Repeat("0a", 64)} {
		c, err := parseChoice(s)
		require.NoError(t, err)
		require.Equal(t, s, c.String())
	}
	for _, s := range []string{"col:100", "col:2048", "skinny:64", "lt:00", "fast"} {
		_, err := parseChoice(s)
		require.Error(t, err, s)
	}
	tg := &tunedGEMM{buckets: []int{1, 8, 64}, choices: []gemmChoice{{kind: chCol, threads: 128}, {kind: chTiled}, {kind: chSkinny8}}}
	require.Equal(t, chCol, tg.choose(kindF32BF16W, 1).kind)
	require.Equal(t, chTiled, tg.choose(kindF32BF16W, 5).kind)
	require.Equal(t, chSkinny8, tg.choose(kindF32BF16W, 40).kind)
	require.Equal(t, chDefault, tg.choose(kindF32BF16W, 100).kind, "skinny8 stops at 64 rows")
	lib := &tunedGEMM{buckets: []int{512}, choices: []gemmChoice{{kind: chCublas}}}
	require.Equal(t, chDefault, lib.choose(kindF32BF16W, 100).kind, "no library GEMM for bf16 weights in fp32")
	require.Equal(t, chCublas, lib.choose(kindF32F32W, 4096).kind)
	pol, err := newGEMMPolicy(GEMMOptions{}, "fp32", 132)
	require.NoError(t, err)
	pl := pol.plan(kindF32F32W, 9)
	require.True(t, pl.lib)
	require.False(t, pol.plan(kindF32BF16W, 9).lib)
	require.Equal(t, chOwn, pol.plan(kindF32BF16W, 2).ch.kind, "kc.GemmLaunch's kernel for few rows by default")
	require.Equal(t, chCol, pol.planTuned(tg, kindF32BF16W, 1).ch.kind, "the tuned choice where it can run")
	require.Equal(t, pol.plan(kindF32BF16W, 100), pol.planTuned(tg, kindF32BF16W, 100), "the default where it cannot")
	onlyOne := &tunedGEMM{buckets: []int{8}, choices: []gemmChoice{{kind: chCol, threads: 64}}}
	require.Equal(t, chDefault, onlyOne.choose(kindF32BF16W, 5).kind, "the column kernel stops at two rows")
}
