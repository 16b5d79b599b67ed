package main

import (
	"cmp"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"testing"

	"github.com/glmflash/glmflash/core/bench"
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

// On the CPU, bench prints the decode roofline per batch at the limits'
// read bandwidth (no GEMM report: the cpu backend does not measure its
// GEMMs) with the fraction of it reached, the prefill's GEMM GFLOP/s as a
// fraction of the fp32 FMA peak, and writes them to the JSON; and the
// weights the backend holds by dtype: the preset's bf16 GEMM weights read
// in place from the checkpoint's mapping.
func TestBenchRooflineCPU(t *testing.T) {
	j := filepath.Join(t.TempDir(), "b.json")
	lim := writeLimits(t, 100, 200, 49)
	out, err := runCLI(t, "bench", "--preset", "tiny", "--cache-dir", t.TempDir(), "--prompt", "4", "--decode-steps", "2", "--reps", "1", "--warmup", "0", "--batch", "1,2", "--json", j, "--limits", lim)
	require.NoError(t, err)
	require.Contains(t, out, "limits   from "+lim+" (tools/limits, measured 2026-01-02T03:04:05Z on Test CPU, 2 threads)")
	require.Contains(t, out, "roofline bandwidth 49 GB/s (the limits' read bandwidth)")
	require.Regexp(t, `roofline: [0-9.e+-]+ GB per step \(context 33, 2\.00 experts per MoE layer\) ÷ 49 GB/s = [0-9.e+-]+ ms; measured [0-9.e+-]+ ms per step \(wall time\) = [0-9.]+× the roofline = [0-9.]+% of the bandwidth roofline`, out)
	require.Regexp(t, `compute: [0-9.e+-]+ GFLOP of weight GEMMs per run .* = [0-9.e+-]+ GFLOP/s = [0-9.]+% of the fp32 FMA peak \(100\.0 GFLOP/s\)`, out)
	require.NotContains(t, out, "prefill GEMMs")
	for _, k := range []string{"weights_bf16_mapped", "weights_fp32"} {
		require.Regexp(t, `host memory +`+k+` +[0-9.]+ MiB`, out)
	}
	require.Regexp(t, `peak RSS [0-9.]+ MiB`, out)
	var rep benchJSON
	b, err := os.ReadFile(j)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &rep))
	require.Equal(t, 49.0, rep.Bandwidth)
	require.Nil(t, rep.GEMM)
	checkRoofline(t, rep, "wall")
	require.Positive(t, rep.Device.Memory["weights_bf16_mapped"])
	require.NotNil(t, rep.Limits)
	require.Equal(t, 100.0, rep.Limits.Limits.FP32FMA.Median)
	pre := rep.Results[0]
	require.Equal(t, "prefill 4 tokens", pre.Name)
	require.Positive(t, pre.GEMMFLOPs)
	require.InDelta(t, pre.GEMMFLOPs*pre.TokensPerSec/4/1e9, pre.AchievedGFLOPs, 1e-9*pre.AchievedGFLOPs)
	require.Equal(t, "fp32 FMA peak", pre.PeakName)
	require.InDelta(t, pre.AchievedGFLOPs/100, pre.PeakFraction, 1e-12)
}

// Without --limits, bench measures the limits itself and says so; an
// explicit --bandwidth-gbs still sets the roofline's bandwidth.
func TestBenchQuickLimits(t *testing.T) {
	j := filepath.Join(t.TempDir(), "b.json")
	out, err := runCLI(t, "bench", "--model", fixture+"/checkpoint", "--prompt", "4", "--decode-steps", "1", "--reps", "1", "--warmup", "0", "--batch", "1", "--json", j)
	require.NoError(t, err)
	require.Contains(t, out, "limits   measured now by bench's quick probe")
	var rep benchJSON
	b, err := os.ReadFile(j)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &rep))
	require.NotNil(t, rep.Limits)
	if runtime.GOARCH == "amd64" && rep.Limits.Limits.ReadBandwidth != nil {
		require.Equal(t, rep.Limits.Limits.ReadBandwidth.Median, rep.Bandwidth)
		require.Contains(t, out, "of the bandwidth roofline")
		require.Contains(t, out, "of the fp32 FMA peak")
	}
}

