package tests

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/glmflash/glmflash/core/config"
	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// cuda.gemv_fp8_kernel's values (core/config does not import kernels/cuda)
// are the one-row fp8 GEMV kernels kernels/cuda has.
func TestGemvFP8KernelKeyMatchesTheKernels(t *testing.T) {
	var have []string
	for _, k := range kc.GemvFP8Kernels() {
		have = append(have, k.String())
	}
	require.ElementsMatch(t, have, config.GemvFP8Kernels)
}
