package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"syscall"
	"time"

	"github.com/glmflash/glmflash/core/attrib"
	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/roofline"
	"github.com/glmflash/glmflash/core/spec"
	"github.com/glmflash/glmflash/internal/cpulimits"
	"github.com/spf13/cobra"
)

// Bounds of bench's flags (beyond them nothing useful is measured).
const (
	maxBenchRuns  = 1000
	maxBenchBatch = 1024
)

// benchResult is one measurement series.
type benchResult struct {
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
	// MoE layer; its time at --bandwidth-gbs; the measured time per step
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
}

func newBenchCmd() *cobra.Command {
	var mf modelFlags
	var profileOps bool
	var prompt, decodeCtx, decodeSteps, reps, warmup int
	var batches []int
	var specAccept []float64
	var jsonOut, dump, cpuProfile, memProfile, limitsPath string
	var bandwidth, peakTFLOPs float64
	var gemmReportOn bool
	cmd := &cobra.Command{
		Use:   "bench (--model DIR | --preset NAME)",
		Args:  cobra.NoArgs,
		Short: "Measure prefill and decode throughput and peak memory",
		RunE: func(cmd *cobra.Command, args []string) error {
			if prompt < 1 || decodeCtx < 1 || decodeSteps < 1 || reps < 1 || warmup < 0 {
				return fmt.Errorf("--prompt, --decode-context, --decode-steps and --reps must be ≥ 1, --warmup ≥ 0")
			}
			if !(bandwidth >= 0) || !(peakTFLOPs > 0) {
				return fmt.Errorf("--bandwidth-gbs must be ≥ 0 (0: the device's default) and --peak-tflops > 0, got %v and %v", bandwidth, peakTFLOPs)
			}
			if reps+warmup > maxBenchRuns {
				return fmt.Errorf("--reps + --warmup must be at most %d, got %d", maxBenchRuns, reps+warmup)
			}
			ck, err := mf.open()
			if err != nil {
				return err
			}
			defer ck.Close()
			cfg := ck.Config()
			var memFile *os.File // created now so that a bad path fails before any run
			if memProfile != "" {
				f, err := os.Create(memProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				memFile = f
			}
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			if err := dumpGraph(dump, cfg, graph.Prefill, graph.LastLogits); err != nil {
				return err
			}
			maxB := 1
			for _, b := range batches {
				if b < 1 || b > maxBenchBatch {
					return fmt.Errorf("--batch values must be in [1, %d], got %d", maxBenchBatch, b)
				}
				maxB = max(maxB, b)
			}
			// every sequence must fit the model's positions
			if limit := cfg.MaxPositionEmbeddings; prompt > limit || decodeCtx+decodeSteps > limit {
				return fmt.Errorf("--prompt (%d) and --decode-context + --decode-steps (%d) must fit max_position_embeddings (%d)", prompt, decodeCtx+decodeSteps, limit)
			}
			ec, err := mf.config()
			if err != nil {
				return err
			}
			sp := ec.Speculative
			specSteps := sp.Steps()
			for _, r := range specAccept {
				if !(r >= 0 && r <= 1) {
					return fmt.Errorf("--spec-accept values must be in [0, 1], got %v", r)
				}
			}
			if specSteps == 0 && len(specAccept) > 0 {
				specSteps = 5 // the test drafter alone: 5-1-6
			}
			if sp.On() {
				if err := mtpRunnable(ck.Config(), ck); err != nil {
					return fmt.Errorf("--speculative %s: %w", sp, err)
				}
			}
			rollback := 0
			if specSteps > 0 {
				rollback = specSteps + 1
			}
			e, err := newEngineFrom(ec, ck, engine.Setup{Slots: maxB + 1, Rollback: rollback, ProfileOps: profileOps})
			if err != nil {
				return err
			}
			defer e.Close()
			if profileOps && e.Backend().Name() == "cpu" {
				return fmt.Errorf("--profile-ops: the cpu backend does not time its ops")
			}
			onCPU := e.Backend().Name() == "cpu"
			if limitsPath != "" && !onCPU {
				return fmt.Errorf("--limits: the CPU's limits apply to the cpu backend, not %s", e.Backend().Name())
			}
			if limitsPath != "" { // refused before anything is measured
				if _, err := cpulimits.Load(limitsPath); err != nil {
					return fmt.Errorf("--limits: %w", err)
				}
			}
			tuner, _ := e.Backend().(ir.GEMMTuner)
			if !cmd.Flags().Changed("gemm-report") {
				gemmReportOn = e.Backend().Name() == "cuda"
			}
			if gemmReportOn && tuner == nil {
				return fmt.Errorf("--gemm-report: the %s backend does not measure its GEMMs (it is no ir.GEMMTuner)", e.Backend().Name())
			}
			bandwidthFrom := "--bandwidth-gbs"
			if bandwidth == 0 && !onCPU {
				bandwidth, bandwidthFrom = defaultCUDABandwidthGBs, "the default"
				if e.Backend().Name() != "cuda" {
					bandwidth = defaultCPUBandwidthGBs
				}
			}
			var results []benchResult
			store := e.Store()
			// series runs warm-up + measured repetitions of one workload; run
			// returns the tokens processed and the seconds its timed part took.
			var counters []float64 // the last series' per-step counters, if any
			series := func(name string, run func() (int, float64, error)) error {
				var tps []float64
				counters = nil
				for r := 0; r < warmup+reps; r++ {
					n, secs, err := run()
					if err != nil {
						return err
					}
					log.Info().Str("bench", name).Int("run", r+1).Int("of", warmup+reps).Bool("warmup", r < warmup).
						Float64("tokens_per_s", float64(n)/secs).Msg("measured")
					if r >= warmup {
						tps = append(tps, float64(n)/secs)
					}
				}
				sorted := append([]float64(nil), tps...)
				sort.Float64s(sorted)
				r := benchResult{Name: name, TokensPerSec: sorted[len(sorted)/2], Runs: tps}
				if len(counters) == 7 {
					r.LaunchesPerStep, r.SyncsPerStep, r.LengthSyncs, r.ReplaysPerStep = counters[0], counters[1], counters[2], counters[3]
					r.KernelsPerStep, r.DeviceMsPerStep, r.PrepMsPerStep = counters[4], counters[5], counters[6]
				}
				results = append(results, r)
				return nil
			}
			alloc := func(n int) ([]int, error) {
				var slots []int
				for i := 0; i < n; i++ {
					s, err := store.Alloc()
					if err != nil {
						return nil, err
					}
					slots = append(slots, s)
				}
				return slots, nil
			}
			free := func(slots []int) {
				for _, s := range slots {
					store.Free(s)
				}
			}
			err = series(fmt.Sprintf("prefill %d tokens", prompt), func() (int, float64, error) {
				slots, err := alloc(1)
				if err != nil {
					return 0, 0, err
				}
				defer free(slots)
				t0 := time.Now()
				_, err = e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: slots[0], Tokens: attrib.BenchTokens(prompt, 1, cfg.VocabSize)}}})
				return prompt, time.Since(t0).Seconds(), err
			})
			if err != nil {
				return err
			}
			prefillIdx := len(results) - 1
			// the prefill program's GEMMs, measured by the backend's tuner
			var gemms *gemmReport
			if gemmReportOn {
				prog, err := e.Program(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits})
				if err != nil {
					return err
				}
				gemms = measureGEMMs(tuner, prefillGEMMs(prog.Plan(), tuner, ck.DType), prompt, peakTFLOPs)
			}
			// decode at each batch size, after a --decode-context-token
			// prefill per sequence (not timed); the roofline at the steps'
			// mean context
			held := roofline.Held(e.Backend().Info().Memory["weights_fp8"] > 0, false) // no configuration keeps fp32 GEMM weights
			decodeContext := decodeCtx + (decodeSteps+1)/2
			decodeIdx := map[int]int{} // result index → batch
			for _, B := range batches {
				err = series(fmt.Sprintf("decode batch %d", B), func() (int, float64, error) {
					slots, err := alloc(B)
					if err != nil {
						return 0, 0, err
					}
					defer free(slots)
					if err := attrib.PrefillSlotsN(e, slots, cfg.VocabSize, decodeCtx); err != nil {
						return 0, 0, err
					}
					prog, err := e.Program(attrib.DecodeKey)
					if err != nil {
						return 0, 0, err
					}
					specs := attrib.GreedySpecs(B)
					s0 := prog.Stats()
					t0 := time.Now()
					for st := 0; st < decodeSteps; st++ {
						if err := attrib.DecodeStep(e, slots, specs, st, cfg.VocabSize); err != nil {
							return 0, 0, err
						}
					}
					secs := time.Since(t0).Seconds()
					s1 := prog.Stats()
					n := float64(decodeSteps)
					counters = []float64{float64(s1.Launches-s0.Launches) / n, float64(s1.HostSyncs-s0.HostSyncs) / n, float64(s1.LengthSyncs-s0.LengthSyncs) / n,
						float64(s1.GraphReplays-s0.GraphReplays) / n, float64(s1.Kernels-s0.Kernels) / n, float64(s1.DeviceNs-s0.DeviceNs) / 1e6 / n,
						float64(s1.PrepNs-s0.PrepNs) / 1e6 / n}
					return B * decodeSteps, secs, nil
				})
				if err != nil {
					return err
				}
				decodeIdx[len(results)-1] = B
			}
			// MTP draft steps at each batch size, when the checkpoint has the
			// MTP layer: a 32-token trunk prefill (FinalHidden) and the MTP
			// prefill over it (not timed), then chained draft steps, each
			// reading the previous step's greedy token and MTP hidden row.
			mtpErr := e.MTPReady()
			for _, B := range batches {
				if mtpErr != nil {
					break
				}
				err = series(fmt.Sprintf("mtp draft batch %d", B), func() (int, float64, error) {
					return benchMTP(e, B, decodeSteps, alloc, free)
				})
				if err != nil {
					return err
				}
			}
			// speculative decoding through the scheduler: plain decoding, the
			// MTP drafter (--speculative mtp:N) and the test drafter at fixed
			// acceptance rates (--spec-accept), at each batch size; greedy
			// outputs must equal plain decoding's
			if specSteps > 0 {
				for _, B := range batches {
					prompts := make([][]int32, B)
					for i := range prompts {
						prompts[i] = attrib.BenchTokens(32, 100+i, cfg.VocabSize)
					}
					var plain *specRun
					if err := series(fmt.Sprintf("sched decode batch %d plain", B), func() (int, float64, error) {
						r, err := runSched(e, nil, prompts, decodeSteps)
						if err != nil {
							return 0, 0, err
						}
						plain = r
						return r.decode, r.secs, nil
					}); err != nil {
						return err
					}
					base := results[len(results)-1].TokensPerSec
					truth := map[string][]int32{}
					for i, p := range prompts {
						truth[fmt.Sprint(p)] = plain.tokens[i]
					}
					type arm struct {
						name     string
						make     func() (spec.Drafter, error)
						expected float64
					}
					var arms []arm
					if sp.On() {
						arms = append(arms, arm{name: sp.String(), make: func() (spec.Drafter, error) {
							return spec.NewMTP(e, spec.MTPOptions{Steps: specSteps, IndexShare: sp.Share(cfg.IndexShareForMTPIteration)})
						}})
					}
					for _, r := range specAccept {
						arms = append(arms, arm{name: fmt.Sprintf("test drafter %d-1-%d at %.2f", specSteps, specSteps+1, r), expected: expectedLength(r, specSteps), make: func() (spec.Drafter, error) {
							return spec.NewScripted("test", specSteps, spec.Oracle(func(p []int32) []int32 { return truth[fmt.Sprint(p)] }, spec.WrongRate(r, 1), cfg.VocabSize))
						}})
					}
					for _, a := range arms {
						var total spec.Stats
						var decode, passes int
						if err := series(fmt.Sprintf("sched decode batch %d %s", B, a.name), func() (int, float64, error) {
							d, err := a.make()
							if err != nil {
								return 0, 0, err
							}
							defer d.Close()
							r, err := runSched(e, d, prompts, decodeSteps)
							if err != nil {
								return 0, 0, err
							}
							for i := range prompts {
								if fmt.Sprint(r.tokens[i]) != fmt.Sprint(plain.tokens[i]) {
									return 0, 0, fmt.Errorf("%s: request %d's greedy tokens differ from plain decoding's", a.name, i)
								}
							}
							total, decode, passes = total.Add(r.st), decode+r.decode, passes+r.passes
							return r.decode, r.secs, nil
						}); err != nil {
							return err
						}
						res := &results[len(results)-1]
						res.spec = true
						res.AcceptanceLength, res.ExpectedLength = total.AcceptanceLength(), a.expected
						if total.Drafted > 0 {
							res.AcceptRate = float64(total.Accepted) / float64(total.Drafted)
						}
						if passes > 0 {
							res.TokensPerPass = float64(decode) / float64(B) / float64(passes)
						}
						if base > 0 {
							res.SpeedUp = res.TokensPerSec / base
						}
					}
				}
			}
			var ru syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
			peak := float64(ru.Maxrss) / 1024 // KiB → MiB on Linux
			// on the cpu backend, peak RSS against the checkpoint plus the
			// host caches (a device backend's weights and caches are not in
			// the RSS: no ratio)
			var ckBytes, cacheBytes int64
			if sb, ok := store.(interface{ Bytes() int64 }); ok && onCPU {
				ckBytes, cacheBytes = checkpointBytes(ck.Dir()), sb.Bytes()
			}
			mem := newMemReport(peak, ckBytes, cacheBytes)
			if memFile != nil { // the heap as the measured runs left it
				if err := writeHeapProfile(memFile); err != nil {
					return err
				}
			}
			// the CPU's limits, read or measured after the peak RSS is taken
			// (the probe's read buffer is not the model's memory)
			var lim benchLimits
			info := e.Backend().Info()
			if onCPU {
				lim = cpuLimits(limitsPath)
				if bandwidth == 0 {
					bandwidth, bandwidthFrom = defaultCPUBandwidthGBs, "the default (the limits have no read bandwidth)"
					if lim.Limits != nil && lim.Limits.ReadBandwidth != nil {
						bandwidth, bandwidthFrom = lim.Limits.ReadBandwidth.Median, "the limits' read bandwidth"
					}
				}
				prog, err := e.Program(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits})
				if err != nil {
					return err
				}
				pk, name, _ := lim.peakFor(info.Precision)
				prefillAgainstPeak(&results[prefillIdx], prefillFLOPs(prog.Plan(), prompt, 1), prompt, pk, name)
			}
			for i, B := range decodeIdx {
				if err := rooflineFor(&results[i], cfg, held, B, decodeContext, bandwidth); err != nil {
					return err
				}
			}
			fmt.Printf("model    %s (hidden %d, %d layers, vocab %d)\n", ck.Dir(), cfg.HiddenSize, cfg.NumHiddenLayers, cfg.VocabSize)
			switch {
			case mtpErr == nil:
				fmt.Printf("mtp      %d layer(s) from layer %d, weights present: draft steps measured\n", cfg.NumNextNPredictLayers, cfg.MTPLayer(0))
				if sp.On() {
					fmt.Printf("spec     %s (index share %v): drafts from the MTP layer, verified through the scheduler\n", sp, sp.Share(cfg.IndexShareForMTPIteration))
				}
			case cfg.HasMTP():
				fmt.Printf("mtp      %d layer(s) declared, not runnable: %v\n", cfg.NumNextNPredictLayers, mtpErr)
			default:
				fmt.Printf("mtp      none (num_nextn_predict_layers 0)\n")
			}
			fmt.Printf("machine  %d CPUs (GOMAXPROCS %d), %s\n", runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
			fmt.Printf("device   %s: %s (precision %s)\n", info.Backend, info.Device, info.Precision)
			if onCPU {
				fmt.Printf("limits   %s\n", lim.Source)
				if lim.Limits != nil {
					fmt.Printf("         %s\n", lim.Limits)
				}
				if lim.Error != "" {
					fmt.Printf("         not measured: %s\n", lim.Error)
				}
			}
			fmt.Printf("roofline bandwidth %.4g GB/s (%s)\n", bandwidth, bandwidthFrom)
			fmt.Printf("weights  %.1f MiB in the engine's host weight cache (float32 tensors and bf16 copies loaded through the plans)\n", float64(e.WeightBytes())/(1<<20))
			if len(info.Memory) > 0 {
				var keys []string
				for k := range info.Memory {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				where := "device memory"
				if info.Backend == "cpu" { // the CPU backend's bound weights by dtype (weights_bf16_mapped: the checkpoint's pages, read in place)
					where = "host memory  "
				}
				for _, k := range keys {
					fmt.Printf("%s %-20s %10.1f MiB\n", where, k, float64(info.Memory[k])/(1<<20))
				}
			}
			for _, r := range results {
				fmt.Printf("%-22s %10.1f tokens/s  (median of %d; runs %s)", r.Name, r.TokensPerSec, len(r.Runs), fmtRuns(r.Runs))
				if r.LaunchesPerStep > 0 || r.SyncsPerStep > 0 {
					fmt.Printf("  per step: %.0f launches (%.1f graph replays) running %.0f kernels, %.1f host syncs (%.1f length read-backs), %.3f ms device time, %.3f ms host preparation",
						r.LaunchesPerStep, r.ReplaysPerStep, r.KernelsPerStep, r.SyncsPerStep, r.LengthSyncs, r.DeviceMsPerStep, r.PrepMsPerStep)
				}
				if r.spec {
					fmt.Printf("  acceptance length %.2f", r.AcceptanceLength)
					if r.ExpectedLength > 0 {
						fmt.Printf(" (expected %.2f)", r.ExpectedLength)
					}
					fmt.Printf(", drafts accepted %.0f%%, %.2f tokens/trunk pass, %.2f× plain", 100*r.AcceptRate, r.TokensPerPass, r.SpeedUp)
				}
				fmt.Println()
				if r.RooflineBytes > 0 {
					fmt.Printf("  roofline: %.4g GB per step (context %d, %.2f experts per MoE layer) ÷ %.4g GB/s = %.4g ms; measured %.4g ms per step (%s time) = %.2f× the roofline = %.1f%% of the bandwidth roofline\n",
						r.RooflineBytes/1e9, r.RooflineContext, r.RooflineExperts, bandwidth, r.RooflineMs, r.MeasuredMs, r.MeasuredClock, r.RooflineRatio, 100*r.RooflineFraction)
					if r.MeasuredClock == "device" && r.WallMsPerStep > 0 {
						fmt.Printf("  wall clock: %.4g ms per step (host preparation and the sampled tokens' read-back included) = %.2f× the roofline\n", r.WallMsPerStep, r.WallMsPerStep/r.RooflineMs)
					}
				}
				if r.GEMMFLOPs > 0 {
					fmt.Printf("  compute: %.4g GFLOP of weight GEMMs per run (2 × multiply-adds of linear, linear_batched and moe_experts; attention not counted) at the median run = %.4g GFLOP/s",
						r.GEMMFLOPs/1e9, r.AchievedGFLOPs)
					if r.PeakGFLOPs > 0 {
						fmt.Printf(" = %.1f%% of the %s (%.1f GFLOP/s)\n", 100*r.PeakFraction, r.PeakName, r.PeakGFLOPs)
					} else {
						_, _, why := lim.peakFor(info.Precision)
						fmt.Printf("; %s\n", why)
					}
				}
			}
			if gemms != nil {
				gemms.print(os.Stdout)
			}
			fmt.Println(mem)
			if profileOps {
				for _, key := range []engine.Key{{Mode: graph.Prefill, Logits: graph.LastLogits}, {Mode: graph.Decode, Logits: graph.LastLogits}} {
					prog, err := e.Program(key)
					if err != nil {
						return err
					}
					op, ok := prog.(backend.OpProfiler)
					if !ok {
						return fmt.Errorf("--profile-ops: the %s backend does not time its ops", info.Backend)
					}
					fmt.Printf("device time per op, %s program, over every run above:\n", key)
					var total float64
					times := op.OpTimes()
					for _, t := range times {
						total += t.Ms
					}
					for _, t := range times {
						fmt.Printf("  %-18s %7d calls %10.2f ms  %5.1f%%\n", t.Op, t.Calls, t.Ms, 100*t.Ms/total)
					}
				}
			}
			if jsonOut != "" {
				mtp := map[string]any{"layers": cfg.NumNextNPredictLayers, "runnable": mtpErr == nil}
				if mtpErr != nil && cfg.HasMTP() {
					mtp["why_not"] = mtpErr.Error()
				}
				out := map[string]any{"model": ck.Dir(), "results": results, "peak_rss_mib": peak, "memory": mem, "cpus": runtime.NumCPU(), "device": info, "mtp": mtp, "bandwidth_gbs": bandwidth, "bandwidth_from": bandwidthFrom}
				if onCPU {
					out["limits"] = lim
				}
				if gemms != nil {
					out["gemm_report"] = gemms
				}
				b, _ := json.MarshalIndent(out, "", "  ")
				if err := os.WriteFile(jsonOut, b, 0o644); err != nil {
					return err
				}
			}
			return nil
		},
	}
	mf.addConfig(cmd)
	mf.addDevice(cmd)
	mf.addPrecision(cmd)
	mf.addSpeculative(cmd)
	cmd.Flags().Float64SliceVar(&specAccept, "spec-accept", nil, "also measure speculative decoding with the test drafter (the plain run's greedy tokens, each draft spoiled with probability 1−rate) at these per-draft acceptance rates, e.g. 0.6,0.8,1.0 (num_steps from --speculative, else 5)")
	cmd.Flags().BoolVar(&profileOps, "profile-ops", false, "time every op on the device (graphs off) and print the device time per op of the prefill and decode programs")
	mf.add(cmd, true)
	mf.addCheckTensors(cmd)
	cmd.Flags().IntVar(&prompt, "prompt", 512, "prefill prompt length")
	cmd.Flags().IntVar(&decodeCtx, "decode-context", 32, "tokens prefilled per sequence (untimed) before the decode series' steps: the context they attend (--prompt sizes the prefill series only)")
	cmd.Flags().IntVar(&decodeSteps, "decode-steps", 16, "decode steps per measured run")
	cmd.Flags().IntSliceVar(&batches, "batch", []int{1, 8}, "decode batch sizes")
	cmd.Flags().IntVar(&reps, "reps", 3, "measured repetitions")
	cmd.Flags().IntVar(&warmup, "warmup", 1, "warm-up repetitions (not counted)")
	cmd.Flags().StringVar(&jsonOut, "json", "", "also write the results as JSON to this file")
	cmd.Flags().StringVar(&limitsPath, "limits", "", "the CPU's limits (the JSON of go run ./tools/limits) that the cpu backend's prefill GFLOP/s (against the fp32 FMA or vdpbf16ps peak) and decode roofline (read bandwidth) are compared with (default: a quick measurement by bench itself, about a second, after the series)")
	cmd.Flags().StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile (go tool pprof) to this file")
	cmd.Flags().StringVar(&memProfile, "memprofile", "", "after the series, write a heap profile (go tool pprof; in-use bytes by allocation site) to this file")
	cmd.Flags().StringVar(&dump, "dump-graph", "", "print the prefill graph first: summary or text")
	cmd.Flags().Float64Var(&bandwidth, "bandwidth-gbs", 0, fmt.Sprintf("memory bandwidth (GB/s) of the decode roofline: bytes a step must read ÷ this (default: %d on cuda, the H200's device-to-device copy in docs/results/cuda-h200, 65.5 MB read and written in 33.84 µs; on cpu the limits' read bandwidth (--limits or the quick probe), else %d, the read bandwidth given for the development machine)", defaultCUDABandwidthGBs, defaultCPUBandwidthGBs))
	cmd.Flags().Float64Var(&peakTFLOPs, "peak-tflops", defaultPeakTFLOPs, "peak TFLOP/s the GEMM report compares with (the default is the H200's dense BF16 tensor-core peak)")
	cmd.Flags().BoolVar(&gemmReportOn, "gemm-report", false, "after the prefill series, time each GEMM weight shape of the prefill program at the prompt's rows with the backend's tuner and print TFLOP/s, default kernel and best candidate (default: on for cuda, off otherwise; backends that measure their GEMMs only)")
	return cmd
}

