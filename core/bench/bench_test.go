package bench

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/internal/cpulimits"
	"github.com/glmflash/glmflash/model"
	"github.com/stretchr/testify/require"
)

const (
	fixture    = "../../testdata/glm5next-tiny-a/checkpoint"
	mtpFixture = "../../testdata/glm5next-tiny-mtp/checkpoint"
)

// open opens a fixture and an engine on the cpu backend sized for s.
func open(t *testing.T, dir string, s Spec) (*model.Checkpoint, *engine.Engine) {
	t.Helper()
	ck, err := model.Open(dir)
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	e, err := engine.New(ck.Config(), ck, engine.Options{Slots: s.Slots(), Rollback: s.Rollback()})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	return ck, e
}

// checkSeries checks what every series holds: Reps positive runs, the
// median among them.
func checkSeries(t *testing.T, s Spec, r *Result) {
	t.Helper()
	for _, ser := range r.Series {
		require.Len(t, ser.Runs, s.Reps, ser.Name)
		for _, v := range ser.Runs {
			require.Positive(t, v, ser.Name)
		}
		require.Contains(t, ser.Runs, ser.TokensPerSec, ser.Name)
	}
}

// A run on the cpu backend: the prefill series and a decode series per
// batch (no MTP layer: no draft steps, no scheduler series), each with
// Reps measured runs after Warmup, the runs reported as measured; the
// decode roofline at the steps' mean context against the limits' read
// bandwidth by wall time, the prefill's GEMM rate against the fp32 FMA
// peak; peak RSS against checkpoint and caches; the text and JSON reports
// carry them.
func TestRunCPU(t *testing.T) {
	lim := writeLimits(t, 100, 200, 49)
	after := 0
	type run struct {
		series   string
		run, of  int
		warmup   bool
		positive bool
	}
	var runs []run
	s := Spec{Prompt: 4, DecodeContext: 3, DecodeSteps: 2, Batches: []int{1, 2}, Reps: 2, Warmup: 1, PeakTFLOPs: 1, LimitsPath: lim,
		AfterSeries: func() error { after++; return nil },
		Measured: func(series string, r, of int, warmup bool, tps float64) {
			runs = append(runs, run{series, r, of, warmup, tps > 0})
		}}
	ck, e := open(t, fixture, s)
	res, err := Run(e, ck, s)
	require.NoError(t, err)

	names := []string{"prefill 4 tokens", "decode batch 1", "decode batch 2"}
	var got []string
	for _, ser := range res.Series {
		got = append(got, ser.Name)
	}
	require.Equal(t, names, got)
	checkSeries(t, s, res)
	require.Len(t, runs, len(names)*(s.Warmup+s.Reps))
	for i, r := range runs {
		require.Equal(t, run{names[i/3], i%3 + 1, 3, i%3 == 0, true}, r)
	}
	require.Equal(t, 1, after)
	require.Error(t, res.MTPErr)
	require.False(t, ck.Config().HasMTP())

	require.Equal(t, ck.Dir(), res.Model)
	require.Equal(t, "cpu", res.Device.Backend)
	require.Positive(t, res.CPUs)
	require.Positive(t, res.GOMAXPROCS)
	require.Positive(t, res.PeakRSSMiB)
	require.Equal(t, res.PeakRSSMiB, res.Memory.PeakRSSMiB)
	require.Positive(t, res.Memory.CheckpointBytes)
	require.Positive(t, res.Memory.CacheBytes)
	require.Positive(t, res.Memory.Ratio)
	require.Nil(t, res.GEMM)
	require.Empty(t, res.OpTimes)
	require.NotNil(t, res.Limits)

	limited := cpulimits.ISA() != "" // else the file is another ISA's
	if limited {
		require.Equal(t, 49.0, res.Bandwidth)
		require.Equal(t, "the limits' read bandwidth", res.BandwidthFrom)
	} else {
		require.Equal(t, float64(DefaultCPUBandwidthGBs), res.Bandwidth)
	}
	pre := res.Series[0]
	require.Positive(t, pre.GEMMFLOPs)
	require.Positive(t, pre.AchievedGFLOPs)
	if limited {
		require.Equal(t, "fp32 FMA peak", pre.PeakName)
		require.Equal(t, 100.0, pre.PeakGFLOPs)
		require.InDelta(t, pre.AchievedGFLOPs/100, pre.PeakFraction, 1e-12)
	}
	require.Zero(t, pre.RooflineBytes)
	for i, B := range []int{1, 2} {
		d := res.Series[1+i]
		require.False(t, d.Speculative())
		require.Zero(t, d.GEMMFLOPs)
		require.Positive(t, d.RooflineBytes, d.Name)
		require.Equal(t, 3+(2+1)/2, d.RooflineContext)
		require.Positive(t, d.RooflineExperts)
		require.Positive(t, d.RooflineMs)
		require.Equal(t, "wall", d.MeasuredClock)
		require.InDelta(t, 1e3*float64(B)/d.TokensPerSec, d.MeasuredMs, 1e-9*d.MeasuredMs)
		require.Equal(t, d.MeasuredMs, d.WallMsPerStep)
		require.InDelta(t, d.MeasuredMs/d.RooflineMs, d.RooflineRatio, 1e-9*d.RooflineRatio)
		require.InDelta(t, 1/d.RooflineRatio, d.RooflineFraction, 1e-9*d.RooflineFraction)
		var sum float64
		for _, v := range d.RooflineTerms {
			require.GreaterOrEqual(t, v, 0.0)
			sum += v
		}
		require.InDelta(t, d.RooflineBytes, sum, 1e-6*d.RooflineBytes)
		require.Zero(t, d.DeviceMsPerStep, "no device time on the cpu")
	}

	var b strings.Builder
	require.NoError(t, res.WriteText(&b))
	out := b.String()
	require.True(t, strings.HasPrefix(out, "model    "+ck.Dir()+" (hidden 64, "), out)
	require.Contains(t, out, "\nmtp      none (num_nextn_predict_layers 0)\n")
	require.Contains(t, out, "\ndevice   cpu: ")
	require.Contains(t, out, "\nlimits   from "+lim)
	require.Regexp(t, `(?m)^roofline bandwidth [0-9.]+ GB/s \(.+\)$`, out)
	require.Regexp(t, `(?m)^host memory  +weights_fp32 +[0-9.]+ MiB$`, out)
	for _, n := range names {
		require.Regexp(t, `(?m)^`+regexp.QuoteMeta(n)+` +[0-9.]+ tokens/s  \(median of 2; runs \[[0-9.]+ [0-9.]+\]\)`, out)
	}
	require.Len(t, regexp.MustCompile(`(?m)^  roofline: `).FindAllString(out, -1), 2)
	require.Len(t, regexp.MustCompile(`(?m)^  compute: `).FindAllString(out, -1), 1)
	require.Regexp(t, `(?m)^peak RSS [0-9.]+ MiB = [0-9.]+× \(checkpoint [0-9.]+ MiB \+ caches [0-9.]+ MiB\)$`, out)
	require.NotContains(t, out, "prefill GEMMs")
	require.NotContains(t, out, "device time per op")

	j, err := res.JSON()
	require.NoError(t, err)
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(j, &m))
	require.Equal(t, []string{"bandwidth_from", "bandwidth_gbs", "cpus", "device", "limits", "memory", "model", "mtp", "peak_rss_mib", "results", "speculative"}, slices.Sorted(maps.Keys(m)))
	require.JSONEq(t, `{"speculative": "off"}`, string(m["speculative"]))
	var back struct {
		Results []Series       `json:"results"`
		MTP     map[string]any `json:"mtp"`
		Limits  Limits         `json:"limits"`
	}
	require.NoError(t, json.Unmarshal(j, &back))
	require.Len(t, back.Results, len(names))
	require.Equal(t, res.Series[1].RooflineBytes, back.Results[1].RooflineBytes)
	require.Equal(t, map[string]any{"layers": 0.0, "runnable": false}, back.MTP)
	require.Equal(t, res.Limits.Source, back.Limits.Source)
}

