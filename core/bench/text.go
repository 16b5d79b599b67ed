package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
)

// errWriter keeps the first write error.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return len(p), nil
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

// WriteText writes the report `glmflash bench` prints: the model, MTP and
// speculative drafter, machine, device, limits and bandwidth; the host
// weights and memory by category; a line per series with its counters,
// acceptance, roofline and compute rate; the GEMM report; peak RSS; the
// device time per op.
func (r *Result) WriteText(out io.Writer) error {
	w := &errWriter{w: out}
	cfg, info, sp := r.Config, r.Device, r.Speculative
	fmt.Fprintf(w, "model    %s (hidden %d, %d layers, vocab %d)\n", r.Model, cfg.HiddenSize, cfg.NumHiddenLayers, cfg.VocabSize)
	switch {
	case r.MTPErr == nil:
		fmt.Fprintf(w, "mtp      %d layer(s) from layer %d, weights present: draft steps measured\n", cfg.NumNextNPredictLayers, cfg.MTPLayer(0))
	case cfg.HasMTP():
		fmt.Fprintf(w, "mtp      %d layer(s) declared, not runnable: %v\n", cfg.NumNextNPredictLayers, r.MTPErr)
	default:
		fmt.Fprintf(w, "mtp      none (num_nextn_predict_layers 0)\n")
	}
	switch {
	case sp.Method == "mtp":
		fmt.Fprintf(w, "spec     %s (index share %v): drafts from the MTP layer, verified through the scheduler\n", sp, sp.Share(cfg.IndexShareForMTPIteration))
	case sp.On():
		fmt.Fprintf(w, "spec     %s: verified through the scheduler\n", sp)
	}
	if sp.SimulateAcceptance > 0 {
		fmt.Fprintf(w, "simulate speculative.simulate_acceptance %g: the %s series accepts drafts by a seeded chain at that rate, whatever the model says: its outputs are not the model's\n", sp.SimulateAcceptance, sp)
	}
	switch r.PinnedDrafter {
	case DrafterConfigured:
		fmt.Fprintf(w, "pinned   the configured drafter runs (its programs and time are real) and its drafts are replaced by the plain run's greedy tokens, each spoiled with probability 1−rate; greedy outputs are checked against plain decoding\n")
	case DrafterSimulated:
		fmt.Fprintf(w, "pinned   the configured drafter runs (its programs and time are real) and the scheduler simulates acceptance at the rate (speculative.simulate_acceptance, as SGLang's SGLANG_SIMULATE_ACC_LEN): outputs are not the model's and are not checked (below fp32 a verify's argmax can differ from a decode step's at near-ties, so the plain run's tokens cannot pin it)\n")
	case DrafterScripted:
		fmt.Fprintf(w, "pinned   the test drafter alone (no drafter work): the plain run's greedy tokens, each spoiled with probability 1−rate\n")
	}
	fmt.Fprintf(w, "machine  %d CPUs (GOMAXPROCS %d), %s\n", r.CPUs, r.GOMAXPROCS, r.GoVersion)
	fmt.Fprintf(w, "device   %s: %s (precision %s)\n", info.Backend, info.Device, info.Precision)
	if lim := r.Limits; lim != nil {
		fmt.Fprintf(w, "limits   %s\n", lim.Source)
		if lim.Limits != nil {
			fmt.Fprintf(w, "         %s\n", lim.Limits)
		}
		if lim.Error != "" {
			fmt.Fprintf(w, "         not measured: %s\n", lim.Error)
		}
	}
	fmt.Fprintf(w, "roofline bandwidth %.4g GB/s (%s)\n", r.Bandwidth, r.BandwidthFrom)
	fmt.Fprintf(w, "weights  %.1f MiB in the engine's host weight cache (float32 tensors and bf16 copies loaded through the plans)\n", float64(r.WeightBytes)/(1<<20))
	if len(info.Memory) > 0 {
		where := "device memory"
		if info.Backend == "cpu" { // the CPU backend's bound weights by dtype (weights_bf16_mapped: the checkpoint's pages, read in place)
			where = "host memory  "
		}
		for _, k := range slices.Sorted(maps.Keys(info.Memory)) {
			fmt.Fprintf(w, "%s %-20s %10.1f MiB\n", where, k, float64(info.Memory[k])/(1<<20))
		}
	}
	for _, s := range r.Series {
		r.writeSeries(w, &s)
	}
	if r.GEMM != nil {
		r.GEMM.write(w)
	}
	fmt.Fprintln(w, r.Memory)
	for _, p := range r.OpTimes {
		fmt.Fprintf(w, "device time per op, %s program, over every run above:\n", p.Program)
		var total float64
		for _, t := range p.Ops {
			total += t.Ms
		}
		for _, t := range p.Ops {
			fmt.Fprintf(w, "  %-18s %7d calls %10.2f ms  %5.1f%%\n", t.Op, t.Calls, t.Ms, 100*t.Ms/total)
		}
	}
	return w.err
}

