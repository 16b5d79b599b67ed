package attrib

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// Provenance identifies where and on what a study ran.
type Provenance struct {
	Commit    string `json:"commit"`
	CPU       string `json:"cpu"`
	CPUs      int    `json:"cpus"`
	Date      string `json:"date"`
	GoVersion string `json:"go_version"`
	Model     string `json:"model"`
	// Device is the backend and its device ("cuda: NVIDIA H200 (…)").
	Device string `json:"device,omitempty"`
}

// Row is one measurement: an arm on a cell in one round (a JSONL line).
type Row struct {
	Study            string  `json:"study"`
	Level            string  `json:"level"`
	Arm              string  `json:"arm"`
	ArmKind          string  `json:"arm_kind"`
	Subject          string  `json:"subject,omitempty"`
	Workload         string  `json:"workload"`
	InputLen         int     `json:"input_len"`
	OutputLen        int     `json:"output_len"`
	Requests         int     `json:"requests"`
	Concurrency      int     `json:"concurrency"`
	Round            int     `json:"round"`
	OutputTokens     int     `json:"output_tokens"`
	WallS            float64 `json:"wall_s"`
	TokensPerS       float64 `json:"output_tokens_per_s"`
	TTFTP50Ms        float64 `json:"ttft_p50_ms"`
	TTFTP90Ms        float64 `json:"ttft_p90_ms"`
	ITLP50Ms         float64 `json:"itl_p50_ms"`
	ITLP90Ms         float64 `json:"itl_p90_ms"`
	E2EP50Ms         float64 `json:"e2e_p50_ms"`
	E2EP90Ms         float64 `json:"e2e_p90_ms"`
	Errors           int     `json:"errors"`
	ParityMismatches int     `json:"parity_mismatches"`
	// Device backends: the device time of the cell's steps (CUDA events),
	// the output throughput by that time, and per-step counters.
	DeviceS          float64  `json:"device_s,omitempty"`
	DeviceTokensPerS float64  `json:"device_output_tokens_per_s,omitempty"`
	PerStep          *PerStep `json:"per_step,omitempty"`
	ConfigHash       string   `json:"config_hash"`
	PassesRequested  []string `json:"passes_requested"`
	PassesFired      []string `json:"passes_fired"`
	Provenance
}

// PerStep are a cell's device counters divided by its steps.
type PerStep struct {
	Steps       int64   `json:"steps"`
	DeviceMs    float64 `json:"device_ms"`
	Launches    float64 `json:"launches"`
	Kernels     float64 `json:"kernels"`
	HostSyncs   float64 `json:"host_syncs"`
	LengthSyncs float64 `json:"length_syncs"`
}

// Options run a study.
type Options struct {
	Runner     Runner
	Vocab      int
	Provenance Provenance
	// Progress is told after every measurement (done of total).
	Progress func(done, total int, label string)
}

// Result is a finished study.
type Result struct {
	Study *Study
	Arms  []Arm
	Cells []Cell
	Rows  []Row
	Info  map[string]ArmInfo
	// Stop says what ended the measured rounds: StopFixed, StopTarget,
	// StopMaxRounds or StopTime.
	Stop string
	// CellRounds and CellStop say, per cell, how many rounds were measured
	// and why the cell got no more.
	CellRounds map[string]int
	CellStop   map[string]string
	// Elapsed is the measurement's wall time (warm-up included).
	Elapsed time.Duration
}

// Why a study stopped adding rounds.
const (
	StopFixed     = "fixed rounds"
	StopTarget    = "target half-width reached"
	StopMaxRounds = "round limit"
	StopTime      = "time limit"
)

func percentile(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	idx := int(math.Ceil(p*float64(len(s)))) - 1
	idx = max(0, min(idx, len(s)-1))
	return float64(s[idx].Microseconds()) / 1000
}

