package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"

	"github.com/glmflash/glmflash/core/bench"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/internal/cpulimits"
	"github.com/glmflash/glmflash/model"
	"github.com/spf13/cobra"
)

// Bounds of bench's flags (beyond them nothing useful is measured).
const (
	maxBenchRuns  = bench.MaxRuns
	maxBenchBatch = bench.MaxBatch
)

// benchFlags are bench's flags beyond the model's.
type benchFlags struct {
	mf                                           modelFlags
	profileOps, gemmReport, sampleMask           bool
	prompt, decodeCtx, decodeSteps, reps, warmup int
	mixedChunk                                   int
	batches                                      []int
	specAccept, specAcceptLen                    []float64
	specDrafter                                  string
	jsonOut, dump, cpuProfile, memProfile        string
	limitsPath                                   string
	bandwidth, peakTFLOPs                        float64
}

func newBenchCmd() *cobra.Command {
	f := &benchFlags{}
	cmd := &cobra.Command{
		Use:   "bench (--model DIR | --preset NAME)",
		Args:  cobra.NoArgs,
		Short: "Measure prefill and decode throughput and peak memory",
		RunE:  func(cmd *cobra.Command, args []string) error { return f.run(cmd) },
	}
	mf := &f.mf
	mf.addConfig(cmd)
	mf.addDevice(cmd)
	mf.addPrecision(cmd)
	mf.addTP(cmd)
	mf.addSpeculative(cmd)
	cmd.Flags().Float64SliceVar(&f.specAccept, "spec-accept", nil, "also measure speculative decoding pinned at these per-draft acceptance rates, e.g. 0.6,0.8,1.0: the --spec-drafter drafter's drafts are replaced by the plain run's greedy tokens, each spoiled with probability 1−rate (num_steps from --speculative, else 5)")
	cmd.Flags().Float64SliceVar(&f.specAcceptLen, "spec-accept-len", nil, "as --spec-accept, asked as acceptance lengths (mean tokens per verify step, accepted drafts + 1, in [1, num_steps+1]), e.g. 3,4,6: the per-draft rate r solves 1 + r + r² + … + r^num_steps = length")
	cmd.Flags().StringVar(&f.specDrafter, "spec-drafter", "", "the drafter the pinned series run: configured (the --speculative drafter runs for real and its drafts are replaced by the plain run's greedy tokens, spoiled at the rate: its time and device work are measured, greedy outputs checked; the default with --speculative at fp32), simulated (the --speculative drafter runs for real and the scheduler simulates acceptance at the rate, as speculative.simulate_acceptance: outputs not the model's, not checked; the default with --speculative below fp32, where a verify's argmax can differ from a decode step's) or scripted (the test drafter alone, no drafter work; the default without --speculative)")
	cmd.Flags().BoolVar(&f.profileOps, "profile-ops", false, "time every op on the device (graphs off) and print the device time per op of the prefill and decode programs")
	mf.add(cmd, true)
	mf.addCheckTensors(cmd)
	cmd.Flags().BoolVar(&f.sampleMask, "sample-mask", false, fmt.Sprintf("measure each decode series a second time with every row's logits processed on the backend (an allow mask of about half the vocabulary, as a constraint's, and %d edits, as penalties over a context) and report the cost over the plain series", bench.MaskEdits))
	cmd.Flags().IntVar(&f.prompt, "prompt", 512, "prefill prompt length")
	cmd.Flags().IntVar(&f.decodeCtx, "decode-context", 32, "tokens prefilled per sequence (untimed) before the decode series' steps: the context they attend (--prompt sizes the prefill series only)")
	cmd.Flags().IntVar(&f.decodeSteps, "decode-steps", 16, "decode steps per measured run")
	cmd.Flags().IntSliceVar(&f.batches, "batch", []int{1, 8}, "decode batch sizes")
	cmd.Flags().IntVar(&f.mixedChunk, "mixed-chunk", 0, "also measure mixed steps at each batch size: the batch's decode tokens beside the next chunk of this many tokens of one more sequence's prompt (a long prompt arriving while others decode), launches reported by step kind (0: not measured)")
	cmd.Flags().IntVar(&f.reps, "reps", 3, "measured repetitions")
	cmd.Flags().IntVar(&f.warmup, "warmup", 1, "warm-up repetitions (not counted)")
	cmd.Flags().StringVar(&f.jsonOut, "json", "", "also write the results as JSON to this file")
	cmd.Flags().StringVar(&f.limitsPath, "limits", "", "the CPU's limits (the JSON of go run ./tools/limits) that the cpu backend's prefill GFLOP/s (against the fp32 FMA or vdpbf16ps peak) and decode roofline (read bandwidth) are compared with (default: a quick measurement by bench itself, about a second, after the series)")
	cmd.Flags().StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile (go tool pprof) to this file")
	cmd.Flags().StringVar(&f.memProfile, "memprofile", "", "after the series, write a heap profile (go tool pprof; in-use bytes by allocation site) to this file")
	cmd.Flags().StringVar(&f.dump, "dump-graph", "", "print the prefill graph first: summary or text")
	cmd.Flags().Float64Var(&f.bandwidth, "bandwidth-gbs", 0, fmt.Sprintf("memory bandwidth (GB/s) of the decode roofline: bytes a step must read ÷ this (default: %d on cuda, the H200's device-to-device copy in docs/results/cuda-h200, 65.5 MB read and written in 33.84 µs; on cpu the limits' read bandwidth (--limits or the quick probe), else %d, the read bandwidth given for the development machine)", bench.DefaultCUDABandwidthGBs, bench.DefaultCPUBandwidthGBs))
	cmd.Flags().Float64Var(&f.peakTFLOPs, "peak-tflops", bench.DefaultPeakTFLOPs, "peak TFLOP/s the GEMM report compares with (the default is the H200's dense BF16 tensor-core peak)")
	cmd.Flags().BoolVar(&f.gemmReport, "gemm-report", false, "after the prefill series, time each GEMM weight shape of the prefill program at the prompt's rows with the backend's tuner and print TFLOP/s, default kernel and best candidate (default: on for cuda, off otherwise; backends that measure their GEMMs only)")
	return cmd
}

