package cpu_test

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"sync"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/backend/cpu"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/stretchr/testify/require"
)

// logitsHash runs a two-sequence prefill (all logits) and a decode step on
// the checkpoint in dir and hashes the float32 bits of every logit.
func logitsHash(t *testing.T, dir string, o engine.Options) (string, *engine.Engine) {
	t.Helper()
	ck, err := model.Open(dir)
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	o.Slots = 2
	e, err := engine.New(ck.Config(), ck, o)
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	V := ck.Config().VocabSize
	h := sha256.New()
	add := func(l []float32) {
		for _, x := range l {
			require.NoError(t, binary.Write(h, binary.LittleEndian, math.Float32bits(x)))
		}
	}
	b := &backend.Batch{}
	for i, n := range []int{19, 6} {
		s, err := e.Store().Alloc()
		require.NoError(t, err)
		toks := make([]int32, n)
		for j := range toks {
			toks[j] = int32((j*7919 + i*104729 + 13) % V)
		}
		b.Seqs = append(b.Seqs, backend.Seq{Slot: s, Tokens: toks})
	}
	res, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.AllLogits}, b)
	require.NoError(t, err)
	add(res.Logits)
	for i := range b.Seqs {
		b.Seqs[i].Tokens = []int32{int32(3 + i)}
	}
	res, err = e.Run(engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}, b)
	require.NoError(t, err)
	add(res.Logits)
	return fmt.Sprintf("%x", h.Sum(nil)[:12]), e
}

// The CPU backend's logits are bit-identical whether its weights are read in
// place (bf16 from the mapping, FP8 dequantized once) or loaded as float32
// through the plan (FP32Weights: the path every weight took before weights
// were read in place), on the transformers fixtures and on an FP8
// checkpoint. (When the weight binding changed, both also equalled the
// logits of the commit before it, b7a0492: recorded hashes, dropped once
// the vector activation kernels changed the bits of both paths alike.)
func TestLogitsUnchangedByWeightBinding(t *testing.T) {
	dirs := map[string]string{}
	for _, f := range []string{"glm5next-tiny-a", "glm5next-tiny-b", "glm5next-tiny-c"} {
		dirs[f] = filepath.Join("..", "..", "..", "testdata", f, "checkpoint")
	}
	cfg, err := randckpt.Preset("small")
	require.NoError(t, err)
	fp8 := filepath.Join(t.TempDir(), "fp8")
	require.NoError(t, randckpt.Write(fp8, cfg, randckpt.Options{Seed: 5, FP8: true}))
	dirs["small-fp8"] = fp8
	for name, dir := range dirs {
		mapped, e := logitsHash(t, dir, engine.Options{})
		loaded, _ := logitsHash(t, dir, engine.Options{Backend: backend.Options{FP32Weights: true}})
		t.Logf("%s: %s (in place, memory %v, weight cache %d), %s (float32)", name, mapped, e.Backend().Info().Memory, e.WeightBytes(), loaded)
		require.Equal(t, loaded, mapped, name)
	}
}

// A BF16 checkpoint's GEMM weights are read in place from its mapping: the
// backend holds no bf16 copy, and its float32 constants (norms, biases,
// conv and mHC parameters, the fp32 kernels' weights) are a small fraction
// of the mapped bytes; the engine's float32 weight cache holds only those.
func TestBF16WeightsAreNotCopied(t *testing.T) {
	for _, f := range []string{"glm5next-tiny-a", "glm5next-tiny-b", "glm5next-tiny-c"} {
		_, e := logitsHash(t, filepath.Join("..", "..", "..", "testdata", f, "checkpoint"), engine.Options{})
		mem := e.Backend().Info().Memory
		mapped, fp32 := mem[cpu.MemBF16Mapped], mem[cpu.MemFP32]
		require.Positive(t, mapped, f)
		require.Zero(t, mem[cpu.MemBF16], "%s: bf16 weights copied", f)
		require.Less(t, fp32, mapped/2, "%s: %d float32 bytes for %d mapped", f, fp32, mapped)
		require.Equal(t, fp32, e.WeightBytes(), "%s: the weight cache holds more than the float32 constants", f)
	}
}

// Programs of lazy plans over one weight cache, compiled by several
// goroutines at once on one backend, bind each weight once and share it
// (run with -race: the plans' lazy loads and the backend's bound weights
// are mutex-guarded).
func TestConcurrentLazyCompileSharesWeights(t *testing.T) {
	ck, err := model.Open(filepath.Join("..", "..", "..", "testdata", "glm5next-tiny-a", "checkpoint"))
	require.NoError(t, err)
	defer ck.Close()
	be := cpu.New(backend.Options{})
	require.True(t, be.LazyWeights())
	cache := plan.NewWeightCache(ck)
	modes := []graph.Options{{Mode: graph.Prefill, Logits: graph.AllLogits}, {Mode: graph.Decode, Logits: graph.LastLogits}}
	var wg sync.WaitGroup
	errs := make([]error, 4*len(modes))
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := graph.Build(ck.Config(), modes[i%len(modes)])
			if err == nil {
				var pl *plan.Plan
				if pl, err = plan.Compile(g, cache, plan.Options{Lazy: true}); err == nil {
					_, err = be.Compile(pl)
				}
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	once := be.Info().Memory
	for _, m := range modes {
		g, err := graph.Build(ck.Config(), m)
		require.NoError(t, err)
		pl, err := plan.Compile(g, cache, plan.Options{Lazy: true})
		require.NoError(t, err)
		_, err = be.Compile(pl)
		require.NoError(t, err)
	}
	require.Equal(t, once, be.Info().Memory, "compiling again bound new copies")
}

// An FP8 checkpoint's routed experts stay FP8 (codes in the mapping, block
// scales on the heap: weights_fp8, weights_fp8_scales), not dequantized to
// bf16 or float32 copies, and give the logits of the float32 path
// (TestLogitsUnchangedByWeightBinding checks the bits).
func TestFP8ExpertsKeptFP8(t *testing.T) {
	cfg, err := randckpt.Preset("small")
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "fp8")
	require.NoError(t, randckpt.Write(dir, cfg, randckpt.Options{Seed: 5, FP8: true}))
	_, e := logitsHash(t, dir, engine.Options{})
	mem := e.Backend().Info().Memory
	t.Logf("memory: %v", mem)
	experts := mem[cpu.MemFP8]
	require.Positive(t, experts, "FP8 experts are kept as FP8")
	require.Positive(t, mem[cpu.MemFP8Scales])
	require.Less(t, mem[cpu.MemFP8Scales], experts/1000, "128×128 blocks: one scale per 16384 codes")
	// the experts are the bulk of the weights: what is copied to bf16 is
	// less than what stays FP8
	require.Less(t, mem[cpu.MemBF16], experts, "bf16 copies: %v", mem)
}
