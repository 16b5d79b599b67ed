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

// Metrics whose paired ratios get intervals: output tokens per second of
// wall clock (the primary one: adaptive stopping and ties use it), and per
// second of device time (CUDA events; device backends only).
const (
	MetricWall   = "wall"
	MetricDevice = "device"
)

// CellSummary is one arm on one cell, over the measured rounds.
type CellSummary struct {
	Arm              string `json:"arm"`
	Cell             string `json:"cell"`
	Rounds           int    `json:"rounds"`
	TokensPerS       Stat   `json:"output_tokens_per_s"`
	DeviceTokensPerS *Stat  `json:"device_output_tokens_per_s,omitempty"`
	TTFTP50Ms        Stat   `json:"ttft_p50_ms"`
	TTFTP90Ms        Stat   `json:"ttft_p90_ms"`
	ITLP50Ms         Stat   `json:"itl_p50_ms"`
	ITLP90Ms         Stat   `json:"itl_p90_ms"`
	E2EP50Ms         Stat   `json:"e2e_p50_ms"`
	// Ratio is the spread of the paired per-round ratios to the baseline;
	// Interval their geometric mean with its 95% interval (wall clock),
	// DeviceInterval the same by device time; Gap is Interval's effect.
	Ratio          Stat      `json:"ratio_to_baseline"`
	Interval       Interval  `json:"interval"`
	DeviceInterval *Interval `json:"device_interval,omitempty"`
	Gap            float64   `json:"gap"`
	// PerStep are the medians over rounds of the per-step counters.
	PerStep *PerStep `json:"per_step,omitempty"`
	Errors  int      `json:"errors"`
	Parity  int      `json:"parity_mismatches"`
}

// ArmSummary aggregates an arm over cells.
type ArmSummary struct {
	Arm     string `json:"arm"`
	Kind    string `json:"kind"`
	Subject string `json:"subject,omitempty"`
	// Geo is the geometric mean over cells of the ratios to the baseline,
	// with its interval (a joint bootstrap over rounds); GeoGap its effect.
	Geo       Interval  `json:"geomean"`
	DeviceGeo *Interval `json:"device_geomean,omitempty"`
	GeoGap    float64   `json:"geomean_gap"`
	Parity    int       `json:"parity_mismatches"`
	Errors    int       `json:"errors"`
	Fired     []string  `json:"passes_fired"`
	Hash      string    `json:"config_hash"`
}

// Contribution is one pass's effect per cell.
type Contribution struct {
	Pass string `json:"pass"`
	// LeaveOneOut[cell] = all / (all without the pass); AddOneIn[cell] =
	// (baseline + the pass) / baseline; Geo* their geometric means over
	// cells; each with its interval.
	LeaveOneOut    map[string]Interval `json:"leave_one_out,omitempty"`
	AddOneIn       map[string]Interval `json:"add_one_in,omitempty"`
	GeoLeaveOneOut Interval            `json:"geomean_leave_one_out"`
	GeoAddOneIn    Interval            `json:"geomean_add_one_in"`
	// Device* are the same by device time (device backends).
	DeviceGeoLeaveOneOut *Interval `json:"device_geomean_leave_one_out,omitempty"`
	DeviceGeoAddOneIn    *Interval `json:"device_geomean_add_one_in,omitempty"`
	HasLOO, HasAOI       bool      `json:"-"`
}

// NoiseFloor is the A/A arm's verdict: the baseline against itself.
type NoiseFloor struct {
	// Geo is the A/A ratio's geometric mean over cells with its interval.
	Geo Interval `json:"geomean"`
	// Excluded lists the cells whose A/A interval does not contain 1 (and
	// "geomean" when the geometric mean's does not): about 5% of honest
	// intervals miss, more means the rounds are not comparable.
	Excluded []string `json:"excluded_one"`
}