// check refuses flags out of range, before anything is opened.
func (f *benchFlags) check() error {
	if f.mixedChunk < 0 {
		return fmt.Errorf("--mixed-chunk must be ≥ 0 (0: no mixed series), got %d", f.mixedChunk)
	}
	if f.prompt < 1 || f.decodeCtx < 1 || f.decodeSteps < 1 || f.reps < 1 || f.warmup < 0 {
		return fmt.Errorf("--prompt, --decode-context, --decode-steps and --reps must be ≥ 1, --warmup ≥ 0")
	}
	if !(f.bandwidth >= 0) || !(f.peakTFLOPs > 0) {
		return fmt.Errorf("--bandwidth-gbs must be ≥ 0 (0: the device's default) and --peak-tflops > 0, got %v and %v", f.bandwidth, f.peakTFLOPs)
	}
	if f.reps+f.warmup > maxBenchRuns {
		return fmt.Errorf("--reps + --warmup must be at most %d, got %d", maxBenchRuns, f.reps+f.warmup)
	}
	return nil
}

// benchPositions is the context the bench's stores hold per slot (a
// device store's page pool holds every slot at it): what its series reach
// (the prompt; the decode context and every step's tokens, a verify step's
// up to rollback), at least 8192 positions, at most the model's limit.
func benchPositions(limit, prompt, decodeCtx, decodeSteps, rollback int) int {
	need := max(prompt, decodeCtx+decodeSteps*max(rollback, 1)) + rollback + 1
	return min(limit, max(need, 8192))
}

// checkModel refuses flags the model cannot take: batch sizes, lengths
// beyond its positions, acceptance rates, an MTP drafter it cannot run.
func (f *benchFlags) checkModel(ck *model.Checkpoint, s bench.Spec) error {
	for _, b := range f.batches {
		if b < 1 || b > maxBenchBatch {
			return fmt.Errorf("--batch values must be in [1, %d], got %d", maxBenchBatch, b)
		}
	}
	// every sequence must fit the model's positions
	if limit := ck.Config().MaxPositionEmbeddings; f.mixedChunk*f.decodeSteps > limit {
		return fmt.Errorf("--mixed-chunk × --decode-steps (%d) must fit max_position_embeddings (%d)", f.mixedChunk*f.decodeSteps, limit)
	}
	if limit := ck.Config().MaxPositionEmbeddings; f.prompt > limit || f.decodeCtx+f.decodeSteps > limit {
		return fmt.Errorf("--prompt (%d) and --decode-context + --decode-steps (%d) must fit max_position_embeddings (%d)", f.prompt, f.decodeCtx+f.decodeSteps, limit)
	}
	for _, r := range f.specAccept {
		if !(r >= 0 && r <= 1) {
			return fmt.Errorf("--spec-accept values must be in [0, 1], got %v", r)
		}
	}
	for _, l := range f.specAcceptLen {
		if k := s.SpecSteps(); !(l >= 1 && l <= float64(k+1)) {
			return fmt.Errorf("--spec-accept-len values must be in [1, %d] (num_steps + 1 at %d drafts per verify step), got %v", k+1, k, l)
		}
	}
	switch f.specDrafter {
	case "", bench.DrafterScripted:
	case bench.DrafterConfigured, bench.DrafterSimulated:
		if !s.Speculative.On() {
			return fmt.Errorf("--spec-drafter %s needs a drafter: give --speculative", f.specDrafter)
		}
	default:
		return fmt.Errorf("--spec-drafter must be %s, %s or %s, got %q", bench.DrafterConfigured, bench.DrafterSimulated, bench.DrafterScripted, f.specDrafter)
	}
	if sp := s.Speculative; sp.Method == "mtp" {
		if err := mtpRunnable(ck.Config(), ck); err != nil {
			return fmt.Errorf("--speculative %s: %w", sp, err)
		}
	}
	return nil
}

