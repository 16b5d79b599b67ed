// Package bench is glmflash's benchmark harness (`glmflash bench`): on an
// engine, a prefill series, decode series at each batch size, MTP draft
// steps, speculative decoding through the scheduler, the decode roofline,
// the prefill's GEMM rate against the CPU's limits or the GEMM report of a
// backend that measures its GEMMs, and peak memory; Run measures what a
// Spec asks and returns a Result, which renders as text or JSON.
package bench

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"syscall"
	"time"

	"github.com/glmflash/glmflash/core/attrib"
	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/roofline"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/speculative"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
)

// Spec is what a benchmark measures.
type Spec struct {
	// Prompt is the prefill series' prompt length.
	Prompt int
	// DecodeContext is the tokens prefilled (untimed) per sequence before
	// a decode series' steps: the context they attend; DecodeSteps the
	// steps of one measured run (decode, MTP draft and scheduler series).
	DecodeContext, DecodeSteps int
	// Batches are the decode batch sizes (each in [1, MaxBatch]).
	Batches []int
	// Reps are the measured runs of every series, after Warmup runs that
	// are not counted.
	Reps, Warmup int
	// MixedChunk, when > 0, measures a mixed series at each batch size B
	// ("mixed batch B + chunk C"): every step holds the B decoding
	// sequences' tokens beside the next MixedChunk-token chunk of one more
	// sequence's prompt (a long prompt arriving while others decode), its
	// launches reported by step kind (Series.Kinds).
	MixedChunk int
	// Speculative is the drafter measured through the scheduler when on
	// (the configuration's speculative section: mtp:N; with
	// simulate_acceptance its series runs with simulated acceptance).
	// SpecAccept are per-draft acceptance rates and SpecAcceptLen
	// acceptance lengths (tokens per verify step, the rate solved from
	// speculative.RateForLength) at which SpecDrafter is measured pinned
	// too (its steps: Speculative's, else 5).
	Speculative   config.Speculative
	SpecAccept    []float64
	SpecAcceptLen []float64
	// SpecDrafter is the drafter the pinned series run: DrafterConfigured
	// (Speculative's drafter, its drafts replaced by the plain run's greedy
	// tokens spoiled at the rate: speculative.Pinned; greedy tokens checked
	// against plain decoding's), DrafterSimulated (Speculative's drafter
	// with its acceptance simulated at the rate, as SGLang's
	// SGLANG_SIMULATE_ACC_LEN: outputs are not the model's and are not
	// checked) or DrafterScripted (the test drafter alone: the same drafts
	// as configured's, no drafter work); "": with Speculative on,
	// configured at fp32 and simulated at a lower precision (where a
	// verify's argmax can differ from a decode step's at near-ties, so the
	// plain run's tokens stop being the target's and the pin slips), else
	// the scripted one.
	SpecDrafter string
	// DFlashBlock is the DFlash drafter's block_size when Speculative is
	// method dflash (the engine runs the drafter: engine.Options.DFlash).
	DFlashBlock int
	// GEMMReport times the prefill program's GEMM weight shapes with the
	// backend's tuner (an ir.GEMMTuner) against PeakTFLOPs.
	GEMMReport bool
	PeakTFLOPs float64
	// Bandwidth (GB/s) is the decode roofline's: the bytes a step reads ÷
	// it; 0: on the cpu backend the limits' read bandwidth (else
	// DefaultCPUBandwidthGBs), on cuda DefaultCUDABandwidthGBs, on another
	// backend DefaultCPUBandwidthGBs. BandwidthFrom says where a nonzero
	// one came from (the report prints it).
	Bandwidth     float64
	BandwidthFrom string
	// LimitsPath is the CPU's limits file (tools/limits) that the cpu
	// backend's figures compare with; "": measured by a quick probe after
	// the series.
	LimitsPath string
	// ProfileOps reads the device time per op of the prefill and decode
	// programs after the series (an engine made with
	// engine.Setup.ProfileOps, on a backend.OpProfiler).
	ProfileOps bool
	// SampleMask measures every decode series a second time with logits
	// processing on every row ("decode batch B mask+edits": an allow mask
	// of about half the vocabulary and MaskEdits edits, see
	// ProcessedSpecs), its runs interleaved with the plain series', and
	// the step's cost over the plain one (Series.ProcessingCost).
	SampleMask bool
	// AfterSeries, when set, runs after the series and the peak RSS,
	// before the CPU's limits are measured (a heap profile of the heap as
	// the measured runs left it).
	AfterSeries func() error
	// Measured, when set, is told every run of every series.
	Measured func(series string, run, of int, warmup bool, tokensPerSec float64)
}

// Bounds of a Spec (beyond them nothing useful is measured).
const (
	MaxRuns  = 1000 // Reps + Warmup
	MaxBatch = 1024 // a decode batch
)

// The drafters of the pinned series (Spec.SpecDrafter).
const (
	DrafterConfigured = "configured"
	DrafterSimulated  = "simulated"
	DrafterScripted   = "scripted"
)

// SpecSteps are the draft steps of the speculative series (0: none): a
// DFlash drafter's block − 1 (DFlashBlock).
func (s Spec) SpecSteps() int {
	n := s.Speculative.Steps()
	if s.Speculative.DFlash() {
		n = max(s.DFlashBlock-1, 0)
	}
	if n == 0 && len(s.SpecAccept)+len(s.SpecAcceptLen) > 0 {
		n = 5 // the test drafter alone: 5-1-6
	}
	return n
}

