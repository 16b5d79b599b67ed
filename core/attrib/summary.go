package attrib

import (
	"math"
	"sort"
)

// Stat is a median with its spread across rounds.
type Stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	// Spread is (max−min)/median: how noisy the rounds were.
	Spread float64 `json:"spread"`
}

func stat(xs []float64) Stat {
	if len(xs) == 0 {
		return Stat{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	var m float64
	if n := len(s); n%2 == 1 {
		m = s[n/2]
	} else {
		m = (s[n/2-1] + s[n/2]) / 2
	}
	st := Stat{Median: m, Min: s[0], Max: s[len(s)-1]}
	if m != 0 {
		st.Spread = (st.Max - st.Min) / math.Abs(m)
	}
	return st
}

// CellSummary is one arm on one cell, over the measured rounds.
type CellSummary struct {
	Arm        string  `json:"arm"`
	Cell       string  `json:"cell"`
	TokensPerS Stat    `json:"output_tokens_per_s"`
	TTFTP50Ms  Stat    `json:"ttft_p50_ms"`
	TTFTP90Ms  Stat    `json:"ttft_p90_ms"`
	ITLP50Ms   Stat    `json:"itl_p50_ms"`
	ITLP90Ms   Stat    `json:"itl_p90_ms"`
	E2EP50Ms   Stat    `json:"e2e_p50_ms"`
	Ratio      Stat    `json:"ratio_to_baseline"` // paired per round
	Gap        float64 `json:"gap"`               // median ratio − 1
	Errors     int     `json:"errors"`
	Parity     int     `json:"parity_mismatches"`
}

// ArmSummary aggregates an arm over cells.
type ArmSummary struct {
	Arm     string   `json:"arm"`
	Kind    string   `json:"kind"`
	Subject string   `json:"subject,omitempty"`
	GeoGap  float64  `json:"geomean_gap"` // geometric mean of the per-cell ratios − 1
	Parity  int      `json:"parity_mismatches"`
	Errors  int      `json:"errors"`
	Fired   []string `json:"passes_fired"`
	Hash    string   `json:"config_hash"`
}

// Contribution is one pass's effect per cell.
type Contribution struct {
	Pass string `json:"pass"`
	// LeaveOneOut[cell] = all / (all without the pass) − 1; AddOneIn[cell] =
	// (baseline + the pass) / baseline − 1. Geo* are the geometric means.
	LeaveOneOut    map[string]float64 `json:"leave_one_out"`
	AddOneIn       map[string]float64 `json:"add_one_in"`
	GeoLeaveOneOut float64            `json:"geomean_leave_one_out"`
	GeoAddOneIn    float64            `json:"geomean_add_one_in"`
	HasLOO, HasAOI bool               `json:"-"`
}

// Summary is what the reports show.
type Summary struct {
	Cells         []string                           `json:"cells"`
	Arms          []ArmSummary                       `json:"arms"`
	PerCell       map[string]map[string]*CellSummary `json:"per_cell"` // arm → cell
	Contributions []Contribution                     `json:"contributions"`
	// BaselineSpread[cell] is the baseline's round-to-round spread.
	BaselineSpread map[string]float64 `json:"baseline_spread"`
	ParityTotal    int                `json:"parity_mismatches_total"`
}

// Summarize computes medians, spreads, paired gaps and contributions.
func (r *Result) Summarize() *Summary {
	sum := &Summary{PerCell: map[string]map[string]*CellSummary{}, BaselineSpread: map[string]float64{}}
	for _, c := range r.Cells {
		sum.Cells = append(sum.Cells, c.Name())
	}
	type key struct{ arm, cell string }
	rows := map[key][]Row{}
	for _, row := range r.Rows {
		c := Cell{Workload: Workload{Name: row.Workload}, Concurrency: row.Concurrency}.Name()
		rows[key{row.Arm, c}] = append(rows[key{row.Arm, c}], row)
	}
	// paired ratio per round, for any two arms on a cell
	ratios := func(num, den, cell string) []float64 {
		a, b := rows[key{num, cell}], rows[key{den, cell}]
		byRound := map[int]float64{}
		for _, x := range b {
			byRound[x.Round] = x.TokensPerS
		}
		var out []float64
		for _, x := range a {
			if d, ok := byRound[x.Round]; ok && d > 0 {
				out = append(out, x.TokensPerS/d)
			}
		}
		return out
	}
	geo := func(vals []float64) float64 {
		if len(vals) == 0 {
			return 0
		}
		var s float64
		for _, v := range vals {
			s += math.Log(v)
		}
		return math.Exp(s/float64(len(vals))) - 1
	}
	for _, a := range r.Arms {
		sum.PerCell[a.Name] = map[string]*CellSummary{}
		as := ArmSummary{Arm: a.Name, Kind: a.Kind, Subject: a.Subject, Fired: r.Info[a.Name].Fired, Hash: r.Info[a.Name].ConfigHash}
		var cellRatios []float64
		for _, cn := range sum.Cells {
			rs := rows[key{a.Name, cn}]
			cs := &CellSummary{Arm: a.Name, Cell: cn}
			var tps, t50, t90, i50, i90, e50 []float64
			for _, x := range rs {
				tps = append(tps, x.TokensPerS)
				t50, t90 = append(t50, x.TTFTP50Ms), append(t90, x.TTFTP90Ms)
				i50, i90 = append(i50, x.ITLP50Ms), append(i90, x.ITLP90Ms)
				e50 = append(e50, x.E2EP50Ms)
				cs.Errors += x.Errors
				cs.Parity += x.ParityMismatches
			}
			cs.TokensPerS, cs.TTFTP50Ms, cs.TTFTP90Ms = stat(tps), stat(t50), stat(t90)
			cs.ITLP50Ms, cs.ITLP90Ms, cs.E2EP50Ms = stat(i50), stat(i90), stat(e50)
			cs.Ratio = stat(ratios(a.Name, "baseline", cn))
			cs.Gap = cs.Ratio.Median - 1
			if cs.Ratio.Median > 0 {
				cellRatios = append(cellRatios, cs.Ratio.Median)
			}
			as.Parity += cs.Parity
			as.Errors += cs.Errors
			sum.PerCell[a.Name][cn] = cs
			if a.Kind == "baseline" {
				sum.BaselineSpread[cn] = cs.TokensPerS.Spread
			}
		}
		as.GeoGap = geo(cellRatios)
		sum.ParityTotal += as.Parity
		sum.Arms = append(sum.Arms, as)
	}
	// per-pass contributions
	byName := map[string]Arm{}
	for _, a := range r.Arms {
		byName[a.Name] = a
	}
	for _, p := range r.Study.Passes {
		c := Contribution{Pass: p.Name, LeaveOneOut: map[string]float64{}, AddOneIn: map[string]float64{}}
		_, hasAll := byName["all"]
		_, hasLOO := byName["-"+p.Name]
		_, hasAOI := byName["+"+p.Name]
		var loo, aoi []float64
		for _, cn := range sum.Cells {
			if hasAll && hasLOO {
				v := stat(ratios("all", "-"+p.Name, cn)).Median
				c.LeaveOneOut[cn] = v - 1
				loo = append(loo, v)
			}
			if hasAOI {
				v := stat(ratios("+"+p.Name, "baseline", cn)).Median
				c.AddOneIn[cn] = v - 1
				aoi = append(aoi, v)
			}
		}
		c.HasLOO, c.HasAOI = hasAll && hasLOO, hasAOI
		c.GeoLeaveOneOut, c.GeoAddOneIn = geo(loo), geo(aoi)
		if c.HasLOO || c.HasAOI {
			sum.Contributions = append(sum.Contributions, c)
		}
	}
	return sum
}
