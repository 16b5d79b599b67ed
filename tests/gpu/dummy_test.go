package gpu

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/stretchr/testify/require"
)

// weightBytes sums the device memory's weights_* categories.
func weightBytes(mem map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range mem {
		if strings.HasPrefix(k, "weights_") {
			out[k] = v
		}
	}
	return out
}

// Dummy weights (model.load_format: dummy) on the device: the tiny preset
// in the FP8 layout gives the logits of the same weights written by
// init-random and loaded normally, takes the same device memory by
// category, and keeps no host copy once uploaded (every generated tensor
// is released after its upload: ResidentBytes 0).
func TestCUDADummyWeights(t *testing.T) {
	cudaOptions(t, engine.Options{})
	cfg, err := randckpt.Preset("tiny")
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "ckpt")
	require.NoError(t, randckpt.Write(dir, cfg, randckpt.Options{Seed: 4, FP8: true}))
	disk, err := model.Open(dir)
	require.NoError(t, err)
	t.Cleanup(func() { disk.Close() })
	dummy, err := randckpt.Dummy(cfg, randckpt.DummyOptions{Seed: 4, FP8: true, Source: "dummy weights (random, seed 4) of preset tiny"})
	require.NoError(t, err)
	t.Cleanup(func() { dummy.Close() })
	o := engine.Options{Slots: 2, MaxPositions: 64}
	run := func(ck *model.Checkpoint) ([]float32, map[string]int64) {
		e := cudaEngine(t, ck, o)
		s, err := e.Store().Alloc()
		require.NoError(t, err)
		r, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.AllLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: seqTokens(11, 1, cfg.VocabSize)}}})
		require.NoError(t, err)
		return r.Logits, e.Backend().Info().Memory
	}
	want, m0 := run(disk) // the device's weights are shared by its engines: measured before the second's exist
	got, m1 := run(dummy)
	require.LessOrEqual(t, maxDiff(want, got), 1e-6, "the same weights, the same logits")
	w0, w1 := weightBytes(m0), weightBytes(m1)
	require.Positive(t, w0["weights_fp8"])
	for k, v := range w0 {
		require.Equal(t, v, w1[k]-v, "%s: the dummy engine's uploads are the checkpoint's", k)
	}
	require.Zero(t, dummy.ResidentBytes(), "no host copy after the upload")
	require.Positive(t, dummy.Fills())
}

// The gpu preset in the FP8 layout over 20 layers (about 123 GiB: more
// than the host's copy could hold beside it) is served from dummy weights
// on the H200: every weight is generated on the host as it is uploaded and
// released at once, so the peak RSS stays far below the model's size; a
// prefill and a decode step give finite logits. The load time is logged.
func TestCUDADummyGPUPreset20Layers(t *testing.T) {
	o := cudaOptions(t, engine.Options{Slots: 1, MaxPositions: 256, Backend: backend.Options{Precision: "bf16"}})
	if os.Getenv("GLMFLASH_CUDA_EMULATOR") != "" {
		t.Skip("123 GiB of weights: a GPU's test, not the emulator's")
	}
	cfg, err := randckpt.PresetWith("gpu", map[string]json.RawMessage{"num_hidden_layers": json.RawMessage("20")})
	require.NoError(t, err)
	ck, err := randckpt.Dummy(cfg, randckpt.DummyOptions{Seed: 1, FP8: true, Source: "dummy weights (random, seed 1) of preset gpu with num_hidden_layers=20"})
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	// the peak RSS from here on (VmHWM reset), not the earlier tests'
	require.NoError(t, os.WriteFile("/proc/self/clear_refs", []byte("5"), 0), "resetting the peak RSS")
	t0 := time.Now()
	e := cudaEngine(t, ck, o)
	s, err := e.Store().Alloc()
	require.NoError(t, err)
	r, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: seqTokens(16, 1, cfg.VocabSize)}}})
	require.NoError(t, err)
	load := time.Since(t0)
	r2, err := e.Run(engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: []int32{7}}}})
	require.NoError(t, err)
	for _, l := range [][]float32{r.Logits, r2.Logits} {
		for _, v := range l {
			require.False(t, math.IsNaN(float64(v)) || math.IsInf(float64(v), 0))
		}
	}
	rss := peakRSSGiB(t)
	mem := e.Backend().Info().Memory
	t.Logf("gpu preset, 20 layers, FP8 dummy weights: %.1f GiB of tensors; generated and uploaded with the prefill program in %s (%d groups generated); peak RSS %.1f GiB; device weights %v", float64(ck.TensorBytes())/(1<<30), load.Round(time.Millisecond), ck.Fills(), rss, weightBytes(mem))
	require.Zero(t, ck.ResidentBytes(), "no host copy after the upload")
	require.Less(t, rss, float64(ck.TensorBytes())/(1<<30)/4, "the host never held the model")
	var dev int64
	for _, v := range weightBytes(mem) {
		dev += v
	}
	require.GreaterOrEqual(t, dev, ck.TensorBytes()*9/10, "the weights are on the device")
}

// peakRSSGiB is the process's peak resident set (VmHWM) in GiB.
func peakRSSGiB(t *testing.T) float64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
			kib, err := strconv.ParseFloat(f[1], 64)
			require.NoError(t, err)
			return kib / (1 << 20)
		}
	}
	t.Fatal("no VmHWM in /proc/self/status")
	return 0
}
