package cuda_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	kc "github.com/glmflash/glmflash/kernels/cuda"
	"github.com/glmflash/glmflash/kernels/cuda/argsgen"
	"github.com/stretchr/testify/require"
)

// The committed PTX was generated from the committed sources (no nvcc
// needed to check: every PTX file records the sources' SHA-256).
func TestPTXMatchesSources(t *testing.T) {
	want, err := kc.SourcesHash("src")
	require.NoError(t, err)
	files := kc.PTXFiles()
	require.Len(t, files, 2, "want the sm_90 and the portable compute_75 PTX")
	for name, ptx := range files {
		got, ok := kc.RecordedHash(ptx)
		require.True(t, ok, "%s does not start with %q", name, kc.HashHeader)
		require.Equal(t, want, got, "%s was generated from other sources: run `make ptx` on a machine with nvcc (the GPU machine) and commit the result", name)
	}
	require.NotEmpty(t, kc.KernelNames())
}

// A module holds the kernels of the PTX it was loaded from: a
// GLMFLASH_CUDA_PTX_DIR file's new kernels too, not only the embedded ones.
func TestEntryNames(t *testing.T) {
	ptx := ".version 8.0\n.visible .entry glmf_b(\n.param .u64 p)\n{}\n.entry glmf_a(\n)\n{}\n// .entry glmf_comment(\n.func glmf_helper(\n"
	require.Equal(t, []string{"glmf_a", "glmf_b"}, kc.EntryNames(ptx))
	require.Empty(t, kc.EntryNames(""))
}

// The Go mirrors of the kernels' argument structs are up to date.
func TestArgsUpToDate(t *testing.T) {
	want, err := argsgen.Generate("src", "cuda")
	require.NoError(t, err)
	got, err := os.ReadFile("args_gen.go")
	require.NoError(t, err)
	require.Equal(t, string(want), string(got), "kernels/cuda/args_gen.go is stale: run `make cuda-args`")
}

// Every kernel enters through PDL_ENTER (common.cuh): with programmatic
// dependent launch a kernel may start before its predecessor ends, and only
// the wait there keeps it from reading unfinished results. So kernels are
// defined with KERNEL or KERNEL_BOUNDS (whose entry waits) and nowhere else
// is a __global__ function; the sm_90 PTX waits in every entry.
func TestEveryKernelEntersPDL(t *testing.T) {
	files, err := filepath.Glob("src/*.cu*")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for i, line := range strings.Split(string(b), "\n") {
			if !strings.Contains(line, "__global__") || strings.HasPrefix(strings.TrimSpace(line), "//") {
				continue
			}
			inMacro := filepath.Base(f) == "common.cuh" && strings.Contains(line, "extern \"C\" __global__ void") && strings.Contains(line, "name(const T a)")
			require.True(t, inMacro, "%s:%d defines a kernel without KERNEL/KERNEL_BOUNDS (it would not wait for its predecessor): %s", f, i+1, line)
		}
	}
	ptx := kc.PTXFiles()["ptx/glmflash.sm_90.ptx"]
	require.NotEmpty(t, ptx)
	entries := strings.Count(ptx, ".entry ")
	require.Positive(t, entries)
	require.GreaterOrEqual(t, strings.Count(ptx, "griddepcontrol.wait"), entries, "an sm_90 entry without griddepcontrol.wait")
}