// PinnedDrafter is the drafter the pinned series run on a backend of
// precision p (SpecDrafter with its default settled).
func (s Spec) PinnedDrafter(p backend.Precision) string {
	switch {
	case s.SpecDrafter != "":
		return s.SpecDrafter
	case s.Speculative.On() && p == backend.FP32:
		return DrafterConfigured
	case s.Speculative.On():
		return DrafterSimulated
	}
	return DrafterScripted
}

// Slots are the cache slots the engine needs: the largest batch and one
// more (the prefill series').
func (s Spec) Slots() int {
	m := 1
	for _, b := range s.Batches {
		m = max(m, b)
	}
	return m + 1
}

// Rollback is the positions the engine's stores must cut back (the longest
// verify span; 0 without speculative series).
func (s Spec) Rollback() int {
	if n := s.SpecSteps(); n > 0 {
		return n + 1
	}
	return 0
}

// Check says what is wrong with a Spec for a model of maxPositions
// positions.
func (s Spec) Check(maxPositions int) error {
	switch {
	case s.Prompt < 1 || s.DecodeContext < 1 || s.DecodeSteps < 1 || s.Reps < 1 || s.Warmup < 0:
		return fmt.Errorf("bench: Prompt, DecodeContext, DecodeSteps and Reps must be ≥ 1, Warmup ≥ 0")
	case s.Reps+s.Warmup > MaxRuns:
		return fmt.Errorf("bench: Reps + Warmup must be at most %d, got %d", MaxRuns, s.Reps+s.Warmup)
	case !(s.Bandwidth >= 0) || (s.GEMMReport && !(s.PeakTFLOPs > 0)):
		return fmt.Errorf("bench: Bandwidth must be ≥ 0 and PeakTFLOPs > 0, got %v and %v", s.Bandwidth, s.PeakTFLOPs)
	case s.MixedChunk < 0 || s.MixedChunk*s.DecodeSteps > maxPositions:
		return fmt.Errorf("bench: MixedChunk must be ≥ 0 and MixedChunk × DecodeSteps (%d) fit the model's %d positions", s.MixedChunk*s.DecodeSteps, maxPositions)
	case s.Prompt > maxPositions || s.DecodeContext+s.DecodeSteps > maxPositions:
		return fmt.Errorf("bench: Prompt (%d) and DecodeContext + DecodeSteps (%d) must fit the model's %d positions", s.Prompt, s.DecodeContext+s.DecodeSteps, maxPositions)
	}
	for _, b := range s.Batches {
		if b < 1 || b > MaxBatch {
			return fmt.Errorf("bench: batch sizes must be in [1, %d], got %d", MaxBatch, b)
		}
	}
	for _, r := range s.SpecAccept {
		if !(r >= 0 && r <= 1) {
			return fmt.Errorf("bench: SpecAccept rates must be in [0, 1], got %v", r)
		}
	}
	for _, l := range s.SpecAcceptLen {
		if _, err := speculative.RateForLength(l, s.SpecSteps()); err != nil {
			return fmt.Errorf("bench: SpecAcceptLen: %w", err)
		}
	}
	switch s.SpecDrafter {
	case "", DrafterScripted:
	case DrafterConfigured, DrafterSimulated:
		if !s.Speculative.On() {
			return fmt.Errorf("bench: SpecDrafter %s needs a configured drafter (Speculative is off)", s.SpecDrafter)
		}
	default:
		return fmt.Errorf("bench: SpecDrafter must be %s, %s or %s, got %q", DrafterConfigured, DrafterSimulated, DrafterScripted, s.SpecDrafter)
	}
	if s.SpecDrafter == DrafterSimulated {
		if err := s.simulable(); err != nil {
			return err
		}
	}
	return nil
}

// simulable refuses a pinned rate of 0 for the simulated drafter: the
// scheduler's simulated acceptance takes a rate > 0 (0 is off).
func (s Spec) simulable() error {
	for _, p := range s.pins() {
		if p.rate <= 0 {
			return fmt.Errorf("bench: a pinned acceptance of rate 0 (%s) cannot be simulated (simulate_acceptance 0 is off): give a rate > 0, or SpecDrafter %s at fp32", p, DrafterConfigured)
		}
	}
	return nil
}

// Checkpoint is what Run reads of the checkpoint beyond the engine: its
// directory (the peak RSS is compared with its .safetensors bytes) and its
// weights' dtypes (the GEMM report's kinds). *model.Checkpoint is one.
type Checkpoint interface {
	Dir() string
	DType(name string) (safetensors.DType, bool)
}

// generatedWeights is a Checkpoint whose weights were made in memory
// (model.load_format: dummy): *model.Checkpoint says so.
type generatedWeights interface {
	Generated() bool
	Source() string     // says the weights are random
	TensorBytes() int64 // the checkpoint's size, were it written
}

// modelName is the report's model line: the directory, or what generated
// weights are (never to be taken for a checkpoint's).
func modelName(ck Checkpoint) string {
	if isGenerated(ck) {
		return ck.(generatedWeights).Source()
	}
	return ck.Dir()
}