// Summary is what the reports show.
type Summary struct {
	Cells         []string                           `json:"cells"`
	Arms          []ArmSummary                       `json:"arms"`
	PerCell       map[string]map[string]*CellSummary `json:"per_cell"` // arm → cell
	Contributions []Contribution                     `json:"contributions"`
	NoiseFloor    *NoiseFloor                        `json:"noise_floor,omitempty"`
	// BaselineSpread[cell] is the baseline's round-to-round spread.
	BaselineSpread map[string]float64 `json:"baseline_spread"`
	ParityTotal    int                `json:"parity_mismatches_total"`
	// ParityMode is the study's parity rule; ParityRequests the requests
	// compared with the baseline's (every arm but the baseline, every
	// round), ParityAA the A/A arm's mismatches among its AARequests.
	ParityMode     string `json:"parity_mode"`
	ParityRequests int    `json:"parity_requests"`
	ParityAA       int    `json:"parity_mismatches_aa"`
	AARequests     int    `json:"aa_requests"`
	// Stop, CellRounds and CellStop: what ended the study, and per cell
	// the measured rounds and why it got no more; Target is the adaptive
	// mode's half-width (0: fixed rounds).
	Stop       string            `json:"stop"`
	CellRounds map[string]int    `json:"cell_rounds"`
	CellStop   map[string]string `json:"cell_stop"`
	Target     float64           `json:"target_half_width,omitempty"`
	// Device says whether device counters and device time were measured.
	Device bool `json:"device_measured"`
	// ivs holds every interval computed for the summary (IntervalRecords
	// reads them back instead of bootstrapping again).
	ivs *intervals
}

// geomeanCell names the geometric mean over cells among intervals.
const geomeanCell = "geomean"

// intervals computes a study's paired intervals once each: a comparison
// (num/den) on one cell or on geomeanCell, by one metric.
type intervals struct {
	r     *Result
	ix    roundsOf
	cells []string
	memo  map[[4]string]Interval
}

func newIntervals(r *Result, cells []string) *intervals {
	return &intervals{r: r, ix: index(r.Rows), cells: cells, memo: map[[4]string]Interval{}}
}

func (v *intervals) get(num, den, cell, metric string) Interval {
	k := [4]string{num, den, cell, metric}
	if iv, ok := v.memo[k]; ok {
		return iv
	}
	var iv Interval
	if cell == geomeanCell {
		iv = v.r.geo(v.ix, num, den, metric, v.cells)
	} else {
		iv = v.r.interval(v.ix, num, den, cell, metric)
	}
	v.memo[k] = iv
	return iv
}

// roundsOf indexes a study's rows: arm → cell → round → row.
type roundsOf map[string]map[string]map[int]*Row

func index(rows []Row) roundsOf {
	ix := roundsOf{}
	for i := range rows {
		row := &rows[i]
		c := Cell{Workload: Workload{Name: row.Workload}, Concurrency: row.Concurrency}.Name()
		if ix[row.Arm] == nil {
			ix[row.Arm] = map[string]map[int]*Row{}
		}
		if ix[row.Arm][c] == nil {
			ix[row.Arm][c] = map[int]*Row{}
		}
		ix[row.Arm][c][row.Round] = row
	}
	return ix
}

func metricOf(r *Row, metric string) float64 {
	if metric == MetricDevice {
		return r.DeviceTokensPerS
	}
	return r.TokensPerS
}

// logRatios pairs num and den on a cell by round.
func (ix roundsOf) logRatios(num, den, cell, metric string) []float64 {
	a, b := ix[num][cell], ix[den][cell]
	var rounds []int
	for r := range a {
		if _, ok := b[r]; ok {
			rounds = append(rounds, r)
		}
	}
	sort.Ints(rounds)
	var x, y []float64
	for _, r := range rounds {
		x, y = append(x, metricOf(a[r], metric)), append(y, metricOf(b[r], metric))
	}
	return LogRatios(x, y)
}

// comparisons of a study: every arm against the baseline, and each
// leave-one-out contribution (all against all without the pass); label,
// numerator, denominator.
func comparisons(arms []Arm) [][3]string {
	var out [][3]string
	hasAll := false
	for _, a := range arms {
		hasAll = hasAll || a.Kind == KindAll
		if a.Kind != KindBaseline {
			out = append(out, [3]string{a.Name, a.Name, "baseline"})
		}
	}
	if hasAll {
		for _, a := range arms {
			if a.Kind == KindLeaveOneOut {
				out = append(out, [3]string{"contribution " + a.Subject, "all", a.Name})
			}
		}
	}
	return out
}

func (r *Result) interval(ix roundsOf, num, den, cell, metric string) Interval {
	return PairedInterval(ix.logRatios(num, den, cell, metric), Seed(r.Study.Name, metric, num, den, cell))
}

func (r *Result) geo(ix roundsOf, num, den, metric string, cells []string) Interval {
	var ds [][]float64
	for _, c := range cells {
		ds = append(ds, ix.logRatios(num, den, c, metric))
	}
	return GeoInterval(ds, Seed(r.Study.Name, metric, num, den, "geomean"))
}

// cellWithin says whether every comparison on cell has a wall-clock
// interval no wider than ±target.
func cellWithin(r *Result, cell string, target float64) bool {
	ix := index(r.Rows)
	for _, c := range comparisons(r.Arms) {
		if r.interval(ix, c[1], c[2], cell, MetricWall).HalfWidth() > target {
			return false
		}
	}
	return true
}

