package main

import (
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/glmflash/glmflash/internal/cpulimits"
	"github.com/stretchr/testify/require"
)

// A brief run writes JSON that bench --limits loads, with positive limits.
func TestRunWritesLoadableJSON(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the probe's kernels are amd64 assembly")
	}
	p := filepath.Join(t.TempDir(), "l.json")
	require.NoError(t, run(cpulimits.Options{Runs: 2, RunTime: 5 * time.Millisecond, ReadPasses: 1, BufferBytes: 32 << 20}, p))
	l, err := cpulimits.Load(p)
	require.NoError(t, err)
	require.Positive(t, l.FP32FMA.Median)
	require.Positive(t, l.ReadBandwidth.Median)
	require.Error(t, run(cpulimits.Options{Runs: 0, RunTime: time.Millisecond, ReadPasses: 1}, p), "-runs 0 is refused")
}