func isGenerated(ck Checkpoint) bool {
	g, ok := ck.(generatedWeights)
	return ok && g.Generated()
}

// checkpointSize is the weights' stored size: the directory's .safetensors
// files, or the generated tensors' bytes.
func checkpointSize(ck Checkpoint) int64 {
	if isGenerated(ck) {
		return ck.(generatedWeights).TensorBytes()
	}
	return checkpointBytes(ck.Dir())
}

// Series is one measurement series.
type Series struct {
	Name         string    `json:"name"`
	TokensPerSec float64   `json:"tokens_per_s"`
	Runs         []float64 `json:"runs_tokens_per_s"`
	// Per decode step (the backend's counters over the measured steps):
	// kernel launches, host waits for the device, and the waits that were
	// sequence-length read-backs (device backends).
	LaunchesPerStep float64 `json:"launches_per_step,omitempty"`
	ReplaysPerStep  float64 `json:"graph_replays_per_step,omitempty"`
	SyncsPerStep    float64 `json:"host_syncs_per_step,omitempty"`
	LengthSyncs     float64 `json:"length_syncs_per_step,omitempty"`
	// Tensor-parallel engines (parallel.tp_size > 1), per decode step on
	// rank 0 (every rank issues the same): all-reduces and all-gathers,
	// the bytes the rank contributed to them and the wall time spent in
	// them (waiting for the other ranks included).
	AllReducesPerStep      float64 `json:"all_reduces_per_step,omitempty"`
	AllGathersPerStep      float64 `json:"all_gathers_per_step,omitempty"`
	CollectiveBytesPerStep float64 `json:"collective_bytes_per_step,omitempty"`
	CollectiveMsPerStep    float64 `json:"collective_ms_per_step,omitempty"`
	// Speculative decoding series (through the scheduler): tokens per
	// verify span (accepted drafts + 1), the expected value at a fixed
	// acceptance rate, tokens per trunk pass per sequence in the decode
	// phase, the drafts' acceptance rate, and decode tok/s over the plain
	// series of the same batch.
	AcceptanceLength float64 `json:"acceptance_length,omitempty"`
	ExpectedLength   float64 `json:"expected_acceptance_length,omitempty"`
	TokensPerPass    float64 `json:"tokens_per_trunk_pass,omitempty"`
	AcceptRate       float64 `json:"draft_acceptance_rate,omitempty"`
	SpeedUp          float64 `json:"speedup_over_plain,omitempty"`
	spec             bool
	// Drafter names the series' drafter ("mtp", "mtp pinned", "test");
	// PinnedRate is the per-draft acceptance rate it was pinned at (nil:
	// not pinned), TargetLength the acceptance length that rate was solved
	// for (0: asked as a rate). SimulatedAcceptance is the scheduler's
	// simulated per-draft acceptance (speculative.simulate_acceptance; 0:
	// off): the series' outputs are not the model's, and are not checked
	// against plain decoding.
	Drafter             string   `json:"drafter,omitempty"`
	PinnedRate          *float64 `json:"pinned_acceptance_rate,omitempty"`
	TargetLength        float64  `json:"target_acceptance_length,omitempty"`
	SimulatedAcceptance float64  `json:"simulated_acceptance,omitempty"`
	// GreedyAgreement, below fp32 (where a speculative series' greedy
	// tokens are not checked: a verify's argmax can differ from a decode
	// step's at near-ties), is the share of the series' greedy tokens
	// equal to plain decoding's, each request compared up to its first
	// difference (nil: checked, at fp32, or simulated).
	GreedyAgreement *float64 `json:"greedy_agreement,omitempty"`
	// The drafter's own work per verify step (one scheduler step verifying
	// every sequence of the batch; speculative.DrafterTime) over the
	// measured runs: the host wall time of its Propose and Observe calls,
	// the device time of its programs (backends that time their device
	// work) and how many of its programs ran; VerifySteps the steps.
	DrafterMsPerStep       float64 `json:"drafter_ms_per_verify_step,omitempty"`
	DrafterProposeMs       float64 `json:"drafter_propose_ms_per_verify_step,omitempty"`
	DrafterObserveMs       float64 `json:"drafter_observe_ms_per_verify_step,omitempty"`
	DrafterDeviceMsPerStep float64 `json:"drafter_device_ms_per_verify_step,omitempty"`
	DrafterRunsPerStep     float64 `json:"drafter_program_runs_per_verify_step,omitempty"`
	VerifySteps            int     `json:"verify_steps,omitempty"`
	// VerifySpans are the verify spans (one per sequence and step) of the
	// measured runs, ChainRate their per-draft acceptance rate measured as
	// a chain (accepted ÷ (accepted + spans ended by a rejection):
	// speculative.DrafterTime.ChainRate; the pinned or simulated rate's
	// estimate, unlike AcceptRate unbiased by spans cut short).
	// ChainDecisions are the drafts the rate is over (accepted + rejected).
	VerifySpans    int     `json:"verify_spans,omitempty"`
	ChainRate      float64 `json:"per_draft_acceptance_rate,omitempty"`
	ChainDecisions int     `json:"per_draft_decisions,omitempty"`
	// Kinds break the measured steps' counters down by step kind (decode
	// only, mixed, prefill only: backend.KindOf), the kinds that ran.
	Kinds []KindFigures `json:"by_step_kind,omitempty"`
	// KernelsPerStep counts the kernels a step ran (those inside a graph
	// replay too); DeviceMsPerStep its device time from CUDA events.
	KernelsPerStep  float64 `json:"kernels_per_step,omitempty"`
	DeviceMsPerStep float64 `json:"device_ms_per_step,omitempty"`
	// PrepMsPerStep is the host's planning before a step's first device
	// work (not in DeviceMsPerStep); WallMsPerStep the step's wall time at
	// the median run (B sequences ÷ tokens/s).
	PrepMsPerStep float64 `json:"host_prep_ms_per_step,omitempty"`
	WallMsPerStep float64 `json:"wall_ms_per_step,omitempty"`
	// Decode series: the roofline (core/roofline) of a step at the series'
	// mean context, its bytes by term and the expected distinct experts per
	// MoE layer; its time at the bandwidth; the measured time per step
	// (clock "device": DeviceMsPerStep, else "wall") and its ratio to it.
	RooflineBytes   float64            `json:"roofline_bytes_per_step,omitempty"`
	RooflineTerms   map[string]float64 `json:"roofline_bytes_by_term,omitempty"`
	RooflineContext int                `json:"roofline_context,omitempty"`
	RooflineExperts float64            `json:"roofline_experts_per_moe_layer,omitempty"`
	RooflineMs      float64            `json:"roofline_ms_per_step,omitempty"`
	MeasuredMs      float64            `json:"measured_ms_per_step,omitempty"`
	MeasuredClock   string             `json:"measured_clock,omitempty"`
	RooflineRatio   float64            `json:"roofline_ratio,omitempty"`
	// RooflineFraction is RooflineMs over MeasuredMs: the fraction of the
	// bandwidth roofline the step reaches (1: at the measured bandwidth).
	RooflineFraction float64 `json:"roofline_fraction,omitempty"`
	// Prefill series on the cpu backend: the run's GEMM FLOPs
	// (prefillFLOPs), the rate at the median run, and the compute peak of
	// the limits it is compared with (the fp32 FMA peak in fp32, the
	// vdpbf16ps peak in bf16) with the fraction reached.
	GEMMFLOPs      float64 `json:"gemm_flops_per_run,omitempty"`
	AchievedGFLOPs float64 `json:"achieved_gflops,omitempty"`
	PeakGFLOPs     float64 `json:"peak_gflops,omitempty"`
	PeakName       string  `json:"peak,omitempty"`
	PeakFraction   float64 `json:"peak_fraction,omitempty"`
	// Decode series with logits processing (Spec.SampleMask): what every
	// row carried, and the step's time over the plain series' of the same
	// batch, minus 1: by the measured clock (device time where the backend
	// reports it, else wall) and by wall time.
	// ProcessingCPUCost is the same by the process's CPU time per step,
	// which a machine shared with other work disturbs less than the wall's.
	Processing         string  `json:"processing,omitempty"`
	ProcessingCost     float64 `json:"processing_cost_fraction,omitempty"`
	ProcessingWallCost float64 `json:"processing_wall_cost_fraction,omitempty"`
	ProcessingCPUCost  float64 `json:"processing_cpu_cost_fraction,omitempty"`
	// CPUMsPerStep is the process's CPU time (user + system, every
	// thread) per decode step at the median run.
	CPUMsPerStep float64 `json:"cpu_ms_per_step,omitempty"`
}

