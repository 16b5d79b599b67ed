package text

import (
	"context"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/sched"
	"github.com/stretchr/testify/require"
)

// Merge reads a group's choices at once: every chunk and final comes out
// under its choice's index; a stop string ends its choice alone (the
// other runs to max_tokens); the text of each merged choice is the text of
// its stream read alone. A context that ends stops the readers (goleak).
func TestMergeReadsEveryChoice(t *testing.T) {
	rt, m := setup(t)
	ctx := context.Background()
	req := sched.Request{Prompt: []int32{72, 105, 33, 10}, MaxTokens: 12, Sampling: sample.Params{Temperature: 0, TopP: 1}, IgnoreEOS: true}
	alone, _, _ := generate(t, rt, m, nil, 12)
	require.GreaterOrEqual(t, len(alone), 4)
	stop := alone[2:4] // greedy: both choices write alone; choice 1 stops there
	req.N = 2
	g, err := rt.SubmitGroup(ctx, req)
	require.NoError(t, err)
	var streams []*Stream
	for i, h := range g.Choices() {
		var stops []string
		if i == 1 {
			stops = []string{stop}
		}
		streams = append(streams, NewStream(m, h, stops, nil, func(n int) { _ = rt.Stop(h.ID(), n) }))
	}
	mg := Merge(ctx, streams)
	defer mg.Close()
	texts := make([]strings.Builder, 2)
	finals := make([]*Final, 2)
	for {
		it, done, err := mg.Next()
		require.NoError(t, err)
		if done {
			break
		}
		require.Nil(t, finals[it.Choice], "choice %d: output after its final", it.Choice)
		if it.Final != nil {
			finals[it.Choice] = it.Final
			continue
		}
		texts[it.Choice].WriteString(it.Chunk.Text)
	}
	require.Equal(t, alone, texts[0].String())
	require.Equal(t, sched.FinishLength, finals[0].Reason)
	require.Equal(t, alone[:strings.Index(alone, stop)], texts[1].String())
	require.Equal(t, sched.FinishStop, finals[1].Reason)
	require.Equal(t, stop, finals[1].StopString)

	cctx, cancel := context.WithCancel(ctx)
	req.MaxTokens = 200
	g, err = rt.SubmitGroup(cctx, req)
	require.NoError(t, err)
	streams = nil
	for _, h := range g.Choices() {
		streams = append(streams, NewStream(m, h, nil, nil, func(n int) { _ = rt.Stop(h.ID(), n) }))
	}
	mg2 := Merge(cctx, streams)
	_, _, err = mg2.Next()
	require.NoError(t, err)
	cancel()
	for err == nil {
		_, _, err = mg2.Next()
	}
	require.ErrorIs(t, err, context.Canceled)
	mg2.Close()
}
