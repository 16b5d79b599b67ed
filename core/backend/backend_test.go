package backend_test

import (
	"slices"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	_ "github.com/glmflash/glmflash/core/backend/cpu"
	_ "github.com/glmflash/glmflash/core/backend/cuda"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/stretchr/testify/require"
)

// Every registered op that is not constant has a binding in every backend,
// and no backend binds an op the IR does not know or folds. The tables are
// static, so this needs no GPU.
func TestEveryOpBoundInEveryBackend(t *testing.T) {
	require.Equal(t, []string{"cpu", "cuda"}, backend.Names())
	want := ir.KernelOps()
	require.Contains(t, want, ir.OpMoEAppendExpert) // the plugin op too
	for _, name := range backend.Names() {
		have := backend.BoundOps(name)
		for _, op := range want {
			require.True(t, slices.Contains(have, op), "backend %s has no binding for op %s", name, op)
		}
		for _, op := range have {
			require.True(t, slices.Contains(want, op), "backend %s binds %s, which is not a kernel op of the IR", name, op)
		}
	}
}

// A precision is parsed once: "" is fp32; anything but fp32 or bf16 is an
// error saying what was given, which Open prefixes with the setting.
func TestParsePrecision(t *testing.T) {
	for in, want := range map[string]backend.Precision{"": backend.FP32, "fp32": backend.FP32, "bf16": backend.BF16} {
		got, err := backend.ParsePrecision(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	_, err := backend.ParsePrecision("fp16")
	require.ErrorIs(t, err, backend.ErrPrecision)
	require.EqualError(t, err, `must be fp32 or bf16, got "fp16"`)
	_, err = backend.Open("cpu", backend.Options{Precision: "fp16"})
	require.EqualError(t, err, `backend options: precision: must be fp32 or bf16, got "fp16"`)
}

// A program that keeps no device counters reads as its Stats with every
// device counter zero.
func TestDeviceStatsOf(t *testing.T) {
	p := statsOnly{backend.Stats{Runs: 3, DeviceLengthReads: 2, FusedMHCRuns: 1}}
	require.Equal(t, backend.DeviceStats{Stats: p.s}, backend.DeviceStatsOf(p))
	d := deviceProg{statsOnly{backend.Stats{Runs: 3}}}
	require.EqualValues(t, 7, backend.DeviceStatsOf(d).Launches)
	require.EqualValues(t, 3, backend.DeviceStatsOf(d).Runs)
}

type statsOnly struct{ s backend.Stats }

func (statsOnly) Plan() *plan.Plan                                           { return nil }
func (statsOnly) Run(*backend.Batch, backend.Store) (*backend.Result, error) { return nil, nil }
func (statsOnly) Execute(*backend.Prepared) (*backend.Result, error)         { return nil, nil }
func (p statsOnly) Stats() backend.Stats                                     { return p.s }

type deviceProg struct{ statsOnly }

func (p deviceProg) DeviceStats() backend.DeviceStats {
	return backend.DeviceStats{Stats: p.s, Launches: 7}
}

// KindOf: one-token spans and spans whose every row gets logits are
// decode spans, others prompt chunks.
func TestKindOf(t *testing.T) {
	k := func(spans ...backend.Span) backend.StepKind { return backend.KindOf(&backend.Prepared{Spans: spans}) }
	require.Equal(t, backend.StepDecode, k(backend.Span{N: 1, Rows: 1}, backend.Span{N: 4, Rows: 4}))
	require.Equal(t, backend.StepMixed, k(backend.Span{N: 1, Rows: 1}, backend.Span{N: 30, Rows: 1}))
	require.Equal(t, backend.StepPrefill, k(backend.Span{N: 30, Rows: 1}))
	require.Equal(t, "mixed", backend.StepMixed.String())
}