// KindFigures are one step kind's counters per step of that kind over a
// series' measured steps (backend.KindStats): kernel launches (a graph
// replay is one), graph replays, kernels run, tokens and the padding
// tokens a bucket graph ran beside them, device time.
type KindFigures struct {
	Kind            string  `json:"kind"`
	Steps           int64   `json:"steps"`
	LaunchesPerStep float64 `json:"launches_per_step"`
	ReplaysPerStep  float64 `json:"graph_replays_per_step"`
	KernelsPerStep  float64 `json:"kernels_per_step"`
	TokensPerStep   float64 `json:"tokens_per_step"`
	PadPerStep      float64 `json:"padding_tokens_per_step,omitempty"`
	DeviceMsPerStep float64 `json:"device_ms_per_step,omitempty"`
}

// kindFigures are the kinds that ran between two readings, per step of
// each.
func kindFigures(s0, s1 backend.DeviceStats) []KindFigures {
	var out []KindFigures
	for k := backend.StepKind(0); k < backend.NumStepKinds; k++ {
		d := s1.ByKind[k].Sub(s0.ByKind[k])
		if d.Steps <= 0 {
			continue
		}
		n := float64(d.Steps)
		out = append(out, KindFigures{Kind: k.String(), Steps: d.Steps, LaunchesPerStep: float64(d.Launches) / n, ReplaysPerStep: float64(d.GraphReplays) / n,
			KernelsPerStep: float64(d.Kernels) / n, TokensPerStep: float64(d.Tokens) / n, PadPerStep: float64(d.PadTokens) / n, DeviceMsPerStep: float64(d.DeviceNs) / 1e6 / n})
	}
	return out
}

// Speculative reports whether the series is a speculative decoding
// series through the scheduler (its acceptance fields are meaningful).
func (s *Series) Speculative() bool { return s.spec }

