package cuda_test

import (
	"os"
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

// The Go mirrors of the kernels' argument structs are up to date.
func TestArgsUpToDate(t *testing.T) {
	want, err := argsgen.Generate("src", "cuda")
	require.NoError(t, err)
	got, err := os.ReadFile("args_gen.go")
	require.NoError(t, err)
	require.Equal(t, string(want), string(got), "kernels/cuda/args_gen.go is stale: run `make cuda-args`")
}
