package bench

import (
	"cmp"
	"os"
	"path/filepath"
	"testing"

	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/glmflash/glmflash/internal/cpulimits"
	"github.com/stretchr/testify/require"
)

// writeLimits writes a limits file (tools/limits' JSON) with these
// medians: fp32 FMA and vdpbf16ps GFLOP/s and read GB/s.
func writeLimits(t *testing.T, fp32, bf16, read float64) string {
	t.Helper()
	st := func(v float64) *cpulimits.Stat { return &cpulimits.Stat{Median: v, Min: v, Max: v, Runs: []float64{v}} }
	l := &cpulimits.Limits{Format: cpulimits.Format, CPUModel: "Test CPU", Threads: 2, ISA: cmp.Or(cpulimits.ISA(), "none"), MeasuredAt: "2026-01-02T03:04:05Z",
		FP32FMA: st(fp32), BF16Dot: st(bf16), ReadBandwidth: st(read)}
	p := filepath.Join(t.TempDir(), "limits.json")
	require.NoError(t, l.Save(p))
	return p
}

// A limits file measured with another instruction set than this CPU's is
// not applied: bench says why instead of comparing with its figures.
func TestBenchLimitsOfAnotherISA(t *testing.T) {
	if cpulimits.ISA() == "" {
		t.Skip("no probe kernels here: every limits file is another ISA's")
	}
	p := writeLimits(t, 100, 200, 49)
	require.NotNil(t, cpuLimits(p).Limits)
	l, err := cpulimits.Load(p)
	require.NoError(t, err)
	l.ISA = "avx512-other"
	require.NoError(t, l.Save(p))
	b := cpuLimits(p)
	require.Nil(t, b.Limits)
	require.Contains(t, b.Error, `measured with isa "avx512-other", this CPU runs "`+cpulimits.ISA()+`"`)
	_, _, why := b.peakFor("fp32")
	require.Contains(t, why, "avx512-other")
}

// prefillFLOPs counts 2 × the multiply-adds of the weight GEMMs: token
// rows for linear and linear_batched, one row a sequence after last_rows,
// and the experts each token runs for moe_experts.
func TestPrefillFLOPs(t *testing.T) {
	v := func(shape ...int) *ir.Value { return &ir.Value{Shape: shape} }
	p := &plan.Plan{Steps: []*ir.Node{
		{Op: ir.OpLinear, Inputs: []*ir.Value{v(ir.DimT, 8), v(16, 8)}},                                                             // 2·T·16·8
		{Op: ir.OpLinearSplit, Inputs: []*ir.Value{v(ir.DimT, 8), v(4, 8)}},                                                         // 2·T·4·8
		{Op: ir.OpLinearBatched, Inputs: []*ir.Value{v(ir.DimT, 12), v(3, 5, 4)}},                                                   // 2·T·3·5·4
		{Op: ir.OpMoEExperts, Inputs: []*ir.Value{v(ir.DimT, 8), v(ir.DimT, 3), v(ir.DimT, 3), v(6, 2, 8), v(6, 2, 8), v(6, 8, 2)}}, // 2·T·3·3·2·8
		{Op: ir.OpLinear, Inputs: []*ir.Value{v(ir.DimS, 8), v(32, 8)}},                                                             // 2·S·32·8 (lm_head)
		{Op: ir.OpSwiGLU, Inputs: []*ir.Value{v(ir.DimT, 8)}},                                                                       // not a GEMM
	}}
	T, S := 10.0, 2.0
	want := 2*T*16*8 + 2*T*4*8 + 2*T*3*5*4 + 2*T*3*3*2*8 + 2*S*32*8
	require.Equal(t, want, prefillFLOPs(p, 10, 2))
}

// bench's peak RSS ratio is peak RSS ÷ (checkpoint + caches), printed with
// both terms; without a checkpoint size there is no ratio.
func TestMemReport(t *testing.T) {
	m := NewMemReport(1000, 700<<20, 100<<20)
	require.InDelta(t, 1.25, m.Ratio, 1e-12)
	require.Equal(t, "peak RSS 1000.0 MiB = 1.250× (checkpoint 700.0 MiB + caches 100.0 MiB)", m.String())
	require.Zero(t, NewMemReport(1000, 0, 100<<20).Ratio)
	require.Equal(t, "peak RSS 5.0 MiB", NewMemReport(5, 0, 0).String())

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.safetensors"), make([]byte, 100), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "b.safetensors"), make([]byte, 23), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), make([]byte, 1000), 0o644))
	require.Equal(t, int64(123), checkpointBytes(dir))
	require.Zero(t, checkpointBytes(t.TempDir()))
}
