package tests

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/internal/syncbuf"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/glmflash/glmflash/plugins/host"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// Plugin sources the tests build (file name in plugins.dir → package).
const (
	examplePlugin = "glmflash-pass-shared-expert-fusion"
	examplePkg    = "./plugins/examples/sharedexpert"
)

// buildPlugins builds the given packages (file name → package path
// relative to the repository root) into a fresh directory, in one go build.
func buildPlugins(t *testing.T, pkgs map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	tmp := t.TempDir()
	args := []string{"build", "-o", tmp + string(os.PathSeparator)}
	for _, p := range pkgs {
		args = append(args, p)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	for file, p := range pkgs {
		require.NoError(t, os.Rename(filepath.Join(tmp, filepath.Base(p)), filepath.Join(dir, file)))
	}
	return dir
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// checksums maps every plugin file of dir to its SHA-256.
func checksums(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	m := map[string]string{}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "glmflash-pass-") {
			m[e.Name()] = sha256File(t, filepath.Join(dir, e.Name()))
		}
	}
	return m
}

// pluginSetup is an engine configuration with plugins, opened.
type pluginSetup struct {
	ec   *config.Config
	host *host.Host
	log  *syncbuf.Buffer
	pl   *pass.Pipeline
}

// openPlugins parses yaml, opens its plugin host (closed at cleanup) and
// builds the pipeline.
func openPlugins(t *testing.T, yaml string) *pluginSetup {
	t.Helper()
	ec, err := config.Parse([]byte(yaml), "test.yaml")
	require.NoError(t, err)
	lb := &syncbuf.Buffer{}
	h, err := host.Open(host.OptionsFromConfig(ec, zerolog.New(lb)))
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	pl, err := ec.Pipeline(h)
	require.NoError(t, err)
	var keep []string
	for _, p := range ec.Enabled() {
		keep = append(keep, p.Name)
	}
	h.StopUnused(keep) // as the command does
	return &pluginSetup{ec: ec, host: h, log: lb, pl: pl}
}

func (s *pluginSetup) engine(t *testing.T, ck *model.Checkpoint) *engine.Engine {
	t.Helper()
	e, err := engine.New(ck.Config(), ck, engine.Options{Slots: 2, Passes: s.pl, PassEnv: s.ec.PassEnv(ck.Config(), ck)})
	require.NoError(t, err)
	return e
}

// requireProcessesGone waits until none of pids runs and no process runs an
// executable from dir.
func requireProcessesGone(t *testing.T, pids []int, dir string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		alive := alivePlugins(pids, dir)
		if len(alive) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("plugin processes still running: %v", alive)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runMark is in the environment of this test process and so of every
// process it starts (go-plugin passes the environment on): it tells this
// run's plugin processes from those of other test runs on the machine.
var runMark = fmt.Sprintf("GLMFLASH_TEST_RUN=%d-%d", os.Getpid(), time.Now().UnixNano())

func init() {
	k, v, _ := strings.Cut(runMark, "=")
	os.Setenv(k, v)
}

// hasEnv reports whether process pid has kv ("K=V") in its environment.
func hasEnv(pid, kv string) bool {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "environ"))
	if err != nil {
		return false
	}
	for _, e := range strings.Split(string(b), "\x00") {
		if e == kv {
			return true
		}
	}
	return false
}

func alivePlugins(pids []int, dir string) []string {
	var alive []string
	for _, pid := range pids {
		if st, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat")); err == nil {
			// a zombie has exited; it is only waiting to be reaped
			if f := strings.Fields(string(st)); len(f) > 2 && f[2] != "Z" {
				alive = append(alive, "pid "+strconv.Itoa(pid))
			}
		}
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil {
			continue
		}
		// the host runs a verified in-memory copy of the plugin file
		if strings.HasPrefix(exe, dir+string(os.PathSeparator)) || strings.HasPrefix(exe, "/memfd:glmflash-pass-") && hasEnv(e.Name(), runMark) {
			alive = append(alive, e.Name()+" "+exe)
		}
	}
	return alive
}

// fakeWeights is a weight catalog of storage dtypes only.
type fakeWeights map[string]safetensors.DType

func (f fakeWeights) DType(name string) (safetensors.DType, bool) {
	dt, ok := f[name]
	return dt, ok
}
