package tests

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// layers is the house of ARCHITECTURE.md: every package has a rank (the
// longest matching prefix), and a package imports only packages of a lower
// rank (kernels may import kernels). A new package needs a place here.
var layers = []struct {
	prefix string
	rank   int
}{
	{"internal/", 0}, {"configs", 0}, {"proto/", 0},
	{"kernels/", 1},
	{"model/safetensors", 2}, {"model/tokenizer", 2}, {"model/chat", 2},
	{"model", 3}, {"model/randckpt", 4},
	{"core/collective", 4}, {"core/ir", 5}, {"core/sample", 5}, {"core/roofline", 5}, {"core/toolcall", 5}, {"core/reasoning", 5},
	{"core/loadgen", 5}, // an OpenAI HTTP client: it depends on nothing of the engine
	{"core/graph", 6}, {"core/plan", 6}, {"core/grammar", 6}, {"core/pass", 6}, {"core/access", 6}, {"core/cache", 6},
	{"core/backend", 7}, {"passes/", 7}, {"plugins/wire", 7}, {"plugins/protocol", 7}, {"plugins/examples/sharedexpert/fusion", 7},
	{"core/backend/", 8}, {"core/config", 8}, {"plugins/sdk", 8}, {"passes/all", 8},
	{"plugins/host", 9}, {"plugins/examples/sharedexpert", 9},
	{"core/engine", 10},
	{"core/eval", 11}, {"core/speculative", 11},
	{"core/sched", 12}, {"core/passtest", 13}, {"core/speculative/spectest", 13},
	{"core/text", 13}, {"core/attrib", 13},
	{"core/openai", 14}, {"core/bench", 14},
	{"core/serve", 15},
	{"cmd/", 16}, {"tools/", 16},
}

func rank(pkg string) (int, bool) {
	best, r := -1, 0
	for _, l := range layers {
		if (pkg == l.prefix || strings.HasPrefix(pkg, strings.TrimSuffix(l.prefix, "/")+"/")) && len(l.prefix) > best {
			best, r = len(l.prefix), l.rank
		}
	}
	return r, best >= 0
}

// Imports only go down: no package imports one above it or beside it, and
// no package other than the command imports the servers or the command.
func TestImportsOnlyGoDown(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "../...").CombinedOutput()
	require.NoError(t, err, string(out))
	const mod = "github.com/glmflash/glmflash/"
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(f[0], mod)
		if pkg == "tests" || strings.HasPrefix(pkg, "tests/") {
			continue // the cross-package tests import anything
		}
		rp, ok := rank(pkg)
		require.True(t, ok, "package %s has no place in the layers of tests/architecture_test.go (and ARCHITECTURE.md)", pkg)
		for _, imp := range f[1:] {
			dep, ours := strings.CutPrefix(imp, mod)
			if !ours {
				continue
			}
			rd, ok := rank(dep)
			require.True(t, ok, "package %s has no place in the layers", dep)
			sameKernels := strings.HasPrefix(pkg, "kernels/") && strings.HasPrefix(dep, "kernels/")
			require.True(t, rd < rp || sameKernels, "%s (layer %d) imports %s (layer %d): imports only go down", pkg, rp, dep, rd)
			checked++
		}
	}
	require.Greater(t, checked, 100)
}