// --decode-context sets the prefill before the decode series, so the
// roofline is taken at that context.
func TestBenchDecodeContext(t *testing.T) {
	out, err := runCLI(t, "bench", "--preset", "tiny", "--cache-dir", t.TempDir(), "--prompt", "4", "--decode-context", "40", "--decode-steps", "2", "--reps", "1", "--warmup", "0", "--batch", "1")
	require.NoError(t, err)
	require.Regexp(t, `roofline: [0-9.e+-]+ GB per step \(context 41, `, out)
	_, err = runCLI(t, "bench", "--preset", "tiny", "--cache-dir", t.TempDir(), "--decode-context", "0")
	require.ErrorContains(t, err, "--decode-context")
}

// --sample-mask measures each decode series again with every row's logits
// processed and reports the cost over the plain series: on the cpu, and on
// the CUDA emulator where it is set (device time, the processing kernel
// in the step's graph).
func TestBenchSampleMask(t *testing.T) {
	devices := []string{"cpu"}
	if os.Getenv("GLMFLASH_CUDA_EMULATOR") != "" {
		devices = append(devices, "cuda")
	} else {
		t.Log("GLMFLASH_CUDA_EMULATOR is not set: the cpu only (`make cudaemu` and set it to bin/libglmflash-cudaemu.so for the CUDA emulator too)")
	}
	for _, dev := range devices {
		out, err := runCLI(t, "bench", "--device", dev, "--preset", "tiny", "--cache-dir", t.TempDir(), "--prompt", "4", "--decode-steps", "2", "--reps", "1", "--warmup", "0", "--batch", "1,2", "--sample-mask")
		require.NoError(t, err, dev)
		clock := "wall"
		if dev == "cuda" {
			clock = "device"
			require.Regexp(t, `decode batch 2 mask\+edits .* per step: [0-9]+ launches \(1\.0 graph replays\)`, out)
		}
		for _, B := range []string{"1", "2"} {
			require.Regexp(t, `decode batch `+B+` mask\+edits .*\n(.*\n)*?  logits processing \(an allow mask of ~half the vocabulary and 64 edits on every row\): [+-][0-9.]+% of the plain step's `+clock+` time`, out, dev)
		}
	}
}

// On the CUDA emulator, bench also reports device memory by category, the
// roofline against device time, and the prefill GEMMs' TFLOP/s.
func TestBenchReportsCUDA(t *testing.T) {
	if os.Getenv("GLMFLASH_CUDA_EMULATOR") == "" {
		t.Skip("GLMFLASH_CUDA_EMULATOR is not set: `make cudaemu` and set it to bin/libglmflash-cudaemu.so to run bench on the CUDA emulator")
	}
	j := filepath.Join(t.TempDir(), "b.json")
	out, err := runCLI(t, "bench", "--device", "cuda", "--preset", "tiny", "--cache-dir", t.TempDir(), "--prompt", "4", "--decode-steps", "2", "--reps", "1", "--warmup", "0", "--batch", "1,2", "--json", j)
	require.NoError(t, err)
	t.Log(out)
	for _, k := range []string{"weights_bf16", "caches", "workspace", "total_allocated"} {
		require.Regexp(t, `device memory `+k+` +[0-9.]+ MiB`, out)
	}
	require.Regexp(t, `roofline: .* ÷ 4300 GB/s = .* \(device time\)`, out)
	require.Contains(t, out, "prefill GEMMs at 4 rows")
	require.Contains(t, out, "FLOP-weighted total")
	require.Contains(t, out, "not covered: the MoE grouped expert GEMM")
	var rep benchJSON
	b, err := os.ReadFile(j)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &rep))
	mem := rep.Device.Memory
	var sum int64
	for k, v := range mem {
		if k != "total_allocated" {
			sum += v
		}
	}
	for _, k := range []string{"weights_bf16", "caches", "workspace", "total_allocated"} {
		require.Positive(t, mem[k], k)
	}
	require.LessOrEqual(t, sum, mem["total_allocated"])
	checkRoofline(t, rep, "device")
	require.NotNil(t, rep.GEMM)
	require.Equal(t, 4, rep.GEMM.Rows)
	require.NotEmpty(t, rep.GEMM.Shapes)
	for _, s := range rep.GEMM.Shapes {
		require.Empty(t, s.Error)
		require.Positive(t, s.Count)
		require.Positive(t, s.DefaultUs)
		require.Positive(t, s.DefaultTF)
		require.Positive(t, s.BestUs)
		require.LessOrEqual(t, s.BestUs, s.DefaultUs)
	}
	require.Positive(t, rep.GEMM.DefaultTF)
	require.GreaterOrEqual(t, rep.GEMM.BestTF, rep.GEMM.DefaultTF)
	// the printed table has a row per shape
	rows := regexp.MustCompile(`(?m)^  (\d+)×(\d+) +f32a-bf16w +(\d+) `).FindAllStringSubmatch(out, -1)
	require.Len(t, rows, len(rep.GEMM.Shapes))
	for i, r := range rows {
		n, _ := strconv.Atoi(r[1])
		require.Equal(t, rep.GEMM.Shapes[i].N, n)
	}
}

