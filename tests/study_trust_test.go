package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A study arm whose plugin failed its checksum is reported FAILED and the
// study fails (before: the arm ran without the pass and was reported as a
// measurement of it, exit status 0); nothing is written.
func TestStudyArmWithFailedChecksumIsFailed(t *testing.T) {
	bin := glmflashBinary(t)
	plugDir := buildPlugins(t, map[string]string{"glmflash-pass-hang-at-test": "./plugins/testdata/hangat"})
	fix, err := filepath.Abs(fixtureDir(fixtures[0]))
	require.NoError(t, err)
	d := t.TempDir()
	study := filepath.Join(d, "study.yaml")
	y := fmt.Sprintf(`name: trust
model: {dir: %s}
arms: {baseline: true, all: true}
workloads: [{name: w, input_len: 4, output_len: 2, requests: 2, concurrency: [1], seed: 1}]
repetitions: 1
warmup: 0
passes:
  - name: hang-at-test
plugins:
  dir: %s
  checksums:
    glmflash-pass-hang-at-test: %q
`, filepath.Join(fix, "checkpoint"), plugDir, strings.Repeat("ab", 32))
	require.NoError(t, os.WriteFile(study, []byte(y), 0o644))
	out, err := runWithHang(t, bin, "none", "GLMFLASH_HANG_MARK=trust", "attribute", "--study", study, "--out", filepath.Join(d, "out"), "--quiet")
	require.Error(t, err, out)
	require.Contains(t, out, "arm all FAILED: 1 of its passes failed, so it would measure a configuration it does not have: hang-at-test:")
	require.Contains(t, out, "checksum verification failed")
	require.NoDirExists(t, filepath.Join(d, "out"))
}
