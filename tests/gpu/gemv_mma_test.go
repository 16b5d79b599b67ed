package gpu

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// In precision bf16 a step of 8 tokens runs the MoE experts' tiles (a few
// rows an expert) on the tensor-core glmf_gemv_mma_* (the CUDA backend's
// gemmPolicy.mmaPays), and its logits are finite.
// (TestCUDABF16AgainstFixtures checks the values.)
func TestCUDAGemvMMARunsInBF16(t *testing.T) {
	runs := bf16PrefillKernelRuns(t, 8)
	t.Logf("kernels: %v", runs)
	var n int64
	for k, c := range runs {
		if strings.HasPrefix(k, "glmf_gemv_mma_") {
			n += c
		}
	}
	require.Positive(t, n, "the GEMVs run on the tensor-core kernels")
}
