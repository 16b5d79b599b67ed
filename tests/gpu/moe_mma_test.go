package gpu

import (
	"math"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/stretchr/testify/require"
)

// In precision bf16 a prefill whose routing slots average more than 8 per
// expert (130 tokens × top-2 over 8 experts) runs the MoE expert GEMMs on
// the tensor-core kernel glmf_moe_mma_bf16 (compute 9.0+; the emulator
// reports 9.0), and its logits are finite.
// (TestCUDABF16AgainstFixtures checks the same path against transformers.)
func TestCUDAMoEMMARunsInBF16(t *testing.T) {
	runs := bf16PrefillKernelRuns(t, 130)
	t.Logf("prefill kernels: %v", runs)
	require.Positive(t, runs["glmf_moe_mma_bf16"], "the MoE experts run on the tensor-core kernel")
}

// bf16PrefillKernelRuns prefills n tokens of the first fixture in
// precision bf16, requires finite logits, and returns the kernels that ran
// with their counts.
func bf16PrefillKernelRuns(t *testing.T, n int) map[string]int64 {
	cudaOptions(t, engine.Options{})
	ck, _ := openFixture(t, fixtures[0])
	e := cudaEngine(t, ck, engine.Options{Slots: 1, Backend: backend.Options{Precision: "bf16"}})
	s, err := e.Store().Alloc()
	require.NoError(t, err)
	key := engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}
	r, err := e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: seqTokens(n, 3, ck.Config().VocabSize)}}})
	require.NoError(t, err)
	for i, v := range r.Logits {
		require.False(t, math.IsNaN(float64(v)) || math.IsInf(float64(v), 0), "logit %d is %v", i, v)
	}
	p, err := e.Program(key)
	require.NoError(t, err)
	return p.(backend.KernelCounter).KernelRuns()
}
