package cpulimits

import (
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A short measurement gives plausible positive figures (or says why a
// kernel was skipped), and its JSON loads back.
func TestMeasureBriefly(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the probe's kernels are amd64 assembly")
	}
	if _, why := fmaProbe(); why != "" {
		t.Skip(why)
	}
	l, err := Measure(Options{Runs: 3, RunTime: 10 * time.Millisecond, ReadPasses: 1, BufferBytes: 64 << 20})
	require.NoError(t, err)
	t.Log(l)
	require.Equal(t, Format, l.Format)
	require.Equal(t, ISA(), l.ISA)
	require.Contains(t, l.Method, "isa \""+l.ISA+"\"")
	// between 1 GFLOP/s and 100 TFLOP/s a CPU: anything else is a broken count
	require.NotNil(t, l.FP32FMA)
	require.Greater(t, l.FP32FMA.Median, 1.0)
	require.Less(t, l.FP32FMA.Median, 1e5)
	require.Len(t, l.FP32FMA.Runs, 3)
	require.LessOrEqual(t, l.FP32FMA.Min, l.FP32FMA.Median)
	require.LessOrEqual(t, l.FP32FMA.Median, l.FP32FMA.Max)
	if ok, why := haveBF16(); ok {
		require.NotNil(t, l.BF16Dot)
		require.Greater(t, l.BF16Dot.Median, 1.0)
		require.Less(t, l.BF16Dot.Median, 1e5)
	} else {
		require.Nil(t, l.BF16Dot)
		require.Equal(t, why, l.BF16DotSkipped)
	}
	require.NotNil(t, l.ReadBandwidth)
	require.Greater(t, l.ReadBandwidth.Median, 0.1)
	require.Less(t, l.ReadBandwidth.Median, 1e4)
	require.Equal(t, int64(64<<20), l.ReadBufferBytes)

	p := filepath.Join(t.TempDir(), l.Slug()+".json")
	require.NoError(t, l.Save(p))
	back, err := Load(p)
	require.NoError(t, err)
	require.Equal(t, l.FP32FMA.Median, back.FP32FMA.Median)
}

// Load refuses files that are not the probe's or lack a limit.
func TestLoadRefuses(t *testing.T) {
	d := t.TempDir()
	_, err := Load(filepath.Join(d, "none.json"))
	require.Error(t, err)
	l := &Limits{Format: Format, ISA: "avx2", FP32FMA: &Stat{Median: 100}}
	p := filepath.Join(d, "l.json")
	require.NoError(t, l.Save(p))
	_, err = Load(p)
	require.ErrorContains(t, err, "read_bandwidth_gbs must be measured and positive")
	l.ReadBandwidth = &Stat{Median: 10}
	l.ISA = ""
	require.NoError(t, l.Save(p))
	_, err = Load(p)
	require.ErrorContains(t, err, "isa")
	l.Format = "other"
	require.NoError(t, l.Save(p))
	_, err = Load(p)
	require.ErrorContains(t, err, "format")
}

func TestSlug(t *testing.T) {
	require.Equal(t, "amd-epyc-9b45-2t", (&Limits{CPUModel: "AMD EPYC 9B45 ", Threads: 2}).Slug())
	require.Equal(t, "amd-epyc-avx2-2t", (&Limits{CPUModel: "AMD EPYC", ISA: "avx2", Threads: 2}).Slug())
	require.Equal(t, "amd-epyc-avx512-2t", (&Limits{CPUModel: "AMD EPYC", ISA: "avx512", Threads: 2}).Slug())
	require.Equal(t, "box-1-4t", (&Limits{Host: "box_1", Threads: 4}).Slug())
}