func medianPerStep(ps []*PerStep) *PerStep {
	if len(ps) == 0 {
		return nil
	}
	pick := func(f func(*PerStep) float64) float64 {
		var xs []float64
		for _, p := range ps {
			xs = append(xs, f(p))
		}
		return stat(xs).Median
	}
	return &PerStep{Steps: int64(pick(func(p *PerStep) float64 { return float64(p.Steps) })),
		DeviceMs:    pick(func(p *PerStep) float64 { return p.DeviceMs }),
		Launches:    pick(func(p *PerStep) float64 { return p.Launches }),
		Kernels:     pick(func(p *PerStep) float64 { return p.Kernels }),
		HostSyncs:   pick(func(p *PerStep) float64 { return p.HostSyncs }),
		LengthSyncs: pick(func(p *PerStep) float64 { return p.LengthSyncs })}
}

// Summarize computes medians, spreads, paired ratios with their intervals,
// contributions and the noise floor.
func (r *Result) Summarize() *Summary {
	sum := &Summary{PerCell: map[string]map[string]*CellSummary{}, BaselineSpread: map[string]float64{},
		Stop: r.Stop, CellRounds: r.CellRounds, CellStop: r.CellStop, ParityMode: r.Study.Parity}
	if r.Study.Adaptive != nil {
		sum.Target = r.Study.Adaptive.TargetHalfWidth
	}
	for _, c := range r.Cells {
		sum.Cells = append(sum.Cells, c.Name())
	}
	requests := map[string]int{} // requests measured per arm (the parity counts' denominators)
	for _, row := range r.Rows {
		sum.Device = sum.Device || row.PerStep != nil
		requests[row.Arm] += row.Requests
	}
	ivs := newIntervals(r, sum.Cells)
	sum.ivs = ivs
	ix := ivs.ix
	for _, a := range r.Arms {
		sum.PerCell[a.Name] = map[string]*CellSummary{}
		as := ArmSummary{Arm: a.Name, Kind: a.Kind, Subject: a.Subject, Fired: r.Info[a.Name].Fired, Hash: r.Info[a.Name].ConfigHash}
		for _, cn := range sum.Cells {
			rs := ix[a.Name][cn]
			rounds := make([]int, 0, len(rs))
			for k := range rs {
				rounds = append(rounds, k)
			}
			sort.Ints(rounds)
			cs := &CellSummary{Arm: a.Name, Cell: cn, Rounds: len(rounds)}
			var tps, dtps, t50, t90, i50, i90, e50 []float64
			var ps []*PerStep
			for _, k := range rounds {
				x := rs[k]
				tps = append(tps, x.TokensPerS)
				if x.DeviceTokensPerS > 0 {
					dtps = append(dtps, x.DeviceTokensPerS)
				}
				if x.PerStep != nil {
					ps = append(ps, x.PerStep)
				}
				t50, t90 = append(t50, x.TTFTP50Ms), append(t90, x.TTFTP90Ms)
				i50, i90 = append(i50, x.ITLP50Ms), append(i90, x.ITLP90Ms)
				e50 = append(e50, x.E2EP50Ms)
				cs.Errors += x.Errors
				cs.Parity += x.ParityMismatches
			}
			cs.TokensPerS, cs.TTFTP50Ms, cs.TTFTP90Ms = stat(tps), stat(t50), stat(t90)
			cs.ITLP50Ms, cs.ITLP90Ms, cs.E2EP50Ms = stat(i50), stat(i90), stat(e50)
			cs.PerStep = medianPerStep(ps)
			var ratios []float64
			for _, d := range ix.logRatios(a.Name, "baseline", cn, MetricWall) {
				ratios = append(ratios, math.Exp(d))
			}
			cs.Ratio = stat(ratios)
			cs.Interval = ivs.get(a.Name, "baseline", cn, MetricWall)
			cs.Gap = cs.Interval.Effect()
			if sum.Device && len(dtps) > 0 {
				st := stat(dtps)
				cs.DeviceTokensPerS = &st
				iv := ivs.get(a.Name, "baseline", cn, MetricDevice)
				cs.DeviceInterval = &iv
			}
			as.Parity += cs.Parity
			as.Errors += cs.Errors
			sum.PerCell[a.Name][cn] = cs
			if a.Kind == KindBaseline {
				sum.BaselineSpread[cn] = cs.TokensPerS.Spread
			}
		}
		as.Geo = ivs.get(a.Name, "baseline", geomeanCell, MetricWall)
		as.GeoGap = as.Geo.Effect()
		if sum.Device {
			iv := ivs.get(a.Name, "baseline", geomeanCell, MetricDevice)
			as.DeviceGeo = &iv
		}
		if a.Kind == KindAA {
			nf := &NoiseFloor{Geo: as.Geo}
			for _, cn := range sum.Cells {
				if iv := sum.PerCell[a.Name][cn].Interval; iv.Defined() && !iv.Tie() {
					nf.Excluded = append(nf.Excluded, cn)
				}
			}
			if as.Geo.Defined() && !as.Geo.Tie() {
				nf.Excluded = append(nf.Excluded, "geomean")
			}
			sum.NoiseFloor = nf
		}
		sum.ParityTotal += as.Parity
		if a.Name != "baseline" {
			sum.ParityRequests += requests[a.Name]
		}
		if a.Kind == "aa" {
			sum.ParityAA += as.Parity
			sum.AARequests += requests[a.Name]
		}
		sum.Arms = append(sum.Arms, as)
	}
	// per-pass contributions
	byName := map[string]Arm{}
	for _, a := range r.Arms {
		byName[a.Name] = a
	}
	for _, p := range r.Study.Passes {
		c := Contribution{Pass: p.Name}
		_, hasAll := byName["all"]
		_, hasLOO := byName["-"+p.Name]
		_, hasAOI := byName["+"+p.Name]
		c.HasLOO, c.HasAOI = hasAll && hasLOO, hasAOI
		if c.HasLOO {
			c.LeaveOneOut = map[string]Interval{}
			for _, cn := range sum.Cells {
				c.LeaveOneOut[cn] = ivs.get("all", "-"+p.Name, cn, MetricWall)
			}
			c.GeoLeaveOneOut = ivs.get("all", "-"+p.Name, geomeanCell, MetricWall)
			if sum.Device {
				iv := ivs.get("all", "-"+p.Name, geomeanCell, MetricDevice)
				c.DeviceGeoLeaveOneOut = &iv
			}
		}
		if c.HasAOI {
			c.AddOneIn = map[string]Interval{}
			for _, cn := range sum.Cells {
				c.AddOneIn[cn] = sum.PerCell["+"+p.Name][cn].Interval
			}
			c.GeoAddOneIn = ivs.get("+"+p.Name, "baseline", geomeanCell, MetricWall)
			if sum.Device {
				iv := ivs.get("+"+p.Name, "baseline", geomeanCell, MetricDevice)
				c.DeviceGeoAddOneIn = &iv
			}
		}
		if c.HasLOO || c.HasAOI {
			sum.Contributions = append(sum.Contributions, c)
		}
	}
	return sum
}

