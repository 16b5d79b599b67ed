package tests

import (
	"path/filepath"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/backend/cpu"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/glmflash/glmflash/passes/gateup"
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

// The dense FP8 weights (attention projections, dense MLPs, shared
// experts; with mlp-gate-up-fusion also their gate-up concatenations) are
// used as FP8 by the CPU backend like the routed experts: every F8_E4M3
// byte of the checkpoint is held as weights_fp8 and no FP8 weight is
// widened to a bf16 copy (the checkpoint's bf16 copies are those of its
// BF16 tensors, which its dequantized twin makes too). In fp32 the logits
// of a prefill and a decode step equal the twin's bit for bit; in bf16
// they are within bf16 rounding of the twin's (decode products sum in
// another order).
func TestFP8DenseWeightsStayFP8(t *testing.T) {
	cfg, err := randckpt.Preset("small")
	require.NoError(t, err)
	fp8Dir, bf16Dir := filepath.Join(t.TempDir(), "fp8"), filepath.Join(t.TempDir(), "bf16")
	require.NoError(t, randckpt.Write(fp8Dir, cfg, randckpt.Options{Seed: 7, FP8: true}))
	require.NoError(t, randckpt.WriteDequantizedBF16(fp8Dir, bf16Dir))
	var fp8Bytes int64
	{
		ck, err := model.Open(fp8Dir)
		require.NoError(t, err)
		for _, name := range ck.Names() {
			if info, _ := ck.Info(name); info.DType == safetensors.F8E4M3 {
				fp8Bytes += info.End - info.Begin
			}
		}
		require.NoError(t, ck.Close())
	}
	require.Positive(t, fp8Bytes)
	gateUp := append(config.Default().Requests(), pass.Request{Name: gateup.Name})
	type run struct {
		logits [][]float32
		mem    map[string]int64
		fused  int // gate-up sites fused, over the programs
	}
	runOn := func(dir string, reqs []pass.Request, precision backend.Precision) run {
		ck, err := model.Open(dir)
		require.NoError(t, err)
		defer ck.Close()
		o := engine.Options{Slots: 2, Backend: backend.Options{Precision: precision}}
		if reqs != nil {
			pl, err := pass.NewPipeline(reqs, true)
			require.NoError(t, err)
			o.Passes, o.PassEnv = pl, config.Default().PassEnv(ck.Config(), ck)
		}
		e, err := engine.New(ck.Config(), ck, o)
		require.NoError(t, err)
		defer e.Close()
		b := &backend.Batch{}
		for i, n := range []int{23, 7} {
			s, err := e.Store().Alloc()
			require.NoError(t, err)
			b.Seqs = append(b.Seqs, backend.Seq{Slot: s, Tokens: seqTokens(n, i+3, cfg.VocabSize)})
		}
		var r run
		res, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.AllLogits}, b)
		require.NoError(t, err)
		r.logits = append(r.logits, res.Logits)
		for i := range b.Seqs {
			b.Seqs[i].Tokens = []int32{int32(11 + i)}
		}
		res, err = e.Run(engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}, b)
		require.NoError(t, err)
		r.logits = append(r.logits, res.Logits)
		r.mem = e.Backend().Info().Memory
		for _, rep := range e.Reports() {
			if pr := rep.Find(gateup.Name); pr != nil {
				require.Empty(t, pr.Error)
				r.fused += len(pr.Fired)
			}
		}
		return r
	}
	for _, c := range []struct {
		name string
		reqs []pass.Request
	}{{"no passes", nil}, {"default passes + gate-up fusion", gateUp}} {
		for _, prec := range []backend.Precision{"fp32", "bf16"} {
			a, b := runOn(fp8Dir, c.reqs, prec), runOn(bf16Dir, c.reqs, prec)
			t.Logf("%s, %s: FP8 memory %v; twin %v", c.name, prec, a.mem, b.mem)
			require.Equal(t, fp8Bytes, a.mem[cpu.MemFP8], "%s: every FP8 byte is used as FP8", c.name)
			require.Less(t, a.mem[cpu.MemBF16], b.mem[cpu.MemBF16]+1, "%s: no FP8 weight widened", c.name)
			if c.reqs == nil {
				require.Zero(t, a.mem[cpu.MemBF16], "no passes: no bf16 copy at all")
			} else {
				require.Positive(t, a.fused, "gate-up fusion fired on the FP8 weights")
			}
			for i := range a.logits {
				if prec == "fp32" {
					require.Equal(t, b.logits[i], a.logits[i], "%s, run %d: the twin's logits", c.name, i)
				} else {
					require.Less(t, gemm.MaxRelDiff(a.logits[i], b.logits[i]), 0.05, "%s, run %d", c.name, i)
				}
			}
		}
	}
}
