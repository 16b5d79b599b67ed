package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/plugins/examples/sharedexpert/fusion"
	"github.com/stretchr/testify/require"
)

// glmflash runs the binary and returns its output.
func glmflash(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--log-level", "warn", "--log-format", "json"}, args...)...)
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The command line end to end: `passes explain` lists the plugin pass beside
// the built-ins with its sites and reasons, `eval` runs it against the
// transformers reference, a broken plugin shows as FAILED while the rest
// runs, no plugin process outlives the command, and `plugin new` writes a
// skeleton that builds, loads and shows up in `passes explain`.
func TestPluginCLI(t *testing.T) {
	bin := filepath.Join(buildPlugins(t, map[string]string{"glmflash": "./cmd/glmflash"}), "glmflash")
	dir := buildPlugins(t, map[string]string{examplePlugin: examplePkg})
	sum := sha256File(t, filepath.Join(dir, examplePlugin))
	cfg := filepath.Join(t.TempDir(), "engine.yaml")
	write := func(sum string) {
		y := fmt.Sprintf(`passes:
  - name: kda-projection-fusion
  - name: %s
  - name: host-length-reuse
plugins:
  dir: %s
  checksums:
    %s: %q
`, fusion.Name, dir, examplePlugin, sum)
		require.NoError(t, os.WriteFile(cfg, []byte(y), 0o644))
	}
	write(sum)
	row := func(out, pass string) string {
		return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(pass) + `\s+.*$`).FindString(out)
	}

	out, err := glmflash(t, bin, "passes", "explain", "--model", "testdata/glm5next-tiny-c/checkpoint", "--config", cfg)
	require.NoError(t, err, out)
	require.Regexp(t, `^shared-expert-fusion\s+yes\s+0\s+5\s`, row(out, fusion.Name))
	require.Regexp(t, `^kda-projection-fusion\s+yes\s+6\s+0\s`, row(out, "kda-projection-fusion"))
	require.Regexp(t, `^dsa-pooled-metadata\s+no\s`, row(out, "dsa-pooled-metadata"))
	require.Contains(t, out, "shared-expert-fusion skipped layer 3: shared expert width 64 (n_shared_experts 2 × moe_intermediate_size 32) differs from a routed expert's 32")
	requireProcessesGone(t, nil, dir)

	// passes list --config: the plugin pass beside the built-ins, with its source
	out, err = glmflash(t, bin, "passes", "list", "--config", cfg)
	require.NoError(t, err, out)
	require.Regexp(t, `^shared-expert-fusion\s+v1\.0\.0\s+plugin glmflash-pass-shared-expert-fusion\s+\S`, row(out, fusion.Name))
	require.Regexp(t, `^kda-projection-fusion\s+v1\.0\.0\s+built-in\s`, row(out, "kda-projection-fusion"))
	requireProcessesGone(t, nil, dir)

	out, err = glmflash(t, bin, "passes", "explain", "--model", "testdata/glm5next-tiny-a/checkpoint", "--config", cfg, "--format", "json")
	require.NoError(t, err, out)
	require.Contains(t, out, `"name": "shared-expert-fusion",
      "version": "1.0.0",
      "requested": true,
      "fired": [
        {
          "where": "layer 3",
          "layer": 3,
          "note": "shared expert appended as expert 8"`)

	out, err = glmflash(t, bin, "eval", "--model", "testdata/glm5next-tiny-a/checkpoint", "--reference", "testdata/glm5next-tiny-a/reference.safetensors", "--config", cfg, "--tol", "1e-4")
	require.NoError(t, err, out)
	require.Contains(t, out, "all 7 cases within 0.0001, greedy tokens identical")
	requireProcessesGone(t, nil, dir)

	// a checksum mismatch: the pass is FAILED with the reason, the others run
	write(strings.Repeat("ab", 32))
	out, err = glmflash(t, bin, "passes", "explain", "--model", "testdata/glm5next-tiny-a/checkpoint", "--config", cfg)
	require.NoError(t, err, out)
	require.Regexp(t, `^shared-expert-fusion\s+yes\s+FAILED\s`, row(out, fusion.Name))
	require.Contains(t, out, "shared-expert-fusion failed: plugin glmflash-pass-shared-expert-fusion is not usable: checksum verification failed")
	require.Regexp(t, `^kda-projection-fusion\s+yes\s+6\s`, row(out, "kda-projection-fusion"))
	require.Contains(t, out, `"plugin":"glmflash-pass-shared-expert-fusion"`, "the failure is logged with the plugin's name")
	out, err = glmflash(t, bin, "passes", "list", "--config", cfg)
	require.NoError(t, err, out)
	require.Regexp(t, `^shared-expert-fusion\s+plugin glmflash-pass-shared-expert-fusion\s+NOT LOADED: .*checksum verification failed`, row(out, fusion.Name))
	write(sum)

	// scaffold → build → checksum → passes explain
	src := t.TempDir()
	out, err = glmflash(t, bin, "plugin", "new", "hello-pass", "--dir", src)
	require.NoError(t, err, out)
	pdir := filepath.Join(src, "hello-pass")
	gofmt, err := exec.Command("gofmt", "-l", pdir).CombinedOutput()
	require.NoError(t, err)
	require.Empty(t, string(gofmt), "the skeleton is gofmt-clean")
	plugDir := t.TempDir()
	build := exec.Command("go", "build", "-mod=mod", "-o", filepath.Join(plugDir, "glmflash-pass-hello-pass"), ".")
	build.Dir = pdir
	build.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=mod")
	b, err := build.CombinedOutput()
	require.NoError(t, err, "%s", b)
	sums := filepath.Join(plugDir, "SHA256SUMS")
	require.NoError(t, os.WriteFile(sums, []byte(sha256File(t, filepath.Join(plugDir, "glmflash-pass-hello-pass"))+"  glmflash-pass-hello-pass\n"), 0o644))
	require.NoError(t, os.WriteFile(cfg, []byte(fmt.Sprintf("passes:\n  - name: hello-pass\n    options: {layers: [4]}\nplugins:\n  dir: %s\n  sums_file: %s\n", plugDir, sums)), 0o644))
	out, err = glmflash(t, bin, "passes", "explain", "--model", "testdata/glm5next-tiny-a/checkpoint", "--config", cfg)
	require.NoError(t, err, out)
	require.Regexp(t, `^hello-pass\s+yes\s+1\s+4\s`, row(out, "hello-pass"))
	require.Contains(t, out, "hello-pass skipped layer 3: layer 3 is not in option layers")
	requireProcessesGone(t, nil, plugDir)
}
