package tests

import (
	"go/build/constraint"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every kernel has a portable fallback: each assembly file and each Go file
// that declares or selects assembly under kernels/ is built only for amd64
// without the purego tag, so `-tags purego` (and every other GOARCH) builds
// the kernels from Go alone, and make test runs their tests so
// (scripts/test-impls.sh). Which SIMD path a CPU takes is chosen by
// golang.org/x/sys/cpu inside each package; the tests run there per
// implementation, and under qemu -cpu Haswell with make test-haswell.
func TestKernelAssemblyHasPortableFallback(t *testing.T) {
	root := filepath.Join("..", "kernels")
	var asm []string
	require.NoError(t, filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || strings.Contains(p, string(filepath.Separator)+"cuda"+string(filepath.Separator)) {
			return err
		}
		isAsm := strings.HasSuffix(p, ".s")
		isAmd64Go := strings.HasSuffix(p, "_amd64.go")
		if !isAsm && !isAmd64Go {
			return nil
		}
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		var expr constraint.Expr
		for _, line := range strings.Split(string(b), "\n") {
			if constraint.IsGoBuild(line) {
				expr, err = constraint.Parse(line)
				require.NoError(t, err, p)
				break
			}
		}
		require.NotNil(t, expr, "%s has no //go:build line: it must exclude purego", p)
		tags := func(set ...string) func(string) bool {
			return func(tag string) bool { return slices.Contains(set, tag) }
		}
		require.False(t, expr.Eval(tags("amd64", "linux", "purego")), "%s is built with -tags purego: the pure-Go build would still run assembly", p)
		require.False(t, expr.Eval(tags("arm64", "linux")), "%s is built on arm64", p)
		require.True(t, expr.Eval(tags("amd64", "linux")), "%s is not even built on amd64", p)
		if isAsm {
			asm = append(asm, p)
		}
		return nil
	}))
	require.NotEmpty(t, asm, "no assembly found: the walk is broken")
	t.Logf("assembly with a pure-Go fallback: %v", asm)
}
