package gpu

import (
	"math"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/stretchr/testify/require"
)

// In precision bf16 a step of 8 tokens runs the MoE experts' tiles (a few
// rows an expert) on the tensor-core glmf_gemv_mma_* (kc.GemvMMAPays), and
// its logits are finite. (TestCUDABF16AgainstFixtures checks the values.)
func TestCUDAGemvMMARunsInBF16(t *testing.T) {
	cudaOptions(t, engine.Options{})
	ck, _ := openFixture(t, fixtures[0])
	e := cudaEngine(t, ck, engine.Options{Slots: 1, Backend: backend.Options{Precision: "bf16"}})
	s, err := e.Store().Alloc()
	require.NoError(t, err)
	key := engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}
	r, err := e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: seqTokens(8, 3, ck.Config().VocabSize)}}})
	require.NoError(t, err)
	for i, v := range r.Logits {
		require.False(t, math.IsNaN(float64(v)) || math.IsInf(float64(v), 0), "logit %d is %v", i, v)
	}
	p, err := e.Program(key)
	require.NoError(t, err)
	runs := p.(backend.KernelCounter).KernelRuns()
	t.Logf("kernels: %v", runs)
	var n int64
	for k, c := range runs {
		if strings.HasPrefix(k, "glmf_gemv_mma_") {
			n += c
		}
	}
	require.Positive(t, n, "the GEMVs run on the tensor-core kernels")
}
