package tests

import (
	"path/filepath"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/stretchr/testify/require"
)

// An FP8-layout checkpoint (block-scaled e4m3 where the released checkpoint
// has it, partial edge blocks included) gives the same logits as the same
// weights dequantized and saved as BF16.
func TestFP8CheckpointMatchesDequantizedBF16(t *testing.T) {
	for _, preset := range []string{"tiny", "small"} {
		t.Run(preset, func(t *testing.T) {
			cfg, err := randckpt.Preset(preset)
			require.NoError(t, err)
			fp8Dir, bf16Dir := filepath.Join(t.TempDir(), "fp8"), filepath.Join(t.TempDir(), "bf16")
			require.NoError(t, randckpt.Write(fp8Dir, cfg, randckpt.Options{Seed: 5, FP8: true}))
			require.NoError(t, randckpt.WriteDequantizedBF16(fp8Dir, bf16Dir))

			logits := func(dir string, wantFP8 bool) []float32 {
				ck, err := model.Open(dir)
				require.NoError(t, err)
				defer ck.Close()
				require.NoError(t, ck.Validate())
				dt, _ := ck.DType("model.language_model.layers.3.self_attn.q_a_proj.weight")
				require.Equal(t, wantFP8, dt == safetensors.F8E4M3)
				e, err := engine.New(ck.Config(), ck, engine.Options{Slots: 2})
				require.NoError(t, err)
				b := &backend.Batch{}
				for i, n := range []int{23, 7} {
					s, err := e.Store().Alloc()
					require.NoError(t, err)
					b.Seqs = append(b.Seqs, backend.Seq{Slot: s, Tokens: seqTokens(n, i+1, cfg.VocabSize)})
				}
				res, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.AllLogits}, b)
				require.NoError(t, err)
				return res.Logits
			}
			a, b := logits(fp8Dir, true), logits(bf16Dir, false)
			require.Equal(t, a, b, "FP8 and dequantized BF16 logits must be identical")
		})
	}
}