func fmtRuns(r []float64) string {
	s := "["
	for i, v := range r {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%.1f", v)
	}
	return s + "]"
}

// benchMTP times steps chained MTP draft steps for B sequences (after an
// untimed 32-token trunk prefill and MTP prefill per sequence) and returns
// the draft tokens made and the seconds they took.
func benchMTP(e *engine.Engine, B, steps int, alloc func(int) ([]int, error), free func([]int)) (int, float64, error) {
	mst, err := e.MTPStore()
	if err != nil {
		return 0, 0, err
	}
	slots, err := alloc(B)
	if err != nil {
		return 0, 0, err
	}
	defer free(slots)
	var mslots []int
	defer func() {
		for _, s := range mslots {
			mst.Free(s)
		}
	}()
	D := e.Config().HiddenSize
	greedy := attrib.GreedySpecs(B)
	tb, mb := &backend.Batch{Sample: greedy, SamplesOnly: true}, &backend.Batch{Sample: greedy, SamplesOnly: true}
	for i, s := range slots {
		tb.Seqs = append(tb.Seqs, backend.Seq{Slot: s, Tokens: attrib.BenchTokens(32, i+2, e.Config().VocabSize)})
	}
	tr, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits, FinalHidden: true}, tb)
	if err != nil {
		return 0, 0, err
	}
	fh := tr.Hidden[ir.OutputFinalHidden]
	for i := range slots {
		ms, err := mst.Alloc()
		if err != nil {
			return 0, 0, err
		}
		mslots = append(mslots, ms)
		t := tb.Seqs[i].Tokens
		mb.Seqs = append(mb.Seqs, backend.Seq{Slot: ms, Tokens: append(append([]int32(nil), t[1:]...), tr.Samples[i].Token), Hidden: fh[i*32*D : (i+1)*32*D]})
	}
	out, err := e.Run(engine.Key{Mode: graph.Prefill, Logits: graph.LastLogits, MTP: true}, mb)
	if err != nil {
		return 0, 0, err
	}
	last := func(out *backend.Result, n int) (tok []int32, h [][]float32) {
		rows := out.Hidden[ir.OutputFinalHidden]
		for i := range slots {
			tok = append(tok, out.Samples[i].Token)
			h = append(h, rows[((i+1)*n-1)*D:(i+1)*n*D])
		}
		return tok, h
	}
	tok, h := last(out, 32)
	key := engine.Key{Mode: graph.Decode, Logits: graph.LastLogits, MTP: true}
	t0 := time.Now()
	for st := 0; st < steps; st++ {
		db := &backend.Batch{Sample: greedy, SamplesOnly: true}
		for i, s := range mslots {
			db.Seqs = append(db.Seqs, backend.Seq{Slot: s, Tokens: tok[i : i+1], Hidden: h[i]})
		}
		if out, err = e.Run(key, db); err != nil {
			return 0, 0, err
		}
		tok, h = last(out, 1)
	}
	return B * steps, time.Since(t0).Seconds(), nil
}