// ProgramOps is the device time per op of one program over every run.
type ProgramOps struct {
	Program engine.Key
	Ops     []backend.OpTime
}

// Result is what Run measured.
type Result struct {
	// Model is the checkpoint's directory (for generated weights, what
	// they are: "dummy weights (random, …)"), Config its model.
	Model  string
	Config *model.Config
	// DummyWeights: the weights are random, made in memory
	// (model.load_format: dummy), not a checkpoint's.
	DummyWeights bool
	// MTPErr says why the MTP draft steps were not measured (nil: they
	// were); Speculative is the drafter of the speculative series.
	MTPErr      error
	Speculative config.Speculative
	// PinnedDrafter is the drafter of the pinned series (DrafterConfigured,
	// DrafterSimulated or DrafterScripted; "": none ran).
	PinnedDrafter string
	Series        []Series
	// CPUs and GOMAXPROCS are the machine's; GoVersion the runtime's.
	CPUs, GOMAXPROCS int
	GoVersion        string
	// Device is the backend's information after the series (its memory
	// by category).
	Device backend.Info
	// WeightBytes is the engine's host weight cache.
	WeightBytes int64
	// Bandwidth is the decode roofline's (GB/s), BandwidthFrom where it
	// came from.
	Bandwidth     float64
	BandwidthFrom string
	// Limits are the CPU's (cpu backend only).
	Limits *Limits
	// GEMM is the GEMM report (Spec.GEMMReport).
	GEMM *GEMMReport
	// PeakRSSMiB is the process's peak RSS after the series; Memory it
	// against the checkpoint and caches (the ratio on the cpu backend).
	PeakRSSMiB float64
	Memory     MemReport
	// OpTimes are the prefill and decode programs' (Spec.ProfileOps).
	OpTimes []ProgramOps
}

var (
	prefillKey = engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}
	decodeKey  = engine.Key{Mode: graph.Decode, Logits: graph.LastLogits}
)

// runner measures a Spec's series on one engine.
type runner struct {
	e     *engine.Engine
	ck    Checkpoint
	s     Spec
	cfg   *model.Config
	onCPU bool
	store backend.Store
	res   *Result
	// prefill is the prefill series' index in res.Series; decode the
	// batch of each decode series by index.
	prefill int
	decode  map[int]int
	// masked maps each processed decode series' index to its plain one's
	// (Spec.SampleMask).
	masked map[int]int
}

// Run measures what s asks on engine e over checkpoint ck. The engine
// must hold s.Slots() slots rolling back s.Rollback() positions.
func Run(e *engine.Engine, ck Checkpoint, s Spec) (*Result, error) {
	cfg := e.Config()
	if err := s.Check(cfg.MaxPositionEmbeddings); err != nil {
		return nil, err
	}
	be := e.Backend()
	r := &runner{e: e, ck: ck, s: s, cfg: cfg, onCPU: be.Name() == "cpu", store: e.Store(), decode: map[int]int{}, masked: map[int]int{},
		res: &Result{Model: modelName(ck), DummyWeights: isGenerated(ck), Config: cfg, Speculative: s.Speculative, Bandwidth: s.Bandwidth, BandwidthFrom: s.BandwidthFrom}}
	tuner, _ := be.(ir.GEMMTuner)
	if s.GEMMReport && tuner == nil {
		return nil, fmt.Errorf("bench: the %s backend does not measure its GEMMs (it is no ir.GEMMTuner)", be.Name())
	}
	if r.res.Bandwidth == 0 && !r.onCPU {
		r.res.Bandwidth, r.res.BandwidthFrom = DefaultCUDABandwidthGBs, "the default"
		if be.Name() != "cuda" {
			r.res.Bandwidth = DefaultCPUBandwidthGBs
		}
	}
	held := roofline.Held(be.Info().Memory["weights_fp8"] > 0, false) // no engine from configuration keeps fp32 GEMM weights
	for _, step := range []func() error{
		func() error { return r.measure(tuner) },
		r.memory,
		r.limits,
		func() error { return r.rooflines(held) },
		r.processingCosts,
		r.opTimes,
	} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	r.res.CPUs, r.res.GOMAXPROCS, r.res.GoVersion = runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version()
	r.res.WeightBytes = e.WeightBytes()
	return r.res, nil
}

