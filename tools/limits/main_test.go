package main

import (
	"os"
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
	o := cpulimits.Options{Runs: 2, RunTime: 5 * time.Millisecond, ReadPasses: 1, BufferBytes: 32 << 20}
	require.NoError(t, run(o, p, false))
	l, err := cpulimits.Load(p)
	require.NoError(t, err)
	require.Positive(t, l.FP32FMA.Median)
	require.Positive(t, l.ReadBandwidth.Median)
	require.Equal(t, cpulimits.ISA(), l.ISA)
	require.Error(t, run(cpulimits.Options{Runs: 0, RunTime: time.Millisecond, ReadPasses: 1}, p, false), "-runs 0 is refused")
	require.NoError(t, run(o, p, false), "this CPU's own file is replaced")

	// another CPU's file (another instruction set) is never replaced
	// without -force, and stays as it was
	other := *l
	other.ISA = "avx512-other"
	require.NoError(t, other.Save(p))
	before, err := os.ReadFile(p)
	require.NoError(t, err)
	err = run(o, p, false)
	require.ErrorContains(t, err, "another CPU's measurement")
	require.ErrorContains(t, err, `isa "avx512-other"`)
	after, err := os.ReadFile(p)
	require.NoError(t, err)
	require.Equal(t, before, after)
	require.NoError(t, run(o, p, true), "-force replaces it")
}

// The committed limits files are keyed by instruction set, and each holds
// the instruction set its name says.
func TestCommittedFilesAreKeyed(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "configs", "limits", "*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		l, err := cpulimits.Load(f)
		require.NoError(t, err, f)
		require.Equal(t, l.Slug()+".json", filepath.Base(f), "%s: the name is not the file's key", f)
	}
}