// IntervalRecord is one line of intervals.jsonl: one comparison on one
// cell (or "geomean") by one metric.
type IntervalRecord struct {
	Study       string `json:"study"`
	Comparison  string `json:"comparison"` // arm name, or "contribution PASS" (leave-one-out)
	Kind        string `json:"kind"`       // the arm's kind, or "leave-one-out contribution"
	Numerator   string `json:"numerator"`
	Denominator string `json:"denominator"`
	Cell        string `json:"cell"`
	Metric      string `json:"metric"`
	Interval
}

// IntervalRecords lists every interval the summary holds.
func (r *Result) IntervalRecords(s *Summary) []IntervalRecord {
	ivs := s.ivs
	if ivs == nil {
		ivs = newIntervals(r, s.Cells)
	}
	kinds := map[string]string{}
	for _, a := range r.Arms {
		kinds[a.Name] = a.Kind
	}
	metrics := []string{MetricWall}
	if s.Device {
		metrics = append(metrics, MetricDevice)
	}
	var out []IntervalRecord
	for _, c := range comparisons(r.Arms) {
		kind := kinds[c[0]]
		if kind == "" {
			kind = "leave-one-out contribution"
		}
		for _, m := range metrics {
			for _, cn := range s.Cells {
				out = append(out, IntervalRecord{Study: r.Study.Name, Comparison: c[0], Kind: kind, Numerator: c[1], Denominator: c[2], Cell: cn, Metric: m,
					Interval: ivs.get(c[1], c[2], cn, m)})
			}
			out = append(out, IntervalRecord{Study: r.Study.Name, Comparison: c[0], Kind: kind, Numerator: c[1], Denominator: c[2], Cell: geomeanCell, Metric: m,
				Interval: ivs.get(c[1], c[2], geomeanCell, m)})
		}
	}
	return out
}