// measure runs every series: the prefill (and the GEMM report after it),
// decode at each batch size, MTP draft steps, speculative decoding.
func (r *runner) measure(tuner ir.GEMMTuner) error {
	s, res := r.s, r.res
	if err := r.prefillSeries(); err != nil {
		return err
	}
	r.prefill = len(res.Series) - 1
	// the prefill program's GEMMs, measured by the backend's tuner
	if s.GEMMReport {
		prog, err := r.e.Program(prefillKey)
		if err != nil {
			return err
		}
		res.GEMM = measureGEMMs(tuner, prefillGEMMs(prog.Plan(), tuner, r.ck.DType), s.Prompt, s.PeakTFLOPs)
	}
	// decode at each batch size, after a DecodeContext-token prefill per
	// sequence (not timed)
	// (with SampleMask, the same steps with every row's logits processed,
	// their runs interleaved with the plain series' so that both see the
	// same machine)
	for _, B := range s.Batches {
		name, run := r.decodeSeries(B, false)
		if !s.SampleMask {
			if err := r.series(name, run); err != nil {
				return err
			}
			r.decode[len(res.Series)-1] = B
			continue
		}
		mname, mrun := r.decodeSeries(B, true)
		if err := r.interleaved([]string{name, mname}, []runFunc{run, mrun}); err != nil {
			return err
		}
		plain := len(res.Series) - 2
		r.decode[plain], r.decode[plain+1] = B, B
		r.masked[plain+1] = plain
	}
	// mixed steps at each batch size: decode tokens beside a prompt chunk
	if s.MixedChunk > 0 {
		for _, B := range s.Batches {
			if err := r.series(r.mixedSeries(B)); err != nil {
				return err
			}
		}
	}
	// MTP draft steps at each batch size, when the checkpoint has the MTP
	// layer: a 32-token trunk prefill (FinalHidden) and the MTP prefill
	// over it (not timed), then chained draft steps, each reading the
	// previous step's greedy token and MTP hidden row.
	if res.MTPErr = r.e.MTPReady(); res.MTPErr == nil {
		for _, B := range s.Batches {
			if err := r.series(fmt.Sprintf("mtp draft batch %d", B), func() (int, float64, *perStep, error) {
				n, secs, err := benchMTP(r.e, B, s.DecodeSteps, r.alloc, r.free)
				return n, secs, nil, err
			}); err != nil {
				return err
			}
		}
	}
	// speculative decoding through the scheduler: plain decoding, the MTP
	// drafter (Speculative) and the test drafter at fixed acceptance rates
	// (SpecAccept), at each batch size; greedy outputs must equal plain
	// decoding's
	if len(s.pins()) > 0 {
		res.PinnedDrafter = s.PinnedDrafter(r.e.Backend().Info().Precision)
		if res.PinnedDrafter == DrafterSimulated {
			if err := s.simulable(); err != nil {
				return err
			}
		}
	}
	if s.SpecSteps() > 0 {
		for _, B := range s.Batches {
			if err := r.speculative(B); err != nil {
				return err
			}
		}
	}
	return nil
}

// memory takes the peak RSS and, on the cpu backend, compares it with the
// checkpoint plus the host caches (a device backend's weights and caches
// are not in the RSS: no ratio); then AfterSeries.
func (r *runner) memory() error {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	r.res.PeakRSSMiB = float64(ru.Maxrss) / 1024 // KiB → MiB on Linux
	var ckBytes, cacheBytes int64
	if sb, ok := r.store.(interface{ Bytes() int64 }); ok && r.onCPU {
		ckBytes, cacheBytes = checkpointSize(r.ck), sb.Bytes()
	}
	r.res.Memory = NewMemReport(r.res.PeakRSSMiB, ckBytes, cacheBytes)
	if r.s.AfterSeries != nil {
		return r.s.AfterSeries()
	}
	return nil
}

// limits reads or measures the CPU's limits on the cpu backend, after the
// peak RSS is taken (the probe's read buffer is not the model's memory):
// the roofline's bandwidth unless given, the prefill's GEMM rate against
// the compute peak.
func (r *runner) limits() error {
	res := r.res
	res.Device = r.e.Backend().Info()
	if !r.onCPU {
		return nil
	}
	lim := cpuLimits(r.s.LimitsPath)
	res.Limits = &lim
	if res.Bandwidth == 0 {
		res.Bandwidth, res.BandwidthFrom = DefaultCPUBandwidthGBs, "the default (the limits have no read bandwidth)"
		if lim.Limits != nil && lim.Limits.ReadBandwidth != nil {
			res.Bandwidth, res.BandwidthFrom = lim.Limits.ReadBandwidth.Median, "the limits' read bandwidth"
		}
	}
	prog, err := r.e.Program(prefillKey)
	if err != nil {
		return err
	}
	pk, name, _ := lim.peakFor(string(res.Device.Precision))
	prefillAgainstPeak(&res.Series[r.prefill], prefillFLOPs(prog.Plan(), r.s.Prompt, 1), r.s.Prompt, pk, name)
	return nil
}

// rooflines fill the decode series' rooflines at the steps' mean context.
func (r *runner) rooflines(held roofline.Holding) error {
	context := r.s.DecodeContext + (r.s.DecodeSteps+1)/2
	for i, B := range r.decode {
		if err := rooflineFor(&r.res.Series[i], r.cfg, held, B, context, r.res.Bandwidth); err != nil {
			return err
		}
	}
	return nil
}

// processingCosts set each processed decode series' cost over its plain
// series (after the rooflines, which set the measured times).
func (r *runner) processingCosts() error {
	for i, plain := range r.masked {
		m, p := &r.res.Series[i], &r.res.Series[plain]
		m.Processing = fmt.Sprintf("an allow mask of ~half the vocabulary and %d edits on every row", min(MaskEdits, r.cfg.VocabSize))
		if p.MeasuredMs > 0 && p.WallMsPerStep > 0 {
			m.ProcessingCost, m.ProcessingWallCost = m.MeasuredMs/p.MeasuredMs-1, m.WallMsPerStep/p.WallMsPerStep-1
		}
		if p.CPUMsPerStep > 0 {
			m.ProcessingCPUCost = m.CPUMsPerStep/p.CPUMsPerStep - 1
		}
	}
	return nil
}

