package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

var binary struct {
	once sync.Once
	dir  string
	path string
	err  error
	out  []byte
}

// TestMain removes the glmflash binary the tests share.
func TestMain(m *testing.M) {
	code := m.Run()
	if binary.dir != "" {
		os.RemoveAll(binary.dir)
	}
	os.Exit(code)
}

// glmflashBinary builds bin/glmflash once for the tests that run it as a
// process.
func glmflashBinary(t *testing.T) string {
	t.Helper()
	binary.once.Do(func() {
		if binary.dir, binary.err = os.MkdirTemp("", "glmflash-tests-"); binary.err != nil {
			return
		}
		binary.path = filepath.Join(binary.dir, "glmflash")
		cmd := exec.Command("go", "build", "-o", binary.path, "./cmd/glmflash")
		cmd.Dir = ".."
		binary.out, binary.err = cmd.CombinedOutput()
	})
	require.NoError(t, binary.err, "go build: %s", binary.out)
	return binary.path
}
