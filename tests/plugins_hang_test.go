package tests

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// hangGuard bounds every command of the harness: the timeouts it sets are
// far shorter (plugin start 1 s, calls 0.3 s), this only catches a hang.
const hangGuard = 90 * time.Second

// The hang harness: every command that loads plugins ends within its
// timeouts when a plugin hangs at start (leaving a child that holds its
// output, as a wrapper script without exec does), in Describe, in Eligible
// or in Apply, or behind a wrapper that exits leaving it running as an
// orphan; the pass is reported FAILED or the plugin not loaded, with the
// reason (or the left-behind processes are logged); and no plugin process
// (nor its child) is left behind. serve also stops on SIGTERM while a plugin
// hangs at start.
func TestEveryPluginCommandEndsWhenAPluginHangs(t *testing.T) {
	bin := glmflashBinary(t)
	plugDir := buildPlugins(t, map[string]string{"glmflash-pass-hang-at-test": "./plugins/testdata/hangat"})
	// a wrapper script (no exec) around it: the plugin runs as its child
	wrapDir := t.TempDir()
	wrapper := filepath.Join(wrapDir, "glmflash-pass-hang-at-test")
	require.NoError(t, os.WriteFile(wrapper, []byte("#!/bin/sh\n"+filepath.Join(plugDir, "glmflash-pass-hang-at-test")+"\n"), 0o755))
	// a wrapper that starts the plugin in the background and exits: the
	// plugin serves, as an orphan holding the output pipes
	leaveDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(leaveDir, "glmflash-pass-hang-at-test"), []byte("#!/bin/sh\n"+filepath.Join(plugDir, "glmflash-pass-hang-at-test")+" &\nexit 0\n"), 0o755))
	fix, err := filepath.Abs(fixtureDir(fixtures[0]))
	require.NoError(t, err)
	model := filepath.Join(fix, "checkpoint")

	type hang struct {
		at, dir string
		want    string // in the command's output: the pass failed, with why
	}
	hangs := []hang{
		{"start", wrapDir, "no handshake within 1s (plugins.start_timeout_ms)"},
		{"describe", wrapDir, "Describe did not answer within 1s (plugins.start_timeout_ms)"},
		{"eligible", plugDir, "Eligible did not answer within 300ms (plugins.timeout_ms)"},
		{"apply", plugDir, "Apply did not answer within 300ms (plugins.timeout_ms)"},
		{"none", leaveDir, "plugin left processes behind: killing its process group"},
	}
	engineYAML := func(d, pdir string) string {
		p := filepath.Join(d, "engine.yaml")
		sums := checksums(t, pdir)
		y := fmt.Sprintf("passes:\n  - name: hang-at-test\n  - name: host-length-reuse\nplugins:\n  dir: %s\n  timeout_ms: 300\n  start_timeout_ms: 1000\n  checksums:\n    glmflash-pass-hang-at-test: %q\n", pdir, sums["glmflash-pass-hang-at-test"])
		require.NoError(t, os.WriteFile(p, []byte(y), 0o644))
		return p
	}
	commands := map[string]func(d, cfg string) []string{
		"eval": func(d, cfg string) []string {
			return []string{"eval", "--model", model, "--reference", filepath.Join(fix, "reference.safetensors"), "--config", cfg}
		},
		"generate": func(d, cfg string) []string {
			return []string{"generate", "--model", model, "--prompt-ids", "1,2,3", "--max-tokens", "2", "--config", cfg}
		},
		"bench": func(d, cfg string) []string {
			return []string{"bench", "--model", model, "--prompt", "4", "--decode-steps", "1", "--reps", "1", "--warmup", "0", "--batch", "1", "--config", cfg}
		},
		"passes explain": func(d, cfg string) []string { return []string{"passes", "explain", "--model", model, "--config", cfg} },
		"passes list":    func(d, cfg string) []string { return []string{"passes", "list", "--config", cfg} },
		"attribute": func(d, cfg string) []string {
			b, err := os.ReadFile(cfg)
			require.NoError(t, err)
			study := filepath.Join(d, "study.yaml")
			y := "name: hang\nmodel: {dir: " + model + "}\narms: {baseline: true, all: true}\n" +
				"workloads: [{name: w, input_len: 4, output_len: 2, requests: 2, concurrency: [1], seed: 1}]\nrepetitions: 1\nwarmup: 0\n" + string(b)
			require.NoError(t, os.WriteFile(study, []byte(y), 0o644))
			return []string{"attribute", "--study", study, "--out", filepath.Join(d, "out"), "--quiet"}
		},
		"serve": nil, // below: it runs until a signal
	}
	for name, args := range commands {
		for _, h := range hangs {
			t.Run(name+"/"+h.at, func(t *testing.T) {
				t.Parallel()
				d := t.TempDir()
				cfg := engineYAML(d, h.dir)
				mark := fmt.Sprintf("GLMFLASH_HANG_MARK=%s-%s-%d", strings.ReplaceAll(name, " ", "_"), h.at, time.Now().UnixNano())
				if args == nil {
					out := serveUntilSIGTERM(t, bin, d, model, cfg, h.at, mark, false)
					requirePassFailedIn(t, out, h.want)
				} else {
					out, err := runWithHang(t, bin, h.at, mark, args(d, cfg)...)
					switch {
					case name == "passes list" && (h.at == "eligible" || h.at == "apply"):
						require.NoError(t, err, out) // list only describes
					case name == "attribute" && h.at != "none":
						// an arm without its pass would measure another configuration
						require.Error(t, err, out)
						require.Contains(t, out, "arm all FAILED: 1 of its passes failed")
						requirePassFailedIn(t, out, h.want)
					default:
						require.NoError(t, err, "the command goes on without the pass: %s", out)
						requirePassFailedIn(t, out, h.want)
					}
				}
				requireNoMarkedProcess(t, mark)
			})
		}
	}
	t.Run("serve/SIGTERM while a plugin hangs at start", func(t *testing.T) {
		t.Parallel()
		d := t.TempDir()
		cfg := engineYAML(d, wrapDir)
		b, err := os.ReadFile(cfg)
		require.NoError(t, err)
		// a start timeout far beyond the test: only the signal can end it
		require.NoError(t, os.WriteFile(cfg, []byte(strings.Replace(string(b), "start_timeout_ms: 1000", "start_timeout_ms: 600000", 1)), 0o644))
		mark := fmt.Sprintf("GLMFLASH_HANG_MARK=serve-sigterm-%d", time.Now().UnixNano())
		serveUntilSIGTERM(t, bin, d, model, cfg, "start", mark, true)
		requireNoMarkedProcess(t, mark)
	})
}

