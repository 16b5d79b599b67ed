package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// On the CPU, bench prints the decode roofline per batch (no GEMM report:
// the cpu backend does not measure its GEMMs) and writes it to the JSON.
func TestBenchRooflineCPU(t *testing.T) {
	j := filepath.Join(t.TempDir(), "b.json")
	out, err := runCLI(t, "bench", "--preset", "tiny", "--cache-dir", t.TempDir(), "--prompt", "4", "--decode-steps", "2", "--reps", "1", "--warmup", "0", "--batch", "1,2", "--json", j)
	require.NoError(t, err)
	require.Regexp(t, `roofline: [0-9.e+-]+ GB per step \(context 33, 2\.00 experts per MoE layer\) ÷ 49 GB/s = [0-9.e+-]+ ms; measured [0-9.e+-]+ ms per step \(wall time\)`, out)
	require.NotContains(t, out, "prefill GEMMs")
	var rep benchJSON
	b, err := os.ReadFile(j)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &rep))
	require.Equal(t, 49.0, rep.Bandwidth)
	require.Nil(t, rep.GEMM)
	checkRoofline(t, rep, "wall")
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
	Bandwidth float64       `json:"bandwidth_gbs"`
	Results   []benchResult `json:"results"`
	Device    struct {
		Memory map[string]int64
	} `json:"device"`
	GEMM *gemmReport `json:"gemm_report"`
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