// Failed reports the cell's failed requests: how many, and the first
// error. A study measures nothing from an arm whose requests fail.
func (cr *CellResult) Failed() error {
	n, first := 0, ""
	for i, rr := range cr.Requests {
		if rr.Err != "" {
			if n == 0 {
				first = fmt.Sprintf("request %d: %s", i, rr.Err)
			}
			n++
		}
	}
	if n == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d requests failed (%s)", n, len(cr.Requests), first)
}

// Run executes every arm on every cell in paired, interleaved rounds: each
// round visits the cells in order and, per cell, every arm back to back
// (alternating the arm order between rounds), so slow drift of a noisy
// machine affects all arms alike. Warm-up rounds are run and discarded.
//
// With s.Adaptive, rounds are added until every interval of a cell (each
// arm against the baseline, each leave-one-out contribution) has a
// half-width within the target: such a cell gets no more rounds, and the
// study stops when no cell is left (StopTarget), at max_rounds
// (StopMaxRounds), or when the next round would end past max_seconds
// (StopTime).
//
// A request that fails ends the study with an error naming the arm, the
// cell and the request: nothing is reported from a partial measurement.
func Run(ctx context.Context, s *Study, opts Options) (*Result, error) {
	arms, err := s.Expand()
	if err != nil {
		return nil, err
	}
	cells := s.Cells()
	res := &Result{Study: s, Arms: arms, Cells: cells, Info: map[string]ArmInfo{}, CellRounds: map[string]int{}, CellStop: map[string]string{}}
	for _, a := range arms {
		if err := opts.Runner.Prepare(ctx, a); err != nil {
			return nil, err
		}
		// an arm whose pass FAILED (a plugin that failed its checksum, say)
		// runs without it: measuring it would report another configuration
		if f := opts.Runner.Info(a).Failed; len(f) > 0 {
			return nil, fmt.Errorf("arm %s FAILED: %d of its passes failed, so it would measure a configuration it does not have: %s", a.Name, len(f), strings.Join(f, "; "))
		}
	}
	if d, ok := opts.Runner.(interface{ DeviceInfo() string }); ok && opts.Provenance.Device == "" {
		opts.Provenance.Device = d.DeviceInfo()
	}
	prompts := map[string][][]int32{}
	for _, w := range s.Workloads {
		prompts[w.Name] = Prompts(w, opts.Vocab)
	}
	counters, _ := opts.Runner.(CounterRunner)
	ad := s.Adaptive
	done := map[string]bool{}
	total := (s.Warmup + s.Repetitions) * len(cells) * len(arms)
	finished := 0
	start := time.Now()
	var lastRound time.Duration
	for round := 0; ; round++ {
		measured := round >= s.Warmup
		m := round - s.Warmup
		if m >= s.Repetitions {
			res.Stop = StopFixed
			if ad != nil {
				res.Stop = StopMaxRounds
			}
			break
		}
		if ad != nil && ad.MaxSeconds > 0 && round > 0 && time.Since(start)+lastRound > time.Duration(ad.MaxSeconds*float64(time.Second)) {
			res.Stop = StopTime
			break
		}
		r0 := time.Now()
		order := append([]Arm(nil), arms...)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, c := range cells {
			if done[c.Name()] {
				continue
			}
			results := map[string]*CellResult{}
			for _, a := range order {
				if err := ctx.Err(); err != nil {
					return res, err
				}
				var before Counters
				var counted bool
				if counters != nil {
					before, counted = counters.Counters(a)
				}
				cr, err := opts.Runner.RunCell(ctx, a, c, prompts[c.Workload.Name][:c.Requests])
				if err != nil {
					return res, fmt.Errorf("arm %s, cell %s: %w", a.Name, c.Name(), err)
				}
				if err := cr.Failed(); err != nil {
					return res, fmt.Errorf("arm %s, cell %s, round %d: %w", a.Name, c.Name(), round+1, err)
				}
				if counted {
					after, _ := counters.Counters(a)
					d := after.Sub(before)
					cr.Counters = &d
				}
				results[a.Name] = cr
				finished++
				if opts.Progress != nil {
					label := fmt.Sprintf("round %d/%d %s %s", round+1, s.Warmup+s.Repetitions, c.Name(), a.Name)
					if !measured {
						label += " (warm-up)"
					}
					opts.Progress(finished, total, label)
				}
			}
			if !measured {
				continue
			}
			for _, a := range arms {
				res.Rows = append(res.Rows, makeRow(s, a, c, m, results[a.Name], results["baseline"], opts.Runner.Info(a), opts.Provenance))
			}
			res.CellRounds[c.Name()] = m + 1
		}
		lastRound = time.Since(r0)
		if ad == nil || !measured || m+1 < ad.MinRounds {
			continue
		}
		left := 0
		for _, c := range cells {
			if done[c.Name()] {
				continue
			}
			if cellWithin(res, c.Name(), ad.TargetHalfWidth) {
				done[c.Name()] = true
				res.CellStop[c.Name()] = fmt.Sprintf("%s after %d rounds", StopTarget, m+1)
				finished += (s.Repetitions - m - 1) * len(arms) // the rounds it will not run
				continue
			}
			left++
		}
		if left == 0 {
			res.Stop = StopTarget
			break
		}
	}
	res.Elapsed = time.Since(start)
	for _, c := range cells {
		if _, ok := res.CellStop[c.Name()]; !ok {
			res.CellStop[c.Name()] = fmt.Sprintf("%s after %d rounds", res.Stop, res.CellRounds[c.Name()])
			if res.Stop == StopFixed {
				res.CellStop[c.Name()] = StopFixed
			}
		}
	}
	for _, a := range arms {
		res.Info[a.Name] = opts.Runner.Info(a)
	}
	return res, nil
}