// With the MTP layer: draft steps per batch, and with a speculative
// drafter and test-drafter rates the scheduler series (plain, MTP, test
// drafter) whose greedy tokens Run checks against plain decoding's; at
// rate 1 every span is num_steps + 1 tokens, as expected.
func TestRunSpeculative(t *testing.T) {
	s := Spec{Prompt: 4, DecodeContext: 2, DecodeSteps: 6, Batches: []int{1, 2}, Reps: 1, Warmup: 0, LimitsPath: writeLimits(t, 100, 200, 49),
		Speculative: config.Speculative{Method: "mtp", NumSteps: 2}, SpecAccept: []float64{1, 0.5}}
	require.Equal(t, 2, s.SpecSteps())
	require.Equal(t, 3, s.Rollback())
	ck, e := open(t, mtpFixture, s)
	res, err := Run(e, ck, s)
	require.NoError(t, err)
	require.NoError(t, res.MTPErr)
	var got []string
	for _, ser := range res.Series {
		got = append(got, ser.Name)
	}
	want := []string{"prefill 4 tokens", "decode batch 1", "decode batch 2", "mtp draft batch 1", "mtp draft batch 2"}
	for _, B := range []int{1, 2} {
		for _, a := range []string{"plain", "mtp 2-1-3", "mtp 2-1-3 pinned at 1.00", "mtp 2-1-3 pinned at 0.50"} {
			want = append(want, fmt.Sprintf("sched decode batch %d %s", B, a))
		}
	}
	require.Equal(t, want, got)
	checkSeries(t, s, res)
	for _, ser := range res.Series {
		spec := strings.HasPrefix(ser.Name, "sched") && !strings.HasSuffix(ser.Name, "plain")
		require.Equal(t, spec, ser.Speculative(), ser.Name)
		if !spec {
			continue
		}
		require.GreaterOrEqual(t, ser.AcceptanceLength, 1.0, ser.Name)
		require.LessOrEqual(t, ser.AcceptanceLength, 3.0, ser.Name)
		require.Positive(t, ser.SpeedUp, ser.Name)
		require.Positive(t, ser.TokensPerPass, ser.Name)
		switch {
		case strings.HasSuffix(ser.Name, "at 1.00"):
			require.Equal(t, 3.0, ser.AcceptanceLength)
			require.Equal(t, 3.0, ser.ExpectedLength)
			require.Equal(t, 1.0, ser.AcceptRate)
		case strings.HasSuffix(ser.Name, "at 0.50"):
			require.Equal(t, 1.75, ser.ExpectedLength)
		default:
			require.Zero(t, ser.ExpectedLength)
		}
	}
	var b strings.Builder
	require.NoError(t, res.WriteText(&b))
	out := b.String()
	require.Regexp(t, `(?m)^mtp      1 layer\(s\) from layer \d+, weights present: draft steps measured$`, out)
	require.Regexp(t, `(?m)^spec     mtp 2-1-3 \(index share (true|false)\): drafts from the MTP layer`, out)
	require.Contains(t, out, "acceptance length 3.00 (expected 3.00), drafts accepted 100%")
	j, err := res.JSON()
	require.NoError(t, err)
	require.Contains(t, string(j), `"runnable": true`)
}

