package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/glmflash/glmflash/plugins/protocol"
)

// orphanSetup builds the hang-at plugin and an engine configuration that
// loads it with calls allowed to take a minute (only the host's death ends
// them).
func orphanSetup(t *testing.T) (bin, cfg, model string) {
	t.Helper()
	bin = glmflashBinary(t)
	plugDir := buildPlugins(t, map[string]string{"glmflash-pass-hang-at-test": "./plugins/testdata/hangat"})
	fix, err := filepath.Abs(fixtureDir(fixtures[0]))
	require.NoError(t, err)
	cfg = filepath.Join(t.TempDir(), "engine.yaml")
	y := fmt.Sprintf("passes:\n  - name: hang-at-test\nplugins:\n  dir: %s\n  timeout_ms: 60000\n  checksums:\n    glmflash-pass-hang-at-test: %q\n",
		plugDir, checksums(t, plugDir)["glmflash-pass-hang-at-test"])
	require.NoError(t, os.WriteFile(cfg, []byte(y), 0o644))
	return bin, cfg, filepath.Join(fix, "checkpoint")
}

// A host killed with SIGKILL (no clean-up of any kind) while its plugin is
// busy in Eligible: the plugin, and the child it started in a session of
// its own (setsid), exit (before, both ran on as orphans).
func TestPluginDiesWithItsKilledHost(t *testing.T) {
	bin, cfg, model := orphanSetup(t)
	mark := fmt.Sprintf("GLMFLASH_HANG_MARK=orphan-kill-%d", time.Now().UnixNano())
	cmd := exec.Command(bin, "--log-level", "warn", "passes", "explain", "--model", model, "--config", cfg)
	cmd.Env = append(os.Environ(), "GLMFLASH_TEST_HANG_AT=eligible", "GLMFLASH_TEST_SETSID=1", mark)
	var out syncWriter
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// the host, the plugin and the plugin's setsid child
	deadline := time.Now().Add(hangGuard)
	for len(markedProcesses(mark)) < 3 {
		select {
		case err := <-done:
			t.Fatalf("the host ended before its plugin hung: %v: %s", err, out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("the plugin never started: %s", out.String())
		}
	}
	time.Sleep(300 * time.Millisecond) // inside Eligible
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	require.Error(t, <-done, "the host was killed")
	requireNoMarkedProcess(t, mark)
}

// `glmflash passes list | head -1`: the host dies of SIGPIPE with its
// plugin running (a reader that exits at once, `true`, makes it certain:
// the host's status is 141); the plugin and its setsid child exit too.
func TestPassesListIntoHeadLeavesNoPlugin(t *testing.T) {
	bin, cfg, _ := orphanSetup(t)
	for _, reader := range []string{"head -1", "true"} {
		mark := fmt.Sprintf("GLMFLASH_HANG_MARK=orphan-sigpipe-%d", time.Now().UnixNano())
		cmd := exec.Command("sh", "-c", `("$0" --log-level warn passes list --config "$1"; echo "host exit $?" >&2) | `+reader, bin, cfg)
		cmd.Env = append(os.Environ(), "GLMFLASH_TEST_SETSID=1", mark)
		var stderr syncWriter
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		require.NoError(t, err, "%s", stderr.String())
		if reader == "true" {
			require.Contains(t, stderr.String(), "host exit 141", "the host died of SIGPIPE")
			require.Empty(t, out)
		} else {
			require.Len(t, strings.Split(strings.TrimSpace(string(out)), "\n"), 1, "%s", out)
		}
		requireNoMarkedProcess(t, mark)
	}
}

// A wrapper script that fails to start names its exit status and shows its
// stderr in the pass's error (before: "plugin exited before we could
// connect" and a hint blaming the SDK), with a hint when it looked for its
// files beside "$0"; one that finds them through $GLMFLASH_PLUGIN_DIR runs.
func TestWrapperScriptStartFailureShowsStderr(t *testing.T) {
	bin := glmflashBinary(t)
	plugDir := buildPlugins(t, map[string]string{"glmflash-pass-hang-at-test": "./plugins/testdata/hangat"})
	fix, err := filepath.Abs(fixtureDir(fixtures[0]))
	require.NoError(t, err)
	model := filepath.Join(fix, "checkpoint")
	for _, c := range []struct {
		name, script string
		want         []string
	}{
		{"dirname", "#!/bin/sh\necho looking beside \"$0\" >&2\nexec \"$(dirname \"$0\")/real-plugin\"\n",
			[]string{"exit status 127", "its stderr:", "/proc/self/fd/real-plugin", "$" + protocol.EnvDir}},
		{"env", "#!/bin/sh\nexec \"$" + protocol.EnvDir + "/real-plugin\"\n", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			real, err := os.ReadFile(filepath.Join(plugDir, "glmflash-pass-hang-at-test"))
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(dir, "real-plugin"), real, 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(dir, "glmflash-pass-hang-at-test"), []byte(c.script), 0o755))
			cfg := filepath.Join(t.TempDir(), "engine.yaml")
			y := fmt.Sprintf("passes:\n  - name: hang-at-test\nplugins:\n  dir: %s\n  start_timeout_ms: 5000\n  checksums:\n    glmflash-pass-hang-at-test: %q\n",
				dir, checksums(t, dir)["glmflash-pass-hang-at-test"])
			require.NoError(t, os.WriteFile(cfg, []byte(y), 0o644))
			mark := fmt.Sprintf("GLMFLASH_HANG_MARK=wrapper-%s-%d", c.name, time.Now().UnixNano())
			out, err := runWithHang(t, bin, "none", mark, "passes", "explain", "--model", model, "--config", cfg)
			require.NoError(t, err, out)
			if c.want == nil {
				require.Regexp(t, `(?m)^hang-at-test\s+yes\s`, out)
			} else {
				for _, w := range c.want {
					require.Contains(t, out, w)
				}
				require.Contains(t, out, "looking beside /proc/self/fd/3")
				require.NotContains(t, out, "is it built with plugins/sdk", "an exited wrapper is not blamed on the SDK")
			}
			requireNoMarkedProcess(t, mark)
		})
	}
}