// benchJSON is what the tests read of bench --json.
type benchJSON struct {
	Bandwidth float64        `json:"bandwidth_gbs"`
	Results   []bench.Series `json:"results"`
	Device    struct {
		Memory map[string]int64
	} `json:"device"`
	GEMM   *bench.GEMMReport `json:"gemm_report"`
	Limits *bench.Limits     `json:"limits"`
}

func checkRoofline(t *testing.T, rep benchJSON, clock string) {
	t.Helper()
	n := 0
	for _, r := range rep.Results {
		if r.Name != "decode batch 1" && r.Name != "decode batch 2" {
			require.Zero(t, r.RooflineBytes, r.Name)
			continue
		}
		n++
		require.Positive(t, r.RooflineBytes, r.Name)
		require.Positive(t, r.RooflineMs, r.Name)
		require.Positive(t, r.MeasuredMs, r.Name)
		require.Positive(t, r.RooflineRatio, r.Name)
		require.Equal(t, clock, r.MeasuredClock, r.Name)
		require.Equal(t, 33, r.RooflineContext)
		var sum float64
		for _, v := range r.RooflineTerms {
			require.GreaterOrEqual(t, v, 0.0)
			sum += v
		}
		require.InDelta(t, r.RooflineBytes, sum, 1e-6*r.RooflineBytes)
		require.InDelta(t, r.MeasuredMs/r.RooflineMs, r.RooflineRatio, 1e-9*r.RooflineRatio)
	}
	require.Equal(t, 2, n)
}

// On the CUDA emulator, --mixed-chunk adds a series of steps holding the
// batch's decode tokens beside a prompt chunk; past graph_max_tokens they
// replay a bucket graph (one launch a step), reported by step kind.
func TestBenchMixedChunkCUDA(t *testing.T) {
	if os.Getenv("GLMFLASH_CUDA_EMULATOR") == "" {
		t.Skip("GLMFLASH_CUDA_EMULATOR is not set: `make cudaemu` and set it to bin/libglmflash-cudaemu.so to run bench on the CUDA emulator")
	}
	out, err := runCLI(t, "bench", "--device", "cuda", "--preset", "tiny", "--cache-dir", t.TempDir(), "--prompt", "4", "--decode-steps", "2", "--reps", "1", "--warmup", "0", "--batch", "2", "--mixed-chunk", "80")
	require.NoError(t, err)
	t.Log(out)
	require.Regexp(t, `mixed batch 2 \+ chunk 80 .* by step kind: mixed 2 steps, 1\.0 launches \(1\.0 graph replays\), [0-9]+ kernels, 82 tokens \+ 46 padding`, out)
	_, err = runCLI(t, "bench", "--device", "cuda", "--preset", "tiny", "--cache-dir", t.TempDir(), "--mixed-chunk", "-1")
	require.ErrorContains(t, err, "--mixed-chunk must be ≥ 0")
}
