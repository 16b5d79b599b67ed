package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// benchServeCommand is glmflash bench serve --serve on the tiny preset
// (written under a temporary cache), marked so that it and the server it
// starts can be found.
func benchServeCommand(t *testing.T, mark string, args ...string) (*exec.Cmd, *syncWriter, *syncWriter) {
	bin := glmflashBinary(t)
	cache := t.TempDir()
	argv := append([]string{"--log-format", "json", "bench", "serve", "--serve", "--preset", "tiny",
		"--serve-set", "model.cache_dir=" + cache, "--serve-set", "server.drain_timeout=1s", "--serve-set", "runtime.slots=4"}, args...)
	cmd := exec.Command(bin, argv...)
	cmd.Env = append(os.Environ(), mark)
	var stdout, stderr syncWriter
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	return cmd, &stdout, &stderr
}

// bench serve --serve starts glmflash on the tiny preset, measures it, and
// stops it: every request completes, the server's own counters agree with
// the client's token counts, and no process is left.
func TestBenchServeStartsAndStopsGlmflash(t *testing.T) {
	mark := fmt.Sprintf("GLMFLASH_TEST_MARK=bench-serve-%d", time.Now().UnixNano())
	out := filepath.Join(t.TempDir(), "r.json")
	cmd, stdout, stderr := benchServeCommand(t, mark, "--num-prompts", "8", "--concurrency", "4", "--input-len", "16",
		"--output-len", "8", "--output", out, "--slo", "ttft_ms=30000")
	require.NoError(t, cmd.Run(), "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	require.Contains(t, stdout.String(), "Requests (completed / failed / cancelled):  8 / 0 / 0 of 8 (+1 warm-up)")
	require.Contains(t, stderr.String(), "--serve: the server is healthy")
	require.Contains(t, stderr.String(), "--serve: the server stopped")
	var rep struct {
		Setup struct {
			Model  string `json:"model"`
			Served string `json:"served"`
		} `json:"setup"`
		Completed     int `json:"completed"`
		OutputTokens  int `json:"output_tokens"`
		InputTokens   int `json:"input_tokens"`
		ServerMetrics struct {
			Series []struct {
				Name  string   `json:"name"`
				Delta *float64 `json:"delta"`
			} `json:"series"`
		} `json:"server_metrics"`
	}
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &rep))
	require.Equal(t, "tiny", rep.Setup.Model)
	require.Contains(t, rep.Setup.Served, "glmflash serve --preset tiny --serve-set model.cache_dir=")
	require.Equal(t, 8, rep.Completed)
	require.Equal(t, 64, rep.OutputTokens)
	require.Equal(t, 128, rep.InputTokens)
	got := map[string]float64{}
	for _, s := range rep.ServerMetrics.Series {
		if s.Delta != nil {
			got[s.Name] = *s.Delta
		}
	}
	require.Equal(t, 64.0, got["glmflash_generated_tokens_total"])
	require.Equal(t, 128.0, got["glmflash_prompt_tokens_total"])
	requireNoMarkedProcess(t, mark)
}

// Interrupted (SIGINT), bench serve reports what it measured, stops the
// server and fails; killed (SIGKILL, no clean-up), the server it started
// still ends (it gets SIGTERM when its parent dies).
func TestBenchServeInterruptedOrKilledLeavesNoServer(t *testing.T) {
	long := []string{"--num-prompts", "1000", "--request-rate", "4", "--input-len", "8", "--output-len", "4", "--warmup-requests", "0"}
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			mark := fmt.Sprintf("GLMFLASH_TEST_MARK=bench-serve-%s-%d", strings.ReplaceAll(sig.String(), " ", ""), time.Now().UnixNano())
			cmd, stdout, stderr := benchServeCommand(t, mark, long...)
			require.NoError(t, cmd.Start())
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			deadline := time.After(2 * time.Minute)
			for !strings.Contains(stderr.String(), "benchmark started") {
				select {
				case err := <-done:
					t.Fatalf("bench serve ended early: %v\n%s", err, stderr.String())
				case <-deadline:
					cmd.Process.Kill()
					t.Fatalf("no request completed:\n%s", stderr.String())
				case <-time.After(50 * time.Millisecond):
				}
			}
			time.Sleep(time.Second) // a few requests (4/s) done, some in flight
			require.Len(t, markedProcesses(mark), 2, "bench serve and its server")
			require.NoError(t, cmd.Process.Signal(sig))
			select {
			case err := <-done:
				require.Error(t, err)
			case <-time.After(time.Minute):
				cmd.Process.Kill()
				t.Fatal("bench serve did not end")
			}
			if sig == syscall.SIGINT {
				require.Contains(t, stdout.String(), "ABORTED:")
				require.Contains(t, stdout.String(), "interrupted")
				require.Contains(t, stderr.String(), "--serve: the server stopped")
			}
			requireNoMarkedProcess(t, mark)
		})
	}
}