// A Spec's bounds, and what the engine must hold for it.
func TestSpec(t *testing.T) {
	ok := Spec{Prompt: 4, DecodeContext: 1, DecodeSteps: 1, Batches: []int{1, 8}, Reps: 1}
	require.NoError(t, ok.Check(16))
	require.Equal(t, 9, ok.Slots())
	require.Zero(t, ok.Rollback())
	require.Zero(t, ok.SpecSteps())
	accept := ok
	accept.SpecAccept = []float64{0.5}
	require.Equal(t, 5, accept.SpecSteps(), "the test drafter alone: 5-1-6")
	require.Equal(t, 6, accept.Rollback())
	for name, bad := range map[string]func(*Spec){
		"Prompt":        func(s *Spec) { s.Prompt = 0 },
		"Warmup":        func(s *Spec) { s.Warmup = -1 },
		"Reps + Warmup": func(s *Spec) { s.Reps, s.Warmup = MaxRuns, 1 },
		"Bandwidth":     func(s *Spec) { s.Bandwidth = -1 },
		"PeakTFLOPs":    func(s *Spec) { s.GEMMReport = true },
		"positions":     func(s *Spec) { s.DecodeContext = 16 },
		"batch sizes":   func(s *Spec) { s.Batches = []int{MaxBatch + 1} },
		"SpecAccept":    func(s *Spec) { s.SpecAccept = []float64{1.5} },
	} {
		s := ok
		bad(&s)
		require.ErrorContains(t, s.Check(16), name, name)
	}
}

// What the cpu backend cannot do is refused: it measures no GEMMs and
// times no ops.
func TestRunRefusesOnCPU(t *testing.T) {
	s := Spec{Prompt: 2, DecodeContext: 1, DecodeSteps: 1, Batches: []int{1}, Reps: 1, PeakTFLOPs: 1, GEMMReport: true}
	ck, e := open(t, fixture, s)
	_, err := Run(e, ck, s)
	require.ErrorContains(t, err, "the cpu backend does not measure its GEMMs")
	s.GEMMReport, s.ProfileOps, s.LimitsPath = false, true, writeLimits(t, 100, 200, 49)
	_, err = Run(e, ck, s)
	require.ErrorContains(t, err, "the cpu backend does not time its ops")
}

