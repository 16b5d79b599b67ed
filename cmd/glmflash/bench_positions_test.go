package main

import (
	"testing"

	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/stretchr/testify/require"
)

// The gpu preset's released context takes the seeds' shapes: an
// 8000 + 1000-token request and bench's --decode-context 8192 fit its
// limits, and bench's stores hold what its series reach (at least 8192
// positions), not the whole 202752.
func TestGPUPresetTakesLongContexts(t *testing.T) {
	cfg, err := randckpt.Preset("gpu")
	require.NoError(t, err)
	c, err := sched.Config{ContextLimit: 9000}.WithDefaults(cfg, 16)
	require.NoError(t, err)
	require.Equal(t, 9000, c.ContextLimit)
	c, err = sched.Config{}.WithDefaults(cfg, 16)
	require.NoError(t, err)
	require.Equal(t, 202752, c.ContextLimit)
	f := benchFlags{prompt: 512, decodeCtx: 8192, decodeSteps: 64, reps: 1, peakTFLOPs: 989}
	require.NoError(t, f.check())
	require.LessOrEqual(t, f.decodeCtx+f.decodeSteps, cfg.MaxPositionEmbeddings)
	require.Equal(t, 8192+64+1, benchPositions(cfg.MaxPositionEmbeddings, 512, 8192, 64, 0))
	require.Equal(t, 8192+64*7+7+1, benchPositions(cfg.MaxPositionEmbeddings, 512, 8192, 64, 7), "a verify step emits up to its span")
	require.Equal(t, 8192, benchPositions(cfg.MaxPositionEmbeddings, 512, 32, 64, 0), "at least 8192, as before")
	require.Equal(t, 4096, benchPositions(4096, 512, 32, 64, 0), "at most the model's")
	require.Equal(t, 131072+1, benchPositions(cfg.MaxPositionEmbeddings, 131072, 32, 64, 0))
}
