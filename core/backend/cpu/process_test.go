package cpu_test

import (
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/stretchr/testify/require"
)

// A batch whose sampling spec carries processing no backend could read
// (an edit outside the vocabulary, a mask of the wrong length) is refused
// when it is prepared, naming the spec; valid processing runs.
func TestPrepareChecksProcessing(t *testing.T) {
	f := passtest.TinyA(t)
	cfg := f.Checkpoint.Config()
	e, err := engine.New(cfg, f.Checkpoint, engine.Options{Slots: 1})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	s, err := e.Store().Alloc()
	require.NoError(t, err)
	key := engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}
	prog, err := e.Program(key)
	require.NoError(t, err)
	V := cfg.VocabSize
	prep := func(spec backend.SampleSpec) error {
		_, err := backend.Prepare(prog, &backend.Batch{Seqs: []backend.Seq{{Slot: s, Tokens: []int32{1, 2}}}, Sample: []backend.SampleSpec{spec}}, e.Store(), nil)
		return err
	}
	greedy := sample.Greedy()
	require.ErrorContains(t, prep(backend.SampleSpec{Params: greedy, Edits: []sample.Edit{{Token: int32(V)}}}), "backend: sampling spec 0: edit 0: token 256 is outside the vocabulary")
	require.ErrorContains(t, prep(backend.SampleSpec{Params: greedy, Allow: make([]uint32, 1)}), "backend: sampling spec 0: allow mask of 1 words")
	require.NoError(t, prep(backend.SampleSpec{Params: greedy, Edits: []sample.Edit{{Token: 3, Add: 100}}, Allow: make([]uint32, sample.AllowWords(V))}))
}
