package gpu

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/eval"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/stretchr/testify/require"
)

// An FP8 checkpoint's FP8 weights stay FP8 on the device (codes and block
// scales: about half the bytes of their bf16 form) and give the logits of
// its dequantized BF16 twin (randckpt.WriteDequantizedBF16: the same
// numbers, power-of-two scales being exact in bf16): prefill and decode,
// fp32 precision, within 1e-5 (the decode GEMV sums fp8 rows across a
// warp, the bf16 kernels in ascending k: both in double); in precision bf16
// the differences are reported (bf16 rounding amplifies the GEMV's
// different split of k across lanes).
func TestCUDAFP8WeightsStayFP8(t *testing.T) {
	cudaOptions(t, engine.Options{})
	cfg, err := randckpt.Preset("small")
	require.NoError(t, err)
	dir := t.TempDir()
	fp8Dir, twinDir := filepath.Join(dir, "fp8"), filepath.Join(dir, "bf16")
	require.NoError(t, randckpt.Write(fp8Dir, cfg, randckpt.Options{Seed: 9, FP8: true}))
	require.NoError(t, randckpt.WriteDequantizedBF16(fp8Dir, twinDir))
	open := func(d string) *model.Checkpoint {
		ck, err := model.Open(d)
		require.NoError(t, err)
		t.Cleanup(func() { ck.Close() })
		return ck
	}
	fp8ck, twin := open(fp8Dir), open(twinDir)
	for _, precision := range []backend.Precision{"fp32", "bf16"} {
		o := engine.Options{Slots: 3, Backend: backend.Options{Precision: precision}}
		V := cfg.VocabSize
		run := func(e *engine.Engine, key engine.Key, b *backend.Batch) *backend.Result {
			r, err := e.Run(key, b)
			require.NoError(t, err)
			return r
		}
		// the GPU's weights are shared by its engines: measure the FP8
		// engine's before the twin's exist
		ef := cudaEngine(t, fp8ck, o)
		s, err := ef.Store().Alloc()
		require.NoError(t, err)
		run(ef, engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: seqTokens(9, 1, V)}}})
		ef.Store().Free(s)
		m0 := ef.Backend().Info().Memory
		et := cudaEngine(t, twin, o)
		var fs, ts []int
		lens := []int{90, 5, 33}
		for i, n := range lens {
			a, err := ef.Store().Alloc()
			require.NoError(t, err)
			b, err := et.Store().Alloc()
			require.NoError(t, err)
			fs, ts = append(fs, a), append(ts, b)
			toks := seqTokens(n, i+7, V)
			key := engine.Key{Mode: graph.Prefill, Logits: graph.AllLogits}
			rf := run(ef, key, &backend.Batch{Seqs: []backend.Seq{{Slot: a, Tokens: toks}}})
			rt := run(et, key, &backend.Batch{Seqs: []backend.Seq{{Slot: b, Tokens: toks}}})
			d := maxDiff(rf.Logits, rt.Logits)
			t.Logf("%s prefill %d tokens: fp8 vs bf16 twin max|Δ| %.2e", precision, n, d)
			if precision == "fp32" {
				require.Less(t, d, 1e-5)
			}
		}
		for step := 0; step < 3; step++ {
			fb, tb := &backend.Batch{}, &backend.Batch{}
			for i := range lens {
				toks := seqTokens(1, 50+i+step, V)
				fb.Seqs = append(fb.Seqs, backend.Seq{Slot: fs[i], Tokens: toks})
				tb.Seqs = append(tb.Seqs, backend.Seq{Slot: ts[i], Tokens: toks})
			}
			key := engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}
			rf, rt := run(ef, key, fb), run(et, key, tb)
			d := maxDiff(rf.Logits, rt.Logits)
			t.Logf("%s decode step %d (3 sequences): fp8 vs bf16 twin max|Δ| %.2e", precision, step, d)
			if precision == "fp32" {
				require.Less(t, d, 1e-5)
			} else { // bf16 rounding amplifies the sums' order (and flips close routing): reported
				same := 0
				for i, tok := range argmaxRows(rt.Logits, V) {
					if argmaxRows(rf.Logits, V)[i] == tok {
						same++
					}
				}
				t.Logf("bf16 decode step %d: greedy tokens agree on %d of %d sequences", step, same, len(lens))
				require.False(t, math.IsNaN(d) || math.IsInf(d, 0))
			}
		}
		if precision != "fp32" {
			continue // the weights were uploaded once, by the first pair
		}
		m1 := et.Backend().Info().Memory
		fp8Form := m0["weights_fp8"] + m0["weights_fp8_scales"] + m0["weights_bf16"] + m0["weights_fp32"]
		twinForm := m1["weights_bf16"] + m1["weights_fp32"] - m0["weights_bf16"] - m0["weights_fp32"]
		t.Logf("device weights: FP8 checkpoint %d bytes (%v), its BF16 twin %d bytes", fp8Form, m0, twinForm)
		require.Positive(t, m0["weights_fp8"], "FP8 weights are kept as FP8")
		require.Equal(t, m0["weights_fp8"], m1["weights_fp8"], "the twin uploads no fp8")
		require.Less(t, fp8Form, twinForm, "the FP8 form is smaller")
	}
}

// argmaxRows is the greedy token of each row of logits [rows][V].
func argmaxRows(logits []float32, V int) []int {
	var out []int
	for r := 0; r+V <= len(logits); r += V {
		out = append(out, eval.Argmax(logits[r:r+V]))
	}
	return out
}