// writeSeries writes a series' line and its roofline and compute lines.
func (r *Result) writeSeries(w io.Writer, s *Series) {
	fmt.Fprintf(w, "%-22s %10.1f tokens/s  (median of %d; runs %s)", s.Name, s.TokensPerSec, len(s.Runs), fmtRuns(s.Runs))
	if s.LaunchesPerStep > 0 || s.SyncsPerStep > 0 {
		fmt.Fprintf(w, "  per step: %.0f launches (%.1f graph replays) running %.0f kernels, %.1f host syncs (%.1f length read-backs), %.3f ms device time, %.3f ms host preparation",
			s.LaunchesPerStep, s.ReplaysPerStep, s.KernelsPerStep, s.SyncsPerStep, s.LengthSyncs, s.DeviceMsPerStep, s.PrepMsPerStep)
	}
	for i, k := range s.Kinds {
		if i == 0 {
			fmt.Fprintf(w, "  by step kind:")
		} else {
			fmt.Fprintf(w, ";")
		}
		fmt.Fprintf(w, " %s %d steps, %.1f launches (%.1f graph replays), %.0f kernels, %.0f tokens", k.Kind, k.Steps, k.LaunchesPerStep, k.ReplaysPerStep, k.KernelsPerStep, k.TokensPerStep)
		if k.PadPerStep > 0 {
			fmt.Fprintf(w, " + %.0f padding", k.PadPerStep)
		}
	}
	if s.AllReducesPerStep > 0 {
		fmt.Fprintf(w, "  per step: %.0f all-reduces, %.0f all-gathers, %.0f bytes, %.3f ms in collectives (rank 0)",
			s.AllReducesPerStep, s.AllGathersPerStep, s.CollectiveBytesPerStep, s.CollectiveMsPerStep)
	}
	if s.spec {
		fmt.Fprintf(w, "  acceptance length %.2f", s.AcceptanceLength)
		if s.ExpectedLength > 0 {
			fmt.Fprintf(w, " (expected %.2f)", s.ExpectedLength)
		}
		fmt.Fprintf(w, ", drafts accepted %.0f%%", 100*s.AcceptRate)
		if s.VerifySpans > 0 {
			fmt.Fprintf(w, " (per draft %.3f", s.ChainRate)
			if s.PinnedRate != nil {
				fmt.Fprintf(w, ", pinned at %.4g", *s.PinnedRate)
			}
			fmt.Fprintf(w, ", %d spans)", s.VerifySpans)
		}
		fmt.Fprintf(w, ", %.2f tokens/trunk pass, %.2f× plain", s.TokensPerPass, s.SpeedUp)
		if s.VerifySteps > 0 {
			fmt.Fprintf(w, "; drafter %s: %.3f ms host wall per verify step (propose %.3f, observe %.3f), %.2f program runs", s.Drafter, s.DrafterMsPerStep, s.DrafterProposeMs, s.DrafterObserveMs, s.DrafterRunsPerStep)
			if s.DrafterDeviceMsPerStep > 0 {
				fmt.Fprintf(w, ", %.3f ms device time", s.DrafterDeviceMsPerStep)
			}
			fmt.Fprintf(w, " (%d steps)", s.VerifySteps)
		}
		if s.SimulatedAcceptance > 0 {
			fmt.Fprintf(w, "; SIMULATED acceptance %g per draft: outputs are not the model's (not checked against plain decoding)", s.SimulatedAcceptance)
		}
		if g := s.GreedyAgreement; g != nil {
			fmt.Fprintf(w, "; below fp32 not checked: %.1f%% of its greedy tokens agree with plain decoding's (up to each request's first difference)", 100**g)
		}
	}
	fmt.Fprintln(w)
	if s.RooflineBytes > 0 {
		fmt.Fprintf(w, "  roofline: %.4g GB per step (context %d, %.2f experts per MoE layer) ÷ %.4g GB/s = %.4g ms; measured %.4g ms per step (%s time) = %.2f× the roofline = %.1f%% of the bandwidth roofline\n",
			s.RooflineBytes/1e9, s.RooflineContext, s.RooflineExperts, r.Bandwidth, s.RooflineMs, s.MeasuredMs, s.MeasuredClock, s.RooflineRatio, 100*s.RooflineFraction)
		if s.MeasuredClock == "device" && s.WallMsPerStep > 0 {
			fmt.Fprintf(w, "  wall clock: %.4g ms per step (host preparation and the sampled tokens' read-back included) = %.2f× the roofline\n", s.WallMsPerStep, s.WallMsPerStep/s.RooflineMs)
		}
	}
	if s.Processing != "" {
		fmt.Fprintf(w, "  logits processing (%s): %+.1f%% of the plain step's %s time", s.Processing, 100*s.ProcessingCost, s.MeasuredClock)
		if s.MeasuredClock != "wall" {
			fmt.Fprintf(w, ", %+.1f%% of its wall time", 100*s.ProcessingWallCost)
		}
		fmt.Fprintf(w, ", %+.1f%% of its CPU time (%.4g against %.4g ms of the process's user + system time per step)\n", 100*s.ProcessingCPUCost, s.CPUMsPerStep, s.CPUMsPerStep/(1+s.ProcessingCPUCost))
	}
	if s.GEMMFLOPs > 0 {
		fmt.Fprintf(w, "  compute: %.4g GFLOP of weight GEMMs per run (2 × multiply-adds of linear, linear_batched and moe_experts; attention not counted) at the median run = %.4g GFLOP/s",
			s.GEMMFLOPs/1e9, s.AchievedGFLOPs)
		if s.PeakGFLOPs > 0 {
			fmt.Fprintf(w, " = %.1f%% of the %s (%.1f GFLOP/s)\n", 100*s.PeakFraction, s.PeakName, s.PeakGFLOPs)
		} else {
			var lim Limits
			if r.Limits != nil {
				lim = *r.Limits
			}
			_, _, why := lim.peakFor(string(r.Device.Precision))
			fmt.Fprintf(w, "; %s\n", why)
		}
	}
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

// JSON is the report `glmflash bench --json` writes: the model, the
// speculative setting (the pinned drafter, a simulated acceptance), every
// series, peak RSS and memory, CPUs, the device, the MTP layer, the
// roofline's bandwidth, the CPU's limits (cpu backend) and the GEMM report
// (when measured).
func (r *Result) JSON() ([]byte, error) {
	mtp := map[string]any{"layers": r.Config.NumNextNPredictLayers, "runnable": r.MTPErr == nil}
	if r.MTPErr != nil && r.Config.HasMTP() {
		mtp["why_not"] = r.MTPErr.Error()
	}
	spec := map[string]any{"speculative": r.Speculative.String()}
	if r.PinnedDrafter != "" {
		spec["pinned_drafter"] = r.PinnedDrafter
	}
	if r.Speculative.SimulateAcceptance > 0 {
		spec["simulated_acceptance"] = r.Speculative.SimulateAcceptance
	}
	out := map[string]any{"speculative": spec, "model": r.Model, "results": r.Series, "peak_rss_mib": r.PeakRSSMiB, "memory": r.Memory, "cpus": r.CPUs, "device": r.Device, "mtp": mtp,
		"bandwidth_gbs": r.Bandwidth, "bandwidth_from": r.BandwidthFrom}
	if r.Limits != nil {
		out["limits"] = *r.Limits
	}
	if r.DummyWeights {
		out["dummy_weights"] = true
	}
	if r.GEMM != nil {
		out["gemm_report"] = r.GEMM
	}
	return json.MarshalIndent(out, "", "  ")
}
