package gpu

import (
	"path/filepath"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model"
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
	cfg, err := randckpt.Preset("small")
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "fp8")
	require.NoError(t, randckpt.Write(dir, cfg, randckpt.Options{Seed: 11, FP8: true}))
	ck, err := model.Open(dir)
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	V := cfg.VocabSize
	for _, precision := range []string{"fp32", "bf16"} {
		for _, seqs := range []int{1, 3} {
			type run struct {
				logits  [][]float32
				kernels map[string]int64
				runs    int64
				fused   int64
			}
			decode := func(gateUp bool) run {
				o := engine.Options{Slots: seqs, Backend: backend.Options{Precision: precision, GraphMaxTokens: -1}}
				var reqs []pass.Request
				if gateUp {
					reqs = []pass.Request{{Name: "mlp-gate-up-fusion"}}
				}
				pl, err := pass.NewPipeline(reqs, true)
				require.NoError(t, err)
				o.Passes, o.PassEnv = pl, config.Default().PassEnv(ck.Config(), ck)
				e := cudaEngine(t, ck, o)
				var slots []int
				for i := 0; i < seqs; i++ {
					s, err := e.Store().Alloc()
					require.NoError(t, err)
					slots = append(slots, s)
					_, err = e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: seqTokens(7+i, i+3, V)}}})
					require.NoError(t, err)
				}
				var r run
				key := engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}
				for step := 0; step < 3; step++ {
					b := &backend.Batch{}
					for i, s := range slots {
						b.Seqs = append(b.Seqs, backend.Seq{Slot: s, Tokens: seqTokens(1, 40+step+i, V)})
					}
					res, err := e.Run(key, b)
					require.NoError(t, err)
					r.logits = append(r.logits, append([]float32(nil), res.Logits...))
				}
				for _, s := range slots {
					e.Store().Free(s)
				}
				p, err := e.Program(key)
				require.NoError(t, err)
				kc, ok := p.(backend.KernelCounter)
				require.True(t, ok)
				r.kernels, r.runs = kc.KernelRuns(), p.Stats().Runs
				if gateUp {
					r.fused = passStat(t, e.Report(key), "mlp-gate-up-fusion", "mlps_fused")
				}
				return r
			}
			off, on := decode(false), decode(true)
			require.Positive(t, on.fused)
			for step := range off.logits {
				require.Equal(t, off.logits[step], on.logits[step], "%s, %d sequences, decode step %d: the unfused MLP's bits", precision, seqs, step)
			}
			gemvs := func(r run) int64 {
				var n int64
				for k, c := range r.kernels {
					if len(k) > len("glmf_gemv_") && k[:len("glmf_gemv_")] == "glmf_gemv_" {
						n += c
					}
				}
				return n / r.runs
			}
			t.Logf("%s, %d sequences: %d MLPs fused; GEMV launches per step %d → %d, elementwise %d → %d, split_cols %d",
				precision, seqs, on.fused, gemvs(off), gemvs(on), off.kernels["glmf_elementwise"]/off.runs, on.kernels["glmf_elementwise"]/on.runs, on.kernels["glmf_split_cols"])
			require.Equal(t, on.fused, gemvs(off)-gemvs(on), "one GEMV fewer per fused MLP")
			require.Equal(t, on.fused, (off.kernels["glmf_elementwise"]-on.kernels["glmf_elementwise"])/off.runs, "no SwiGLU kernel")
			require.Zero(t, on.kernels["glmf_split_cols"], "no split")
		}
	}
}