// A decode run's counters become its series' per-step figures: the
// backend's counters between two readings over the steps.
func TestStepCounters(t *testing.T) {
	s0 := backend.DeviceStats{Launches: 10, HostSyncs: 1, LengthSyncs: 1, GraphReplays: 2, Kernels: 100, DeviceNs: 1e6, PrepNs: 2e6}
	s1 := backend.DeviceStats{Launches: 30, HostSyncs: 5, LengthSyncs: 3, GraphReplays: 6, Kernels: 500, DeviceNs: 9e6, PrepNs: 6e6}
	r := &runner{s: Spec{Reps: 1}, res: &Result{}}
	require.NoError(t, r.series("decode batch 1", func() (int, float64, *perStep, error) { return 4, 1, stepCounters(s0, s1, 4), nil }))
	got := r.res.Series[0]
	require.Equal(t, Series{Name: "decode batch 1", TokensPerSec: 4, Runs: []float64{4}, LaunchesPerStep: 5, SyncsPerStep: 1, LengthSyncs: 0.5, ReplaysPerStep: 1,
		KernelsPerStep: 100, DeviceMsPerStep: 2, PrepMsPerStep: 1}, got)
}

// With SampleMask every decode series is measured a second time with every
// row's logits processed (an allow mask and edits the backend accepts),
// its runs interleaved with the plain one's, and its cost over it is
// reported by the measured clock, by wall time and by the process's CPU
// time, in the text and the JSON.
func TestRunSampleMask(t *testing.T) {
	var order []string
	s := Spec{Prompt: 4, DecodeContext: 3, DecodeSteps: 2, Batches: []int{1, 2}, Reps: 2, Warmup: 0, PeakTFLOPs: 1, LimitsPath: writeLimits(t, 100, 200, 49), SampleMask: true,
		Measured: func(series string, run, _ int, _ bool, _ float64) {
			order = append(order, fmt.Sprint(series, " #", run))
		}}
	ck, e := open(t, fixture, s)
	res, err := Run(e, ck, s)
	require.NoError(t, err)
	require.Equal(t, []string{"prefill 4 tokens #1", "prefill 4 tokens #2",
		"decode batch 1 #1", "decode batch 1 mask+edits #1", "decode batch 1 #2", "decode batch 1 mask+edits #2",
		"decode batch 2 #1", "decode batch 2 mask+edits #1", "decode batch 2 #2", "decode batch 2 mask+edits #2"}, order, "the two series' runs interleaved")
	var names []string
	for _, ser := range res.Series {
		names = append(names, ser.Name)
	}
	require.Equal(t, []string{"prefill 4 tokens", "decode batch 1", "decode batch 1 mask+edits", "decode batch 2", "decode batch 2 mask+edits"}, names)
	checkSeries(t, s, res)
	for i, ser := range res.Series[1:] {
		if i%2 == 0 {
			require.Empty(t, ser.Processing, ser.Name)
			require.Zero(t, ser.ProcessingCost, ser.Name)
			continue
		}
		plain := res.Series[i]
		require.Equal(t, "an allow mask of ~half the vocabulary and 64 edits on every row", ser.Processing)
		require.Positive(t, ser.RooflineBytes, ser.Name)
		require.InDelta(t, ser.MeasuredMs/plain.MeasuredMs-1, ser.ProcessingCost, 1e-12)
		require.Equal(t, ser.ProcessingCost, ser.ProcessingWallCost, "the cpu's measured clock is the wall's")
		require.NotZero(t, ser.ProcessingCost)
		require.Positive(t, ser.CPUMsPerStep, ser.Name)
		require.Positive(t, plain.CPUMsPerStep, plain.Name)
		require.InDelta(t, ser.CPUMsPerStep/plain.CPUMsPerStep-1, ser.ProcessingCPUCost, 1e-12)
	}
	var b strings.Builder
	require.NoError(t, res.WriteText(&b))
	require.Regexp(t, `decode batch 2 mask\+edits .*\n.*\n  logits processing \(an allow mask of ~half the vocabulary and 64 edits on every row\): [+-]\d+\.\d% of the plain step's wall time, [+-]\d+\.\d% of its CPU time \([0-9.e+]+ against [0-9.e+]+ ms of the process's user \+ system time per step\)\n`, b.String())
	j, err := res.JSON()
	require.NoError(t, err)
	require.Contains(t, string(j), `"processing_cost_fraction":`)
	require.Contains(t, string(j), `"processing_cpu_cost_fraction":`)
}

