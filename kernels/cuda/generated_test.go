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

// The generated launchers (args_gen.go) start exactly the kernels of the
// committed PTX: every launcher's name is an entry point of both files
// (a launcher of a kernel the sources lost fails here, not on the GPU), and
// every entry point has a launcher (kernels are started through no other
// way: d.launch is unexported, the typed launchers its only callers).
func TestLaunchersMatchPTX(t *testing.T) {
	files := kc.PTXFiles()
	require.Len(t, files, 2)
	for name, ptx := range files {
		require.Equal(t, kc.EntryNames(ptx), kc.LaunchedKernels(), "%s: its entry points against the launchers of args_gen.go (`make cuda-args`)", name)
	}
	require.Equal(t, kc.KernelNames(), kc.LaunchedKernels(), "the embedded module's kernels")
}

// The variant tables resolve the names the backend composes, and refuse
// values they do not list.
func TestKernelVariants(t *testing.T) {
	k, ok := kc.GemvSIMTKernel("f", 4)
	require.True(t, ok)
	require.Equal(t, kc.KernelGemvF4, k)
	require.Equal(t, "glmf_gemv_f4", k.String())
	_, ok = kc.GemvSIMTKernel("f", 3)
	require.False(t, ok)
	_, ok = kc.GemvSIMTKernel("h", 1)
	require.False(t, ok)
	k, ok = kc.GemvMMAKernel("b16", "t1k")
	require.True(t, ok)
	require.Equal(t, "glmf_gemv_mma_b16_t1k", k.String())
	kr, ok := kc.KDARecurrentRegKernel(64)
	require.True(t, ok)
	require.Equal(t, "glmf_kda_recurrent_reg64", kr.String())
	_, ok = kc.KDARecurrentRegKernel(256)
	require.False(t, ok)
	require.Equal(t, "glmf_mla_qabs_s", kc.MLAQabsKernel(true).String())
	require.Equal(t, "glmf_mla_expand", kc.MLAExpandKernel(false).String())
	require.Equal(t, "glmf_mhc_post_pre_tok", kc.MHCPostPreKernel(true).String())
	require.Equal(t, "glmf_mhc_pre", kc.MHCPreKernel(false).String())
	var none kc.GemmArgsKernel
	require.Empty(t, none.String(), "a kernel type's zero value is no kernel")
}