// opTimes read the prefill and decode programs' device time per op
// (Spec.ProfileOps).
func (r *runner) opTimes() error {
	if !r.s.ProfileOps {
		return nil
	}
	for _, key := range []engine.Key{prefillKey, decodeKey} {
		prog, err := r.e.Program(key)
		if err != nil {
			return err
		}
		op, ok := prog.(backend.OpProfiler)
		if !ok {
			return fmt.Errorf("bench: the %s backend does not time its ops (it is no backend.OpProfiler)", r.res.Device.Backend)
		}
		r.res.OpTimes = append(r.res.OpTimes, ProgramOps{Program: key, Ops: op.OpTimes()})
	}
	return nil
}

// runFunc is one run of a series: the tokens processed, the seconds its
// timed part took and, for a decode run, its counters per step.
type runFunc func() (int, float64, *perStep, error)

// series runs warm-up + measured repetitions of one workload and adds its
// Series.
func (r *runner) series(name string, run runFunc) error {
	return r.interleaved([]string{name}, []runFunc{run})
}

// interleaved runs the warm-up + measured repetitions of several
// workloads in turn (run i of each, then run i+1), so that a comparison
// between them sees the same machine, and adds their Series in order.
func (r *runner) interleaved(names []string, runs []runFunc) error {
	tps, cpu := make([][]float64, len(runs)), make([][]float64, len(runs))
	counters := make([]*perStep, len(runs))
	of := r.s.Warmup + r.s.Reps
	for i := 0; i < of; i++ {
		for k, run := range runs {
			n, secs, c, err := run()
			if err != nil {
				return err
			}
			counters[k] = c // the last run's
			warm := i < r.s.Warmup
			if r.s.Measured != nil {
				r.s.Measured(names[k], i+1, of, warm, float64(n)/secs)
			}
			if !warm {
				tps[k] = append(tps[k], float64(n)/secs)
				if c != nil {
					cpu[k] = append(cpu[k], c.cpuMs)
				}
			}
		}
	}
	for k, name := range names {
		sorted := slices.Clone(tps[k])
		sort.Float64s(sorted)
		s := Series{Name: name, TokensPerSec: sorted[len(sorted)/2], Runs: tps[k]}
		if c := counters[k]; c != nil {
			s.LaunchesPerStep, s.SyncsPerStep, s.LengthSyncs, s.ReplaysPerStep = c.launches, c.syncs, c.lengthSyncs, c.replays
			s.KernelsPerStep, s.DeviceMsPerStep, s.PrepMsPerStep, s.Kinds = c.kernels, c.deviceMs, c.prepMs, c.kinds
			s.AllReducesPerStep, s.AllGathersPerStep, s.CollectiveBytesPerStep, s.CollectiveMsPerStep = c.allReduces, c.allGathers, c.commBytes, c.commMs
			sort.Float64s(cpu[k])
			s.CPUMsPerStep = cpu[k][len(cpu[k])/2]
		}
		r.res.Series = append(r.res.Series, s)
	}
	return nil
}

// perStep are a decode run's counters per step.
type perStep struct {
	launches, syncs, lengthSyncs, replays, kernels float64
	deviceMs, prepMs, cpuMs                        float64
	kinds                                          []KindFigures
	allReduces, allGathers, commBytes, commMs      float64
}

// cpuTime is the process's CPU time so far (user + system, every thread).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// stepCounters are a program's counters between two readings per step.
// (The one place bench reads a backend's counters.)
func stepCounters(s0, s1 backend.DeviceStats, steps int) *perStep {
	n := float64(steps)
	per := func(d int64) float64 { return float64(d) / n }
	return &perStep{launches: per(s1.Launches - s0.Launches), syncs: per(s1.HostSyncs - s0.HostSyncs), lengthSyncs: per(s1.LengthSyncs - s0.LengthSyncs),
		replays: per(s1.GraphReplays - s0.GraphReplays), kernels: per(s1.Kernels - s0.Kernels),
		deviceMs: float64(s1.DeviceNs-s0.DeviceNs) / 1e6 / n, prepMs: float64(s1.PrepNs-s0.PrepNs) / 1e6 / n, kinds: kindFigures(s0, s1)}
}

func (r *runner) alloc(n int) ([]int, error) {
	var slots []int
	for i := 0; i < n; i++ {
		s, err := r.store.Alloc()
		if err != nil {
			r.free(slots)
			return nil, err
		}
		slots = append(slots, s)
	}
	return slots, nil
}

func (r *runner) free(slots []int) {
	for _, s := range slots {
		r.store.Free(s)
	}
}

// prefillSeries is the prefill series: one sequence of Prompt tokens.
func (r *runner) prefillSeries() error {
	p := r.s.Prompt
	return r.series(fmt.Sprintf("prefill %d tokens", p), func() (int, float64, *perStep, error) {
		slots, err := r.alloc(1)
		if err != nil {
			return 0, 0, nil, err
		}
		defer r.free(slots)
		t0 := time.Now()
		_, err = r.e.Run(prefillKey, &backend.Batch{Seqs: []backend.Seq{{Slot: slots[0], Tokens: attrib.BenchTokens(p, 1, r.cfg.VocabSize)}}})
		return p, time.Since(t0).Seconds(), nil, err
	})
}

