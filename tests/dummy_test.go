package tests

import (
	"encoding/json"
	"math"
	"path/filepath"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/stretchr/testify/require"
)

// dummyRun runs a prefill of two sequences and one decode step on the CPU
// over ck and returns the logits of both and the backend's memory by
// category.
func dummyRun(t *testing.T, ck *model.Checkpoint) (prefill, decode []float32, mem map[string]int64) {
	t.Helper()
	cfg := ck.Config()
	e, err := engine.New(cfg, ck, engine.Options{Slots: 2})
	require.NoError(t, err)
	defer e.Close()
	b := &backend.Batch{}
	for i, n := range []int{19, 6} {
		s, err := e.Store().Alloc()
		require.NoError(t, err)
		b.Seqs = append(b.Seqs, backend.Seq{Slot: s, Tokens: seqTokens(n, i+1, cfg.VocabSize)})
	}
	res, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.AllLogits}, b)
	require.NoError(t, err)
	prefill = res.Logits
	for i := range b.Seqs {
		b.Seqs[i].Tokens = []int32{int32(3 + i)}
	}
	res, err = e.Run(engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}, b)
	require.NoError(t, err)
	return prefill, res.Logits, e.Backend().Info().Memory
}

// Dummy weights (model.load_format: dummy) are the very bytes init-random
// writes for the same preset, overrides, seed and layout: the CPU engine
// over them gives the logits of the written checkpoint loaded normally, bit
// for bit, and holds the same memory by category (bf16 read in place, FP8
// codes and scales, fp32 constants).
func TestDummyWeightsMatchWrittenCheckpoint(t *testing.T) {
	four := map[string]json.RawMessage{"num_hidden_layers": json.RawMessage("4")}
	for _, c := range []struct {
		name, preset string
		set          map[string]json.RawMessage
		fp8          bool
	}{
		{"tiny", "tiny", nil, false},
		{"tiny-fp8", "tiny", nil, true},
		{"bench-4-layers-fp8", "bench", four, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := randckpt.PresetWith(c.preset, c.set)
			require.NoError(t, err)
			dir := filepath.Join(t.TempDir(), "ckpt")
			require.NoError(t, randckpt.Write(dir, cfg, randckpt.Options{Seed: 3, FP8: c.fp8}))
			disk, err := model.Open(dir)
			require.NoError(t, err)
			defer disk.Close()
			dummy, err := randckpt.Dummy(cfg, randckpt.DummyOptions{Seed: 3, FP8: c.fp8, Source: "dummy weights (random, seed 3) of preset " + c.preset})
			require.NoError(t, err)
			defer dummy.Close()
			wp, wd, wm := dummyRun(t, disk)
			gp, gd, gm := dummyRun(t, dummy)
			require.Equal(t, wp, gp, "prefill logits")
			require.Equal(t, wd, gd, "decode logits")
			require.Equal(t, wm, gm, "memory by category")
			if c.fp8 {
				require.Positive(t, gm["weights_fp8"])
				require.Positive(t, gm["weights_fp8_scales"])
			}
			require.Positive(t, gm["weights_bf16_mapped"])
			require.Positive(t, dummy.Fills())
			require.LessOrEqual(t, dummy.ResidentBytes(), dummy.TensorBytes())
		})
	}
}

// Any layer count can be served from dummy weights: the tiny preset with
// 20 layers (the preset has 8) runs, with finite logits, and the seed
// selects the weights.
func TestDummyWeightsAnyLayerCount(t *testing.T) {
	cfg, err := randckpt.PresetWith("tiny", map[string]json.RawMessage{"num_hidden_layers": json.RawMessage("20")})
	require.NoError(t, err)
	logits := func(seed int64) []float32 {
		ck, err := randckpt.Dummy(cfg, randckpt.DummyOptions{Seed: seed, FP8: true, Source: "dummy weights (random) of preset tiny with num_hidden_layers=20"})
		require.NoError(t, err)
		defer ck.Close()
		require.Equal(t, 20, ck.Config().NumHiddenLayers)
		require.True(t, ck.Has("model.language_model.layers.19.mlp.experts.7.down_proj.weight"))
		p, _, _ := dummyRun(t, ck)
		return p
	}
	a := logits(1)
	for _, v := range a {
		require.False(t, math.IsNaN(float64(v)) || math.IsInf(float64(v), 0))
	}
	require.NotEqual(t, a, logits(2), "another seed, other weights")
}
