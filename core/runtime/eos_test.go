package runtime

import (
	"context"
	"testing"

	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/model"
	"github.com/stretchr/testify/require"
)

// eosModel is the engine with end-of-sequence ids in its configuration.
type eosModel struct {
	*engine.Engine
	cfg *model.Config
}

func (m eosModel) Config() *model.Config { return m.cfg }

// The model's EOS ends generation (FinishStop, the EOS token streamed and
// counted) unless the request sets IgnoreEOS.
func TestEOSStopsUnlessIgnored(t *testing.T) {
	e := openEngine(t, 2)
	req := Request{Prompt: prompt(7, 1, 256), MaxTokens: 10, Sampling: sample.Greedy()}
	want := alone(t, e, req)
	eos := want[3]
	cut := 1 + indexOf(want, eos)
	cfg := e.Config().Clone()
	cfg.EOSTokenIDs = []int{255, int(eos)}
	rt := newRuntime(t, eosModel{Engine: e, cfg: cfg}, Config{})

	h, err := rt.Submit(context.Background(), req)
	require.NoError(t, err)
	toks, f, err := h.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishStop, f.Reason)
	require.Equal(t, want[:cut], ids(toks))
	require.Equal(t, cut, f.CompletionTokens)

	req.IgnoreEOS = true
	h, err = rt.Submit(context.Background(), req)
	require.NoError(t, err)
	toks, f, err = h.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, FinishLength, f.Reason)
	require.Equal(t, want, ids(toks))
}

func indexOf(s []int32, v int32) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}
