package gpu

import (
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/stretchr/testify/require"
)

// mlp-gate-up-fusion on the device: at decode its fused gate and up
// projections run as one dual GEMV with SwiGLU in its epilogue (the CUDA
// backend's gateUpDual), giving the unfused MLP's bits, in both
// precisions, at one row and at three (fp8 weights: the SIMT GEMV), with
// one GEMV and no split or SwiGLU kernel per fused MLP.
func TestCUDAGateUpDual(t *testing.T) {
	cudaOptions(t, engine.Options{})
	ck := presetCheckpointWith(t, "small", randckpt.Options{Seed: 11, FP8: true})
	for _, precision := range []backend.Precision{"fp32", "bf16"} {
		for _, seqs := range []int{1, 3} {
			spec := decodeSpec{graphMax: -1, precision: precision, seqs: seqs, logits: true}
			off := decodeStepsWith(t, ck, spec)
			spec.reqs = []pass.Request{{Name: "mlp-gate-up-fusion"}}
			on := decodeStepsWith(t, ck, spec)
			fused := passStat(t, on.rep, "mlp-gate-up-fusion", "mlps_fused")
			require.Positive(t, fused)
			for step := range off.logits {
				require.Equal(t, off.logits[step], on.logits[step], "%s, %d sequences, decode step %d: the unfused MLP's bits", precision, seqs, step)
			}
			gemvs := func(r decodeRun) int64 {
				var n int64
				for k, c := range r.kernels {
					if strings.HasPrefix(k, "glmf_gemv_") {
						n += c
					}
				}
				return n / r.stats.Runs
			}
			perStep := func(r decodeRun, k string) int64 { return r.kernels[k] / r.stats.Runs }
			t.Logf("%s, %d sequences: %d MLPs fused; GEMV launches per step %d → %d, elementwise %d → %d, split_cols %d",
				precision, seqs, fused, gemvs(off), gemvs(on), perStep(off, "glmf_elementwise"), perStep(on, "glmf_elementwise"), on.kernels["glmf_split_cols"])
			require.Equal(t, fused, gemvs(off)-gemvs(on), "one GEMV fewer per fused MLP")
			require.Equal(t, fused, (off.kernels["glmf_elementwise"]-on.kernels["glmf_elementwise"])/off.stats.Runs, "no SwiGLU kernel")
			require.Zero(t, on.kernels["glmf_split_cols"], "no split")
		}
	}
}