func makeRow(s *Study, a Arm, c Cell, round int, cr, base *CellResult, info ArmInfo, prov Provenance) Row {
	r := Row{Study: s.Name, Level: s.Level, Arm: a.Name, ArmKind: a.Kind, Subject: a.Subject, Workload: c.Workload.Name,
		InputLen: c.Workload.InputLen, OutputLen: c.Workload.OutputLen, Requests: c.Requests, Concurrency: c.Concurrency,
		Round: round, WallS: cr.Wall.Seconds(), ConfigHash: info.ConfigHash, PassesFired: info.Fired, Provenance: prov}
	for _, p := range a.Passes {
		r.PassesRequested = append(r.PassesRequested, p.Name)
	}
	var ttft, itl, e2e []time.Duration
	for i, rr := range cr.Requests {
		r.OutputTokens += len(rr.Tokens)
		if rr.Err != "" {
			r.Errors++
			continue
		}
		ttft = append(ttft, rr.TTFT)
		e2e = append(e2e, rr.E2E)
		itl = append(itl, rr.ITL...)
		if base != nil && !slices.Equal(rr.Tokens, base.Requests[i].Tokens) {
			r.ParityMismatches++
		}
	}
	r.TokensPerS = float64(r.OutputTokens) / cr.Wall.Seconds()
	if k := cr.Counters; k != nil && k.Steps > 0 {
		r.DeviceS = float64(k.DeviceNs) / 1e9
		if r.DeviceS > 0 {
			r.DeviceTokensPerS = float64(r.OutputTokens) / r.DeviceS
		}
		r.PerStep = k.PerStep()
	}
	r.TTFTP50Ms, r.TTFTP90Ms = percentile(ttft, 0.5), percentile(ttft, 0.9)
	r.ITLP50Ms, r.ITLP90Ms = percentile(itl, 0.5), percentile(itl, 0.9)
	r.E2EP50Ms, r.E2EP90Ms = percentile(e2e, 0.5), percentile(e2e, 0.9)
	return r
}
