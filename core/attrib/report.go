package attrib

import (
	"bufio"
	"encoding/json"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// roundsLine says how many rounds were measured and what stopped them.
func (r *Result) roundsLine(s *Summary) string {
	st := r.Study
	lo, hi := math.MaxInt, 0
	for _, cn := range s.Cells {
		lo, hi = min(lo, s.CellRounds[cn]), max(hi, s.CellRounds[cn])
	}
	n := fmt.Sprint(lo)
	if hi != lo {
		n = fmt.Sprintf("%d–%d", lo, hi)
	}
	mode := "fixed"
	if a := st.Adaptive; a != nil {
		mode = fmt.Sprintf("adaptive: target ±%.2g%%, %d–%d rounds", 100*a.TargetHalfWidth, a.MinRounds, a.MaxRounds)
		if a.MaxSeconds > 0 {
			mode += fmt.Sprintf(", at most %gs", a.MaxSeconds)
		}
		mode += "; stopped by the " + s.Stop
	}
	return fmt.Sprintf("%s measured rounds per cell (%s), %d warm-up", n, mode, st.Warmup)
}

func (r *Result) deviceName() string {
	if len(r.Rows) > 0 && r.Rows[0].Device != "" {
		return r.Rows[0].Device
	}
	if r.Study.Device != "" {
		return r.Study.Device
	}
	return "the configured device"
}

// Console writes the campaign-shaped tables: the gap of every arm to the
// baseline per cell with 95% intervals and the geometric mean, the noise
// floor (A/A), the per-pass contributions, device time and counters when
// measured, and parity (loudly when any request changed).
func (r *Result) Console(w io.Writer, s *Summary) {
	fmt.Fprintf(w, "study %s (%s level on %s, %s)\n", r.Study.Name, r.Study.Level, r.deviceName(), r.roundsLine(s))
	for _, cn := range s.Cells {
		fmt.Fprintf(w, "  %s: %d rounds (%s)\n", cn, s.CellRounds[cn], s.CellStop[cn])
	}
	fmt.Fprintln(w, "\ngap to baseline: output tokens/s by wall clock, geometric mean of the paired per-round ratios and its 95% interval; a tie is an interval that contains 0:")
	r.gapTable(w, s, MetricWall)
	r.noiseLine(w, s)
	if len(s.Contributions) > 0 {
		fmt.Fprintln(w, "\nper-pass contribution, geometric mean over cells (leave-one-out = all / (all − p), add-one-in = (baseline + p) / baseline):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "pass\tleave-one-out\tadd-one-in")
		for _, c := range s.Contributions {
			l, a := "n/a", "n/a"
			if c.HasLOO {
				l = c.GeoLeaveOneOut.String()
			}
			if c.HasAOI {
				a = c.GeoAddOneIn.String()
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Pass, l, a)
		}
		tw.Flush()
	}
	if s.Device {
		fmt.Fprintln(w, "\ngap to baseline by device time (CUDA events around every step):")
		r.gapTable(w, s, MetricDevice)
		fmt.Fprintln(w, "\nper step (median over rounds and cells): launches (host launch calls; a graph replay is one), kernels executed, host syncs, length read-backs, device ms:")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "arm\tlaunches\tkernels\thost syncs\tlength syncs\tdevice ms")
		for _, as := range s.Arms {
			var ps []*PerStep
			for _, cn := range s.Cells {
				if p := s.PerCell[as.Arm][cn].PerStep; p != nil {
					ps = append(ps, p)
				}
			}
			if m := medianPerStep(ps); m != nil {
				fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.2f\t%.2f\t%.3f\n", as.Arm, m.Launches, m.Kernels, m.HostSyncs, m.LengthSyncs, m.DeviceMs)
			}
		}
		tw.Flush()
	}
	if s.ParityTotal > 0 && s.ParityMode == ParityReport {
		fmt.Fprintf(w, "\nparity (reported, not required: parity: report): %s\n", s.parityLine())
	} else if s.ParityTotal > 0 {
		fmt.Fprintf(w, "\n!!! PARITY FAILURE: %d requests produced greedy tokens different from baseline !!!\n", s.ParityTotal)
	} else {
		fmt.Fprintln(w, "\nparity: every arm produced the baseline's greedy tokens on every request (0 mismatches)")
	}
}

func (r *Result) gapTable(w io.Writer, s *Summary, metric string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "arm\t%s\tgeomean\tparity\tfired\n", strings.Join(s.Cells, "\t"))
	for _, as := range s.Arms {
		if as.Kind == KindBaseline {
			continue
		}
		var cols []string
		for _, cn := range s.Cells {
			cols = append(cols, cellInterval(s.PerCell[as.Arm][cn], metric).String())
		}
		geo := armGeo(as, metric)
		par := "0"
		if as.Parity > 0 {
			par = fmt.Sprintf("%d MISMATCHES", as.Parity)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", as.Arm, strings.Join(cols, "\t"), geo, par, strings.Join(as.Fired, ","))
	}
	tw.Flush()
}

// armGeo is an arm's geometric-mean interval by metric ("n/a" without
// device time).
func armGeo(as ArmSummary, metric string) Interval {
	if metric == MetricDevice {
		if as.DeviceGeo == nil {
			return Interval{Verdict: VerdictNoSignal}
		}
		return *as.DeviceGeo
	}
	return as.Geo
}

func cellInterval(cs *CellSummary, metric string) Interval {
	if metric == MetricDevice {
		if cs.DeviceInterval == nil {
			return Interval{Verdict: VerdictNoSignal}
		}
		return *cs.DeviceInterval
	}
	return cs.Interval
}

func (r *Result) noiseLine(w io.Writer, s *Summary) {
	nf := s.NoiseFloor
	if nf == nil {
		return
	}
	fmt.Fprintf(w, "\nnoise floor (A/A: the baseline measured again as a separate arm): geomean %s", nf.Geo)
	if len(nf.Excluded) > 0 {
		fmt.Fprintf(w, "\n!!! the A/A interval excludes 0 on %s: the arms' rounds are not comparable there (drift, warm-up, a noisy neighbour); read effects of that size with suspicion !!!\n", strings.Join(nf.Excluded, ", "))
	} else {
		fmt.Fprintln(w, "; every A/A interval contains 0")
	}
}

// WriteJSONL writes one row per measurement.
func (r *Result) WriteJSONL(path string) error {
	return writeLines(path, len(r.Rows), func(i int) any { return r.Rows[i] })
}

// WriteIntervals writes one line per interval (intervals.jsonl).
func (r *Result) WriteIntervals(path string, s *Summary) error {
	recs := r.IntervalRecords(s)
	return writeLines(path, len(recs), func(i int) any { return recs[i] })
}

func writeLines(path string, n int, at func(int) any) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(f)
	enc := json.NewEncoder(bw)
	for i := range n {
		if err := enc.Encode(at(i)); err != nil {
			f.Close()
			return err
		}
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// WriteMarkdown writes the report.
func (r *Result) WriteMarkdown(path string, s *Summary, charts []string) error {
	var b strings.Builder
	st := r.Study
	fmt.Fprintf(&b, "# Attribution study: %s\n\n", st.Name)
	if st.Description != "" {
		fmt.Fprintf(&b, "%s\n\n", st.Description)
	}
	if len(r.Rows) > 0 {
		p := r.Rows[0].Provenance
		fmt.Fprintf(&b, "- level: %s on %s; model: %s\n- commit %s, %s (%d CPUs), %s, %s\n- %s; arms interleaved per cell, arm order alternating between rounds; measurement took %s\n\n",
			st.Level, r.deviceName(), p.Model, p.Commit, p.CPU, p.CPUs, p.GoVersion, p.Date, r.roundsLine(s), r.Elapsed.Round(1e9))
	}
	b.WriteString("## Workloads\n\n| workload | input | output | requests | concurrency | requests per level |\n|---|---|---|---|---|---|\n")
	for _, w := range st.Workloads {
		per := "all"
		if w.RequestsPerLevel != nil {
			per = fmt.Sprint(w.RequestsPerLevel)
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %v | %s |\n", w.Name, w.InputLen, w.OutputLen, w.Requests, w.Concurrency, per)
	}
	b.WriteString("\n## Rounds\n\n| cell | measured rounds | why it stopped |\n|---|---|---|\n")
	for _, cn := range s.Cells {
		fmt.Fprintf(&b, "| %s | %d | %s |\n", cn, s.CellRounds[cn], s.CellStop[cn])
	}
	b.WriteString(readingIntervals)
	r.mdGapTable(&b, s, MetricWall, "## Gap to baseline per cell (wall clock)\n\nOutput tokens/s: median over rounds; the gap is the geometric mean of the paired ratios arm/baseline minus 1, with its 95% interval.\n\n")
	if nf := s.NoiseFloor; nf != nil {
		b.WriteString("\n## Noise floor (A/A)\n\n")
		fmt.Fprintf(&b, "`%s` is the baseline's configuration measured as a separate arm in the same interleaved rounds. Its geometric mean over cells: **%s**.", AAName, nf.Geo)
		if len(nf.Excluded) > 0 {
			fmt.Fprintf(&b, " **Its interval excludes 0 on %s**: there the arms' rounds were not comparable (drift, warm-up, interference), and effects of that size are not to be believed.\n", strings.Join(nf.Excluded, ", "))
		} else {
			b.WriteString(" Every A/A interval contains 0, as it must.\n")
		}
	}
	if len(s.Contributions) > 0 {
		b.WriteString("\n## Per-pass contributions\n\nleave-one-out = all / (all without the pass) − 1; add-one-in = (baseline + the pass) / baseline − 1; geometric means of paired ratios with 95% intervals (the geomean column: a joint bootstrap over rounds).\n\n")
		fmt.Fprintf(&b, "| pass | kind | %s | geomean |", strings.Join(s.Cells, " | "))
		if s.Device {
			b.WriteString(" geomean by device time |")
		}
		fmt.Fprintf(&b, "\n|---|---|%s---|", strings.Repeat("---|", len(s.Cells)))
		if s.Device {
			b.WriteString("---|")
		}
		b.WriteString("\n")
		for _, c := range s.Contributions {
			for _, kind := range []string{KindLeaveOneOut, KindAddOneIn} {
				m, g, dg, ok := c.LeaveOneOut, c.GeoLeaveOneOut, c.DeviceGeoLeaveOneOut, c.HasLOO
				if kind == KindAddOneIn {
					m, g, dg, ok = c.AddOneIn, c.GeoAddOneIn, c.DeviceGeoAddOneIn, c.HasAOI
				}
				if !ok {
					continue
				}
				var cols []string
				for _, cn := range s.Cells {
					cols = append(cols, m[cn].String())
				}
				fmt.Fprintf(&b, "| %s | %s | %s | %s |", c.Pass, kind, strings.Join(cols, " | "), g)
				if s.Device {
					dv := "n/a"
					if dg != nil {
						dv = dg.String()
					}
					fmt.Fprintf(&b, " %s |", dv)
				}
				b.WriteString("\n")
			}
		}
	}
	for _, c := range charts {
		fmt.Fprintf(&b, "\n![%s](%s)\n", strings.TrimSuffix(filepath.Base(c), ".png"), filepath.Base(c))
	}
	if s.Device {
		r.mdGapTable(&b, s, MetricDevice, "\n## Gap to baseline by device time\n\nOutput tokens per second of device time (CUDA events recorded before each step's first upload and after its last kernel): what the GPU work itself gained, without the host's share.\n\n")
		b.WriteString("\n## Device counters per step\n\nMedians over rounds: launch calls (a CUDA graph replay is one), kernels executed (those a replay runs included; a cuBLAS call counts one), host syncs, sequence-length read-backs, device ms. A step is one scheduler batch (decode tokens plus prompt chunks).\n\n| arm | cell | launches | kernels | host syncs | length syncs | device ms |\n|---|---|---|---|---|---|---|\n")
		for _, as := range s.Arms {
			for _, cn := range s.Cells {
				if p := s.PerCell[as.Arm][cn].PerStep; p != nil {
					fmt.Fprintf(&b, "| %s | %s | %.1f | %.1f | %.2f | %.2f | %.3f |\n", as.Arm, cn, p.Launches, p.Kernels, p.HostSyncs, p.LengthSyncs, p.DeviceMs)
				}
			}
		}
	}
	b.WriteString("\n## Latency (medians over rounds)\n\n| arm | cell | TTFT p50 ms | TTFT p90 ms | ITL p50 ms | ITL p90 ms | E2E p50 ms |\n|---|---|---|---|---|---|---|\n")
	for _, as := range s.Arms {
		for _, cn := range s.Cells {
			cs := s.PerCell[as.Arm][cn]
			fmt.Fprintf(&b, "| %s | %s | %.1f | %.1f | %.2f | %.2f | %.1f |\n", as.Arm, cn, cs.TTFTP50Ms.Median, cs.TTFTP90Ms.Median, cs.ITLP50Ms.Median, cs.ITLP90Ms.Median, cs.E2EP50Ms.Median)
		}
	}
	b.WriteString("\n## Noise\n\nRound-to-round spread of the baseline ((max−min)/median of output tokens/s):\n\n")
	for _, cn := range s.Cells {
		fmt.Fprintf(&b, "- %s: %.1f%%\n", cn, 100*s.BaselineSpread[cn])
	}
	if s.ParityTotal > 0 && s.ParityMode == ParityReport {
		fmt.Fprintf(&b, "\n## Parity (reported, not required)\n\nThe study says `parity: report`: %s. Per arm: the parity column above.\n", s.parityLine())
	} else if s.ParityTotal > 0 {
		fmt.Fprintf(&b, "\n## PARITY FAILURE\n\n**%d requests produced greedy tokens different from the baseline.**\n", s.ParityTotal)
	} else {
		b.WriteString("\n## Parity\n\nEvery arm produced exactly the baseline's greedy tokens on every request of every round (0 mismatches).\n")
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// readingIntervals explains the intervals; its round counts are the
// method's (MinBootstrapRounds).
var readingIntervals = fmt.Sprintf(`
## How to read the intervals

Every number below compares two arms measured back to back in the same round. A round's ratio
is arm/reference; the figure shown is the geometric mean of the rounds' ratios minus 1, and
[lo, hi] its 95%% confidence interval: a bootstrap over the paired rounds (expanded percentile)
from %d rounds on, Student's t on the log ratios with 2–%d rounds, none with 1 ("too few
rounds"). **A tie is an interval that contains 0**; an effect whose interval excludes 0 is a
gain or a loss at 95%% confidence. The A/A arm (the baseline against itself) shows how large a
difference the machine's noise alone produces.
`, MinBootstrapRounds, MinBootstrapRounds-1)

func (r *Result) mdGapTable(b *strings.Builder, s *Summary, metric, head string) {
	b.WriteString(head)
	fmt.Fprintf(b, "| arm | %s | geomean | parity | passes fired |\n|---|%s---|---|---|\n", strings.Join(s.Cells, " | "), strings.Repeat("---|", len(s.Cells)))
	for _, as := range s.Arms {
		var cols []string
		for _, cn := range s.Cells {
			cs := s.PerCell[as.Arm][cn]
			tps := cs.TokensPerS.Median
			if metric == MetricDevice && cs.DeviceTokensPerS != nil {
				tps = cs.DeviceTokensPerS.Median
			}
			if as.Kind == KindBaseline {
				cols = append(cols, fmt.Sprintf("%.1f", tps))
				continue
			}
			cols = append(cols, fmt.Sprintf("%.1f (%s)", tps, cellInterval(cs, metric)))
		}
		geo := armGeo(as, metric).String()
		if as.Kind == KindBaseline {
			geo = "(reference)"
		}
		par := "0"
		if as.Parity > 0 {
			par = fmt.Sprintf("**%d MISMATCHES**", as.Parity)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", as.Arm, strings.Join(cols, " | "), geo, par, strings.Join(as.Fired, ", "))
	}
}

// intervalBars draws one series of bars (effect in percent, from 0) with
// their 95% intervals as whiskers, in data coordinates: group g's bar sits
// at g + Offset.
type intervalBars struct {
	vals, lo, hi []float64 // percent; NaN: no interval
	offset, w    float64
	color        color.Color
}

func (ib *intervalBars) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	line := draw.LineStyle{Color: color.Black, Width: vg.Points(1)}
	for i, v := range ib.vals {
		x0, x1 := float64(i)+ib.offset-ib.w/2, float64(i)+ib.offset+ib.w/2
		pts := []vg.Point{{X: trX(x0), Y: trY(0)}, {X: trX(x1), Y: trY(0)}, {X: trX(x1), Y: trY(v)}, {X: trX(x0), Y: trY(v)}}
		c.FillPolygon(ib.color, c.ClipPolygonXY(pts))
		if math.IsNaN(ib.lo[i]) {
			continue
		}
		xm := trX(float64(i) + ib.offset)
		cw := (trX(x1) - trX(x0)) / 3
		c.StrokeLines(line, c.ClipLinesXY([]vg.Point{{X: xm, Y: trY(ib.lo[i])}, {X: xm, Y: trY(ib.hi[i])}})...)
		c.StrokeLines(line, c.ClipLinesXY([]vg.Point{{X: xm - cw, Y: trY(ib.lo[i])}, {X: xm + cw, Y: trY(ib.lo[i])}})...)
		c.StrokeLines(line, c.ClipLinesXY([]vg.Point{{X: xm - cw, Y: trY(ib.hi[i])}, {X: xm + cw, Y: trY(ib.hi[i])}})...)
	}
}

func (ib *intervalBars) DataRange() (xmin, xmax, ymin, ymax float64) {
	xmin, xmax = ib.offset-ib.w, float64(len(ib.vals)-1)+ib.offset+ib.w
	for i, v := range ib.vals {
		ymin, ymax = min(ymin, v), max(ymax, v)
		if !math.IsNaN(ib.lo[i]) {
			ymin, ymax = min(ymin, ib.lo[i]), max(ymax, ib.hi[i])
		}
	}
	return
}

// chartSeries is one legend entry: per group an interval.
type chartSeries struct {
	name string
	ivs  []Interval
}

// WriteChart draws one kind of comparison per cell and for the geometric
// mean, as grouped bars with their 95% intervals as error bars: kind is
// "add-one-in" or "leave-one-out" (per-pass contributions) or "arms"
// (all, A/A and explicit arms against the baseline). The format follows
// the file extension (.png or .svg). It returns false when the study has
// nothing of that kind.
func (r *Result) WriteChart(path, kind string, s *Summary) (bool, error) {
	var ss []chartSeries
	groups := append(append([]string(nil), s.Cells...), "geomean")
	ref := "baseline"
	switch kind {
	case KindAddOneIn, KindLeaveOneOut:
		if kind == KindLeaveOneOut {
			ref = "all passes"
		}
		for _, c := range s.Contributions {
			m, g, ok := c.AddOneIn, c.GeoAddOneIn, c.HasAOI
			if kind == KindLeaveOneOut {
				m, g, ok = c.LeaveOneOut, c.GeoLeaveOneOut, c.HasLOO
			}
			if !ok {
				continue
			}
			se := chartSeries{name: c.Pass}
			for _, cn := range s.Cells {
				se.ivs = append(se.ivs, m[cn])
			}
			se.ivs = append(se.ivs, g)
			ss = append(ss, se)
		}
	case "arms":
		for _, as := range s.Arms {
			if as.Kind != KindAll && as.Kind != KindAA && as.Kind != KindExplicit {
				continue
			}
			se := chartSeries{name: as.Arm}
			for _, cn := range s.Cells {
				se.ivs = append(se.ivs, s.PerCell[as.Arm][cn].Interval)
			}
			se.ivs = append(se.ivs, as.Geo)
			ss = append(ss, se)
		}
	default:
		return false, fmt.Errorf("chart kind %q: add-one-in, leave-one-out or arms", kind)
	}
	if len(ss) == 0 {
		return false, nil
	}
	p := plot.New()
	what := kind + " contribution"
	if kind == "arms" {
		what = "gap"
	}
	p.Title.Text = fmt.Sprintf("%s: %s to output tokens/s (vs %s), 95%% intervals", r.Study.Name, what, ref)
	p.Y.Label.Text = "gain (%)"
	w := 0.8 / float64(len(ss))
	// the axis fits the estimates and their intervals, except that whiskers
	// longer than three times the largest estimate (or 5 points) run off
	// the chart: a study of few rounds has intervals of hundreds of percent
	maxAbs := 0.0
	for _, se := range ss {
		for _, iv := range se.ivs {
			if iv.Rounds > 0 {
				maxAbs = max(maxAbs, math.Abs(100*iv.Effect()))
			}
		}
	}
	limit := max(3*maxAbs, 5)
	clipped := false
	lo, hi := 0.0, 0.0
	for i, se := range ss {
		ib := &intervalBars{offset: (float64(i) - float64(len(ss)-1)/2) * w, w: w * 0.9, color: plotutil.Color(i)}
		for _, iv := range se.ivs {
			v := 100 * iv.Effect()
			if iv.Rounds == 0 {
				v = 0
			}
			ib.vals = append(ib.vals, v)
			l, h := math.NaN(), math.NaN()
			if iv.Defined() {
				l, h = 100*(iv.Lo-1), 100*(iv.Hi-1)
			}
			ib.lo, ib.hi = append(ib.lo, l), append(ib.hi, h)
		}
		_, _, y0, y1 := ib.DataRange()
		clipped = clipped || y0 < -limit || y1 > limit
		lo, hi = min(lo, max(y0, -limit)), max(hi, min(y1, limit))
		p.Add(ib)
		p.Legend.Add(se.name, &legendBox{plotutil.Color(i)})
	}
	if clipped {
		p.Title.Text += " (whiskers clipped)"
	}
	p.Add(plotter.NewGrid())
	p.NominalX(groups...)
	span := hi - lo
	if span == 0 {
		span = 1
	}
	p.Y.Min, p.Y.Max = lo-0.05*span, hi+0.6*span // headroom for the legend
	p.X.Min, p.X.Max = -0.5, float64(len(groups))-0.5
	p.Legend.Top = true
	widthIn := max(8.0, 1.4*float64(len(groups)))
	return true, p.Save(vg.Length(widthIn)*vg.Inch, 5*vg.Inch, path)
}

// legendBox is a filled legend thumbnail.
type legendBox struct{ c color.Color }

func (l *legendBox) Thumbnail(c *draw.Canvas) {
	c.FillPolygon(l.c, []vg.Point{{X: c.Min.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Max.Y}, {X: c.Min.X, Y: c.Max.Y}})
}

// WriteAll writes results.jsonl (one row per measurement), intervals.jsonl
// (every interval), summary.json, report.md and the charts (gaps of the
// arms and per-pass contributions, with error bars) into dir, returning
// the files written.
func (r *Result) WriteAll(dir string) ([]string, *Summary, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	s := r.Summarize()
	files := []string{filepath.Join(dir, "results.jsonl"), filepath.Join(dir, "intervals.jsonl"), filepath.Join(dir, "summary.json"), filepath.Join(dir, "report.md")}
	if err := r.WriteJSONL(files[0]); err != nil {
		return nil, s, err
	}
	if err := r.WriteIntervals(files[1], s); err != nil {
		return nil, s, err
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, s, err
	}
	if err := os.WriteFile(files[2], b, 0o644); err != nil {
		return nil, s, err
	}
	var charts []string
	for _, kind := range []string{"arms", KindAddOneIn, KindLeaveOneOut} {
		name := "contributions-" + kind + ".png"
		if kind == "arms" {
			name = "gaps.png"
		}
		path := filepath.Join(dir, name)
		ok, err := r.WriteChart(path, kind, s)
		if err != nil {
			return nil, s, err
		}
		if ok {
			charts = append(charts, path)
			files = append(files, path)
		}
	}
	if err := r.WriteMarkdown(files[3], s, charts); err != nil {
		return nil, s, err
	}
	return files, s, nil
}

// parityLine says how many requests' greedy tokens differed from the
// baseline's, beside the A/A arm's (same configuration: the floor that
// batch composition alone gives).
func (s *Summary) parityLine() string {
	pct := func(n, of int) float64 {
		if of == 0 {
			return 0
		}
		return 100 * float64(n) / float64(of)
	}
	return fmt.Sprintf("%d of %d requests (%.1f%%) produced greedy tokens different from the baseline's; the A/A arm, the baseline's own configuration, %d of %d (%.1f%%)",
		s.ParityTotal, s.ParityRequests, pct(s.ParityTotal, s.ParityRequests), s.ParityAA, s.AARequests, pct(s.ParityAA, s.AARequests))
}
