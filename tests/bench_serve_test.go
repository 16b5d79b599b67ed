package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/glmflash/glmflash/model/randckpt"
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

// textCheckpointForBench copies the first fixture into dir with a
// bytes-only tokenizer (256 ids) and a chat template without special
// tokens: text prompts and chat requests work.
func textCheckpointForBench(t *testing.T, dir string) string {
	t.Helper()
	ck := filepath.Join(dir, "text")
	require.NoError(t, os.MkdirAll(ck, 0o755))
	for _, f := range []string{"config.json", "model.safetensors"} {
		b, err := os.ReadFile(filepath.Join(fixtureDir(fixtures[0]), "checkpoint", f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(ck, f), b, 0o644))
	}
	require.NoError(t, randckpt.WriteTokenizer(ck, 256))
	tmpl := `{"chat_template": "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"}`
	require.NoError(t, os.WriteFile(filepath.Join(ck, "tokenizer_config.json"), []byte(tmpl), 0o644))
	return ck
}

// bench serve pointed (--base-url) at a glmflash serve that runs on its
// own, as any server would: every request completes; the client's token
// counts are the server's own counters' deltas (the warm-up's excluded);
// text prompts come from /detokenize and chat works; a JSONL dataset runs;
// the JSON follows its schema.
func TestBenchServeAgainstARunningGlmflash(t *testing.T) {
	bin := glmflashBinary(t)
	d := t.TempDir()
	ck := textCheckpointForBench(t, d)
	cfg := filepath.Join(d, "serve.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("model: {dir: "+ck+", name: fixture}\nserver: {grpc_addr: \"127.0.0.1:0\", http_addr: \"127.0.0.1:0\", metrics_addr: \"\", drain_timeout: 300ms}\nruntime: {slots: 4}\n"), 0o644))
	srv := exec.Command(bin, "--log-level", "warn", "serve", "--config", cfg)
	var sout, serr syncWriter
	srv.Stdout, srv.Stderr = &sout, &serr
	require.NoError(t, srv.Start())
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	defer func() {
		_ = srv.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = srv.Process.Kill()
			t.Error("serve did not stop after SIGTERM")
		}
	}()
	re := regexp.MustCompile(`API is on (http://127\.0\.0\.1:\d+)/v1`)
	var base string
	require.Eventually(t, func() bool {
		if m := re.FindStringSubmatch(sout.String()); m != nil {
			base = m[1]
		}
		return base != ""
	}, 60*time.Second, 10*time.Millisecond, "%s", serr.String())
	run := func(args ...string) string {
		cmd := exec.Command(bin, append([]string{"--log-level", "warn", "bench", "serve", "--base-url", base}, args...)...)
		var out, errb syncWriter
		cmd.Stdout, cmd.Stderr = &out, &errb
		require.NoError(t, cmd.Run(), "%s\n%s", out.String(), errb.String())
		return out.String()
	}

	js := filepath.Join(d, "r.json")
	text := run("--num-prompts", "6", "--concurrency", "3", "--input-len", "12", "--output-len", "5", "--warmup-requests", "2",
		"--slo", "ttft_ms=60000,tpot_ms=60000", "--output", js, "--output-requests")
	require.Contains(t, text, "Requests (completed / failed / cancelled):  6 / 0 / 0 of 6 (+2 warm-up)")
	var rep struct {
		Schema string `json:"schema"`
		Setup  struct {
			Model     string `json:"model"`
			VocabSize int    `json:"vocab_size"`
		} `json:"setup"`
		Completed     int                `json:"completed"`
		InputTokens   int                `json:"input_tokens"`
		OutputTokens  int                `json:"output_tokens"`
		TTFT          struct{ N int }    `json:"ttft_ms"`
		Goodput       struct{ Good int } `json:"goodput"`
		ServerMetrics struct {
			Error  string `json:"error"`
			Series []struct {
				Name  string   `json:"name"`
				Delta *float64 `json:"delta"`
			} `json:"series"`
		} `json:"server_metrics"`
		Requests []struct {
			ITL []float64 `json:"itl_ms"`
		} `json:"requests"`
	}
	b, err := os.ReadFile(js)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &rep))
	require.Equal(t, "glmflash.bench-serve/v1", rep.Schema)
	require.Equal(t, "fixture", rep.Setup.Model, "from GET /v1/models")
	require.Equal(t, 256, rep.Setup.VocabSize, "from GET /v1/models")
	require.Equal(t, 6, rep.Completed)
	require.Equal(t, 6*12, rep.InputTokens, "token-id prompts: exact lengths")
	require.Equal(t, 6*5, rep.OutputTokens, "ignore_eos: every request its 5 tokens")
	require.Equal(t, 6, rep.TTFT.N)
	require.Equal(t, 6, rep.Goodput.Good)
	require.Len(t, rep.Requests, 6)
	require.Empty(t, rep.ServerMetrics.Error)
	deltas := map[string]float64{}
	for _, s := range rep.ServerMetrics.Series {
		if s.Delta != nil {
			deltas[s.Name] = *s.Delta
		}
	}
	require.Equal(t, 30.0, deltas["glmflash_generated_tokens_total"], "the server's count of the run's tokens (the warm-up's excluded)")
	require.Equal(t, 72.0, deltas["glmflash_prompt_tokens_total"])
	require.Equal(t, 6.0, deltas["glmflash_time_to_first_token_seconds_count"])

	// chat, text prompts through /detokenize, a Poisson rate
	text = run("--endpoint", "chat", "--num-prompts", "3", "--input-len", "6", "--output-len", "3", "--request-rate", "50", "--metrics-url", "off")
	require.Contains(t, text, "Requests (completed / failed / cancelled):  3 / 0 / 0 of 3 (+1 warm-up)")
	require.Contains(t, text, "/v1/chat/completions")
	require.NotContains(t, text, "Server metrics")

	// a JSONL dataset
	ds := filepath.Join(d, "d.jsonl")
	require.NoError(t, os.WriteFile(ds, []byte("{\"prompt\": \"Hello there\", \"output_len\": 2}\n{\"prompt\": [5, 6, 7]}\n"), 0o644))
	text = run("--dataset", ds, "--output-len", "4", "--warmup-requests", "0")
	require.Contains(t, text, "Input / output tokens:                      14 / 6", "11 bytes + 3 ids; 2 + 4 tokens")
	require.Contains(t, text, "Workload:                                   "+ds)
}
