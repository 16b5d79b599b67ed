package cuda_test

import (
	"os"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/backend/cuda"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/passes/hostlen"
	"github.com/stretchr/testify/require"
)

// With host-length-reuse on, no node reads the executor's lengths: a
// poisoned executor copy (the backend's test hook, PoisonDeviceLengths)
// changes nothing. Without it, the poisoned copy is detected and the run
// fails loudly.
func TestNeverReadsExecutorLengths(t *testing.T) {
	if be, err := cuda.Open(backend.Options{}); err != nil {
		if os.Getenv("GLMFLASH_REQUIRE_GPU") != "" {
			t.Fatalf("GLMFLASH_REQUIRE_GPU is set and the CUDA backend cannot open: %v", err)
		}
		t.Skipf("CUDA backend unavailable (%v): `make test-gpu` or `make test-emu` runs this", err)
	} else {
		be.Close()
	}
	f := passtest.TinyA(t)
	cfg := f.Checkpoint.Config()
	toks := make([]int32, 30)
	for i := range toks {
		toks[i] = int32((3*131 + i*17 + i*i*7) % cfg.VocabSize)
	}
	key := engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}
	run := func(reqs []pass.Request, poison bool) (*backend.Result, backend.Program, error) {
		pl, err := pass.NewPipeline(reqs, true)
		require.NoError(t, err)
		be, err := cuda.Open(backend.Options{})
		require.NoError(t, err)
		if poison {
			cuda.PoisonDeviceLengths(be)
		}
		e, err := engine.New(cfg, f.Checkpoint, engine.Options{Slots: 1, Passes: pl, BackendInstance: be})
		require.NoError(t, err)
		t.Cleanup(func() { e.Close(); be.Close() })
		s, _ := e.Store().Alloc()
		p, err := e.Program(key)
		require.NoError(t, err)
		r, err := e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: toks}}})
		return r, p, err
	}
	res, prog, err := run([]pass.Request{{Name: hostlen.Name}}, true)
	require.NoError(t, err)
	require.Zero(t, prog.Stats().DeviceLengthReads)
	want, _, err := run(nil, false)
	require.NoError(t, err)
	require.Equal(t, want.Logits, res.Logits)

	_, _, err = run(nil, true)
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "device length"), err.Error())
}