// decodeSeries is the decode series of batch B, its name and run:
// DecodeSteps greedy steps after an untimed DecodeContext-token prefill of
// every sequence; with processed, every row's logits processed
// (ProcessedSpecs).
func (r *runner) decodeSeries(B int, processed bool) (string, runFunc) {
	steps := r.s.DecodeSteps
	name, specs := fmt.Sprintf("decode batch %d", B), attrib.GreedySpecs(B)
	if processed {
		name, specs = name+" mask+edits", ProcessedSpecs(B, r.cfg.VocabSize)
	}
	return name, func() (int, float64, *perStep, error) {
		slots, err := r.alloc(B)
		if err != nil {
			return 0, 0, nil, err
		}
		defer r.free(slots)
		if err := attrib.PrefillSlotsN(r.e, slots, r.cfg.VocabSize, r.s.DecodeContext); err != nil {
			return 0, 0, nil, err
		}
		prog, err := r.e.Program(attrib.DecodeKey)
		if err != nil {
			return 0, 0, nil, err
		}
		s0, c0 := backend.DeviceStatsOf(prog), cpuTime()
		k0, _ := r.e.Collectives()
		t0 := time.Now()
		for st := 0; st < steps; st++ {
			if err := attrib.DecodeStep(r.e, slots, specs, st, r.cfg.VocabSize); err != nil {
				return 0, 0, nil, err
			}
		}
		secs := time.Since(t0).Seconds()
		c := stepCounters(s0, backend.DeviceStatsOf(prog), steps)
		if k1, ok := r.e.Collectives(); ok {
			d, n := k1.Sub(k0), float64(steps)
			c.allReduces, c.allGathers, c.commBytes, c.commMs = float64(d.AllReduces)/n, float64(d.AllGathers)/n, float64(d.Bytes)/n, float64(d.Time)/1e6/n
		}
		c.cpuMs = float64(cpuTime()-c0) / 1e6 / float64(steps)
		return B * steps, secs, c, nil
	}
}

// mixedKey is the mixed series' program: the scheduler's generation steps.
var mixedKey = engine.Key{Mode: graph.Mixed, Logits: graph.LastLogits}

// mixedSeries is the mixed series of batch B, its name and run:
// DecodeSteps steps, each the B sequences' decode tokens (after an untimed
// DecodeContext-token prefill of each) beside the next MixedChunk tokens
// of one more sequence's prompt, greedy on every row, only ids coming back
// (the scheduler's plain steps). Its tokens are every token run (decode
// and prompt).
func (r *runner) mixedSeries(B int) (string, runFunc) {
	steps, C, V := r.s.DecodeSteps, r.s.MixedChunk, r.cfg.VocabSize
	return fmt.Sprintf("mixed batch %d + chunk %d", B, C), func() (int, float64, *perStep, error) {
		slots, err := r.alloc(B + 1)
		if err != nil {
			return 0, 0, nil, err
		}
		defer r.free(slots)
		if err := attrib.PrefillSlotsN(r.e, slots[:B], V, r.s.DecodeContext); err != nil {
			return 0, 0, nil, err
		}
		prog, err := r.e.Program(mixedKey)
		if err != nil {
			return 0, 0, nil, err
		}
		prompt := attrib.BenchTokens(C*steps, 7, V)
		specs := attrib.GreedySpecs(B + 1)
		s0, c0 := backend.DeviceStatsOf(prog), cpuTime()
		t0 := time.Now()
		for st := 0; st < steps; st++ {
			b := &backend.Batch{Sample: specs, SamplesOnly: true}
			for i, s := range slots[:B] {
				b.Seqs = append(b.Seqs, backend.Seq{Slot: s, Tokens: []int32{int32((st*31 + i) % V)}})
			}
			b.Seqs = append(b.Seqs, backend.Seq{Slot: slots[B], Tokens: prompt[st*C : (st+1)*C]})
			if _, err := r.e.Run(mixedKey, b); err != nil {
				return 0, 0, nil, err
			}
		}
		secs := time.Since(t0).Seconds()
		c := stepCounters(s0, backend.DeviceStatsOf(prog), steps)
		c.cpuMs = float64(cpuTime()-c0) / 1e6 / float64(steps)
		return (B + C) * steps, secs, c, nil
	}
}

// MaskEdits are the edits ProcessedSpecs gives every row.
const MaskEdits = 64

// ProcessedSpecs are greedy specs of n rows over a vocabulary of vocab ids
// whose logits are processed as a constrained request's with penalties
// would be: each row's own allow mask of about half the vocabulary (random
// bits) and MaskEdits edits (at most vocab; a repetition penalty 1.2 and
// an addend −0.5 on spread tokens, as over a context's tokens).
func ProcessedSpecs(n, vocab int) []backend.SampleSpec {
	specs := attrib.GreedySpecs(n)
	k := min(MaskEdits, vocab)
	for i := range specs {
		r := rand.New(rand.NewPCG(uint64(i), 0x6d61736b))
		allow := make([]uint32, sample.AllowWords(vocab))
		for w := range allow {
			allow[w] = r.Uint32()
		}
		edits := make([]sample.Edit, k)
		for j := range edits { // k distinct ascending tokens
			edits[j] = sample.Edit{Token: int32(j * vocab / k), Penalty: 1.2, Add: -0.5}
		}
		specs[i].Allow, specs[i].Edits = allow, edits
	}
	return specs
}