// runWithHang runs the binary with the plugin told where to hang.
func runWithHang(t *testing.T, bin, at, mark string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--log-level", "warn", "--log-format", "json"}, args...)...)
	cmd.Env = append(os.Environ(), "GLMFLASH_TEST_HANG_AT="+at, mark)
	var out syncWriter
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.String(), err
	case <-time.After(hangGuard):
		cmd.Process.Kill()
		t.Fatalf("%v hangs (killed: %v): %s", args, <-done, out.String())
		return "", nil
	}
}

// serveUntilSIGTERM runs serve with the plugin hanging at `at`; when early,
// it sends SIGTERM as soon as the plugin process exists (the server is still
// starting), else once the server is ready. serve must exit 0 in time.
func serveUntilSIGTERM(t *testing.T, bin, d, model, cfg, at, mark string, early bool) string {
	t.Helper()
	sc := filepath.Join(d, "serve.yaml")
	require.NoError(t, os.WriteFile(sc, []byte("model: {dir: "+model+"}\nserver: {grpc_addr: \"127.0.0.1:0\", http_addr: \"\", metrics_addr: \"\", drain_timeout: 1s}\nruntime: {slots: 2}\n"), 0o644))
	cmd := exec.Command(bin, "--log-level", "warn", "--log-format", "json", "serve", "--config", sc, "--config", cfg)
	cmd.Env = append(os.Environ(), "GLMFLASH_TEST_HANG_AT="+at, mark)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var errOut syncWriter
	cmd.Stderr = &errOut
	require.NoError(t, cmd.Start())
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		re := regexp.MustCompile(`serving glmflash\.v1\.GLMFlash on`)
		for sc.Scan() {
			if re.MatchString(sc.Text()) {
				close(ready)
			}
		}
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.After(hangGuard)
	if early {
		// the plugin (not serve itself, which carries the mark too) exists
		for len(markedProcesses(mark)) < 2 {
			select {
			case err := <-done:
				t.Fatalf("serve ended before the plugin started: %v: %s", err, errOut.String())
			case <-deadline:
				cmd.Process.Kill()
				t.Fatalf("the plugin never started: %s", errOut.String())
			case <-time.After(20 * time.Millisecond):
			}
		}
	} else {
		select {
		case <-ready:
		case err := <-done:
			t.Fatalf("serve ended before serving: %v: %s", err, errOut.String())
		case <-deadline:
			cmd.Process.Kill()
			t.Fatalf("serve hangs before serving (killed: %v): %s", <-done, errOut.String())
		}
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-done:
		require.NoError(t, err, "serve exits cleanly on SIGTERM: %s", errOut.String())
	case <-deadline:
		cmd.Process.Kill()
		t.Fatalf("serve ignores SIGTERM (killed: %v): %s", <-done, errOut.String())
	}
	return errOut.String()
}

// requirePassFailedIn checks that the output says why the plugin pass failed.
func requirePassFailedIn(t *testing.T, out, want string) {
	t.Helper()
	require.Contains(t, out, want)
}

// markedProcesses lists the processes whose environment holds mark.
func markedProcesses(mark string) []string {
	var pids []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := fmt.Sscanf(e.Name(), "%d", new(int)); err != nil {
			continue
		}
		if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			if f := strings.Fields(string(st)); len(f) > 2 && f[2] == "Z" {
				continue // exited, not reaped yet
			}
		}
		if hasEnv(e.Name(), mark) {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// requireNoMarkedProcess: the command and everything it started are gone.
// A killed process may take a moment to be reaped by its parent.
func requireNoMarkedProcess(t *testing.T, mark string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := markedProcesses(mark)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			var desc []string
			for _, p := range left {
				cmdline, _ := os.ReadFile(filepath.Join("/proc", p, "cmdline"))
				desc = append(desc, p+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
			}
			t.Fatalf("processes left behind: %v", desc)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// syncWriter is a goroutine-safe output buffer.
type syncWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
