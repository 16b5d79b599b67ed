package attrib

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
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
}

// Row is one measurement: an arm on a cell in one round (a JSONL line).
type Row struct {
	Study            string   `json:"study"`
	Level            string   `json:"level"`
	Arm              string   `json:"arm"`
	ArmKind          string   `json:"arm_kind"`
	Subject          string   `json:"subject,omitempty"`
	Workload         string   `json:"workload"`
	InputLen         int      `json:"input_len"`
	OutputLen        int      `json:"output_len"`
	Requests         int      `json:"requests"`
	Concurrency      int      `json:"concurrency"`
	Round            int      `json:"round"`
	OutputTokens     int      `json:"output_tokens"`
	WallS            float64  `json:"wall_s"`
	TokensPerS       float64  `json:"output_tokens_per_s"`
	TTFTP50Ms        float64  `json:"ttft_p50_ms"`
	TTFTP90Ms        float64  `json:"ttft_p90_ms"`
	ITLP50Ms         float64  `json:"itl_p50_ms"`
	ITLP90Ms         float64  `json:"itl_p90_ms"`
	E2EP50Ms         float64  `json:"e2e_p50_ms"`
	E2EP90Ms         float64  `json:"e2e_p90_ms"`
	Errors           int      `json:"errors"`
	ParityMismatches int      `json:"parity_mismatches"`
	ConfigHash       string   `json:"config_hash"`
	PassesRequested  []string `json:"passes_requested"`
	PassesFired      []string `json:"passes_fired"`
	Provenance
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
}

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
// A request that fails ends the study with an error naming the arm, the
// cell and the request: nothing is reported from a partial measurement.
func Run(ctx context.Context, s *Study, opts Options) (*Result, error) {
	arms, err := s.Expand()
	if err != nil {
		return nil, err
	}
	cells := s.Cells()
	res := &Result{Study: s, Arms: arms, Cells: cells, Info: map[string]ArmInfo{}}
	for _, a := range arms {
		if err := opts.Runner.Prepare(ctx, a); err != nil {
			return nil, err
		}
	}
	prompts := map[string][][]int32{}
	for _, w := range s.Workloads {
		prompts[w.Name] = Prompts(w, opts.Vocab)
	}
	total := (s.Warmup + s.Repetitions) * len(cells) * len(arms)
	done := 0
	for round := 0; round < s.Warmup+s.Repetitions; round++ {
		measured := round >= s.Warmup
		order := append([]Arm(nil), arms...)
		if round%2 == 1 {
			for i, j := 0, len(order)-1; i < j; i, j = i+1, j-1 {
				order[i], order[j] = order[j], order[i]
			}
		}
		for _, c := range cells {
			var baseline *CellResult
			results := map[string]*CellResult{}
			for _, a := range order {
				if err := ctx.Err(); err != nil {
					return res, err
				}
				cr, err := opts.Runner.RunCell(ctx, a, c, prompts[c.Workload.Name])
				if err != nil {
					return res, fmt.Errorf("arm %s, cell %s: %w", a.Name, c.Name(), err)
				}
				if err := cr.Failed(); err != nil {
					return res, fmt.Errorf("arm %s, cell %s, round %d: %w", a.Name, c.Name(), round+1, err)
				}
				results[a.Name] = cr
				if a.Kind == "baseline" {
					baseline = cr
				}
				done++
				if opts.Progress != nil {
					label := fmt.Sprintf("round %d/%d %s %s", round+1, s.Warmup+s.Repetitions, c.Name(), a.Name)
					if !measured {
						label += " (warm-up)"
					}
					opts.Progress(done, total, label)
				}
			}
			if !measured {
				continue
			}
			for _, a := range arms {
				res.Rows = append(res.Rows, makeRow(s, a, c, round-s.Warmup, results[a.Name], baseline, opts.Runner.Info(a), opts.Provenance))
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
		InputLen: c.Workload.InputLen, OutputLen: c.Workload.OutputLen, Requests: c.Workload.Requests, Concurrency: c.Concurrency,
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
	r.TTFTP50Ms, r.TTFTP90Ms = percentile(ttft, 0.5), percentile(ttft, 0.9)
	r.ITLP50Ms, r.ITLP90Ms = percentile(itl, 0.5), percentile(itl, 0.9)
	r.E2EP50Ms, r.E2EP90Ms = percentile(e2e, 0.5), percentile(e2e, 0.9)
	return r
}