// ProcessedSpecs are valid processing (as the backends check it): each
// row its own mask of about half the vocabulary, MaskEdits sorted edits
// (all of a smaller vocabulary).
func TestProcessedSpecs(t *testing.T) {
	for _, V := range []int{32000, 100, 33} {
		specs := ProcessedSpecs(3, V)
		require.Len(t, specs, 3)
		for i := range specs {
			sp := &specs[i]
			require.NoError(t, sp.CheckProcessing(V))
			require.Len(t, sp.Edits, min(MaskEdits, V))
			require.Zero(t, sp.Params.Temperature)
			n := 0
			for tok := 0; tok < V; tok++ {
				if sample.Allowed(sp.Allow, int32(tok)) {
					n++
				}
			}
			if V >= 1000 {
				require.InDelta(t, 0.5, float64(n)/float64(V), 0.05)
			}
		}
		require.NotEqual(t, specs[0].Allow, specs[1].Allow, "each row its own mask")
	}
}

// The by-kind counters between two readings become per-step figures of
// the kinds that ran, in kind order, and the text report prints them.
func TestKindFigures(t *testing.T) {
	var s0, s1 backend.DeviceStats
	s0.ByKind[backend.StepDecode] = backend.KindStats{Steps: 2, Launches: 2, GraphReplays: 2, Kernels: 200, Tokens: 16}
	s1.ByKind[backend.StepDecode] = backend.KindStats{Steps: 6, Launches: 6, GraphReplays: 6, Kernels: 600, Tokens: 48, DeviceNs: 4e6}
	s1.ByKind[backend.StepMixed] = backend.KindStats{Steps: 4, Launches: 4, GraphReplays: 4, Kernels: 800, Tokens: 4 * 520, PadTokens: 4 * 504, DeviceNs: 8e6}
	got := kindFigures(s0, s1)
	require.Equal(t, []KindFigures{
		{Kind: "decode", Steps: 4, LaunchesPerStep: 1, ReplaysPerStep: 1, KernelsPerStep: 100, TokensPerStep: 8, DeviceMsPerStep: 1},
		{Kind: "mixed", Steps: 4, LaunchesPerStep: 1, ReplaysPerStep: 1, KernelsPerStep: 200, TokensPerStep: 520, PadPerStep: 504, DeviceMsPerStep: 2},
	}, got)
	r := &Result{}
	var b strings.Builder
	r.writeSeries(&b, &Series{Name: "mixed batch 8 + chunk 512", TokensPerSec: 1, Runs: []float64{1}, LaunchesPerStep: 1, Kinds: got})
	require.Contains(t, b.String(), "by step kind: decode 4 steps, 1.0 launches (1.0 graph replays), 100 kernels, 8 tokens; mixed 4 steps, 1.0 launches (1.0 graph replays), 200 kernels, 520 tokens + 504 padding")
}

// On a tensor-parallel engine the decode series carry rank 0's collectives
// per step: one all-reduce for the embedding and two per layer (after the
// attention output and after the MLP/MoE), one all-gather of the logits.
func TestRunTensorParallel(t *testing.T) {
	s := Spec{Prompt: 4, DecodeContext: 3, DecodeSteps: 2, Batches: []int{2}, Reps: 1, PeakTFLOPs: 1, LimitsPath: writeLimits(t, 100, 200, 49)}
	ck, err := model.Open(fixture)
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	e, err := engine.New(ck.Config(), ck, engine.Options{Slots: s.Slots(), Rollback: s.Rollback(), TP: 2})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	res, err := Run(e, ck, s)
	require.NoError(t, err)
	L := ck.Config().NumHiddenLayers
	var decode *Series
	for i := range res.Series {
		if res.Series[i].Name == "decode batch 2" {
			decode = &res.Series[i]
		}
	}
	require.NotNil(t, decode)
	require.Equal(t, float64(1+2*L), decode.AllReducesPerStep)
	require.Equal(t, 1.0, decode.AllGathersPerStep)
	cfg := ck.Config()
	B, D, H := 2, cfg.HiddenSize, cfg.HCMult
	// embedding streams, 2L hidden rows, the rank's half of each row's logits
	want := 4 * (B*H*D + 2*L*B*D + B*cfg.VocabSize/2)
	require.Equal(t, float64(want), decode.CollectiveBytesPerStep)
	require.Positive(t, decode.CollectiveMsPerStep)
	var text strings.Builder
	require.NoError(t, res.WriteText(&text))
	require.Contains(t, text.String(), fmt.Sprintf("%d all-reduces, 1 all-gathers", 1+2*L))
}