// checkEngine refuses flags the engine's backend cannot honour and settles
// the defaults that depend on it (the GEMM report on cuda).
func (f *benchFlags) checkEngine(cmd *cobra.Command, e *engine.Engine, s *bench.Spec) error {
	name := e.Backend().Name()
	if f.profileOps && name == "cpu" {
		return fmt.Errorf("--profile-ops: the cpu backend does not time its ops")
	}
	if f.limitsPath != "" && name != "cpu" {
		return fmt.Errorf("--limits: the CPU's limits apply to the cpu backend, not %s", name)
	}
	if f.limitsPath != "" { // refused before anything is measured
		if _, err := cpulimits.Load(f.limitsPath); err != nil {
			return fmt.Errorf("--limits: %w", err)
		}
	}
	s.GEMMReport = f.gemmReport
	if !cmd.Flags().Changed("gemm-report") {
		s.GEMMReport = name == "cuda"
	}
	if _, ok := e.Backend().(ir.GEMMTuner); s.GEMMReport && !ok {
		return fmt.Errorf("--gemm-report: the %s backend does not measure its GEMMs (it is no ir.GEMMTuner)", name)
	}
	return nil
}

// run is bench: flags → bench.Spec → bench.Run → the report (and JSON).
func (f *benchFlags) run(cmd *cobra.Command) error {
	if err := f.check(); err != nil {
		return err
	}
	ck, err := f.mf.open()
	if err != nil {
		return err
	}
	defer ck.Close()
	var memFile *os.File // created now so that a bad path fails before any run
	if f.memProfile != "" {
		mf, err := os.Create(f.memProfile)
		if err != nil {
			return err
		}
		defer mf.Close()
		memFile = mf
	}
	if f.cpuProfile != "" {
		cf, err := os.Create(f.cpuProfile)
		if err != nil {
			return err
		}
		defer cf.Close()
		if err := pprof.StartCPUProfile(cf); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if err := dumpGraph(f.dump, ck.Config(), graph.Prefill, graph.LastLogits); err != nil {
		return err
	}
	ec, err := f.mf.config()
	if err != nil {
		return err
	}
	s := bench.Spec{Prompt: f.prompt, DecodeContext: f.decodeCtx, DecodeSteps: f.decodeSteps, Batches: f.batches, Reps: f.reps, Warmup: f.warmup,
		Speculative: ec.Speculative, SpecAccept: f.specAccept, SpecAcceptLen: f.specAcceptLen, SpecDrafter: f.specDrafter, PeakTFLOPs: f.peakTFLOPs, Bandwidth: f.bandwidth, BandwidthFrom: "--bandwidth-gbs",
		LimitsPath: f.limitsPath, ProfileOps: f.profileOps, SampleMask: f.sampleMask, MixedChunk: f.mixedChunk,
		Measured: func(series string, run, of int, warmup bool, tps float64) {
			log.Info().Str("bench", series).Int("run", run).Int("of", of).Bool("warmup", warmup).Float64("tokens_per_s", tps).Msg("measured")
		}}
	if memFile != nil { // the heap as the measured runs left it
		s.AfterSeries = func() error { return writeHeapProfile(memFile) }
	}
	setup := engine.Setup{ProfileOps: f.profileOps}
	if sp := ec.Speculative; sp.DFlash() { // its block gives the drafts per span
		dk, err := openDFlash(sp, ck.Config(), ec.Model.WeightsFor(ec.Device))
		if err != nil {
			return fmt.Errorf("--speculative %s: %w", sp, err)
		}
		defer dk.Close()
		setup.DFlash, s.DFlashBlock = dk, dk.DFlashConfig().BlockSize
	}
	if err := f.checkModel(ck, s); err != nil {
		return err
	}
	setup.Slots, setup.Rollback = s.Slots(), s.Rollback()
	setup.MaxPositions = benchPositions(ck.Config().MaxPositionEmbeddings, f.prompt, f.decodeCtx, f.decodeSteps, s.Rollback())
	e, err := newEngineFrom(ec, ck, setup)
	if err != nil {
		return err
	}
	defer e.Close()
	if err := f.checkEngine(cmd, e, &s); err != nil {
		return err
	}
	res, err := bench.Run(e, ck, s)
	if err != nil {
		return err
	}
	if err := res.WriteText(os.Stdout); err != nil {
		return err
	}
	if f.jsonOut == "" {
		return nil
	}
	b, _ := res.JSON()
	return os.WriteFile(f.jsonOut, b, 0o644)
}

// mtpRunnable says why the MTP drafter cannot run on a checkpoint.
func mtpRunnable(cfg *model.Config, ck *model.Checkpoint) error {
	if !cfg.HasMTP() {
		return fmt.Errorf("the checkpoint has no MTP layer (num_nextn_predict_layers is %d)", cfg.NumNextNPredictLayers)
	}
	return ck.ValidateMTP()
}

// writeHeapProfile writes the heap profile (after a collection, so in-use
// figures are current) to f and closes it.
func writeHeapProfile(f *os.File) error {
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
