package cuda_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/backend/cuda"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/model"
)

// BenchmarkEagerDecodeStep runs eager decode steps (graphs off) of 4
// sequences on the tiny fixture and reports the host's planning per step
// (prep-ns/op: metadata and the arena layout, DeviceStats.PrepNs) beside
// the step's wall time; on the emulator the kernels dominate the latter.
func BenchmarkEagerDecodeStep(b *testing.B) {
	be, err := cuda.Open(backend.Options{})
	if err != nil {
		if os.Getenv("GLMFLASH_REQUIRE_GPU") != "" {
			b.Fatalf("GLMFLASH_REQUIRE_GPU is set and the CUDA backend cannot open: %v", err)
		}
		b.Skipf("CUDA backend unavailable (%v)", err)
	}
	be.Close()
	ck, err := model.Open(filepath.Join("..", "..", "..", "testdata", "glm5next-tiny-a", "checkpoint"))
	if err != nil {
		b.Fatal(err)
	}
	defer ck.Close()
	const n = 4
	e, err := engine.New(ck.Config(), ck, engine.Options{Slots: n, Device: "cuda", MaxPositions: 4096,
		Backend: backend.Options{Device: cuda.Options{GraphMaxTokens: -1}}})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	V := ck.Config().VocabSize
	pre, dec := &backend.Batch{}, &backend.Batch{}
	for i := range n {
		s, err := e.Store().Alloc()
		if err != nil {
			b.Fatal(err)
		}
		toks := make([]int32, 9+i)
		for j := range toks {
			toks[j] = int32((j*31 + i*7 + 1) % V)
		}
		pre.Seqs = append(pre.Seqs, backend.Seq{Slot: s, Tokens: toks})
		dec.Seqs = append(dec.Seqs, backend.Seq{Slot: s, Tokens: []int32{int32(5 + i)}})
	}
	if _, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, pre); err != nil {
		b.Fatal(err)
	}
	key := engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}
	for range 3 {
		if _, err := e.Run(key, dec); err != nil {
			b.Fatal(err)
		}
	}
	p, err := e.Program(key)
	if err != nil {
		b.Fatal(err)
	}
	s0 := backend.DeviceStatsOf(p)
	b.ResetTimer()
	for range b.N {
		if _, err := e.Run(key, dec); err != nil {
			b.Fatal(err)
		}
	}
	s1 := backend.DeviceStatsOf(p)
	b.ReportMetric(float64(s1.PrepNs-s0.PrepNs)/float64(s1.Runs-s0.Runs), "prep-ns/op")
}
