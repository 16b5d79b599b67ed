package attrib

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

func pct(x float64) string {
	if x > -0.01 && x < 0.01 {
		return fmt.Sprintf("%+.1f%% (tie)", 100*x)
	}
	return fmt.Sprintf("%+.1f%%", 100*x)
}

// Console writes the campaign-shaped tables: per arm, cell | baseline | arm
// | gap; then the gap matrix with geometric means, the per-pass
// contributions, and parity (loudly when any request changed).
func (r *Result) Console(w io.Writer, s *Summary) {
	fmt.Fprintf(w, "study %s (%s level, %d measured rounds, %d warm-up)\n", r.Study.Name, r.Study.Level, r.Study.Repetitions, r.Study.Warmup)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, a := range r.Arms {
		if a.Kind == "baseline" {
			continue
		}
		fmt.Fprintf(tw, "\narm %s\t\t\t\t\n", a.Name)
		fmt.Fprintln(tw, "cell\tbaseline tok/s\tarm tok/s\tgap\tspread (arm)")
		for _, cn := range s.Cells {
			b, x := s.PerCell["baseline"][cn], s.PerCell[a.Name][cn]
			fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%s\t±%.0f%%\n", cn, b.TokensPerS.Median, x.TokensPerS.Median, pct(x.Gap), 50*x.TokensPerS.Spread)
		}
	}
	tw.Flush()
	fmt.Fprintln(w, "\ngap to baseline (paired per round, median), geometric mean across cells:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "arm\t%s\tgeomean\tparity\tfired\n", strings.Join(s.Cells, "\t"))
	for _, as := range s.Arms {
		var cols []string
		for _, cn := range s.Cells {
			cols = append(cols, pct(s.PerCell[as.Arm][cn].Gap))
		}
		par := "0"
		if as.Parity > 0 {
			par = fmt.Sprintf("%d MISMATCHES", as.Parity)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", as.Arm, strings.Join(cols, "\t"), pct(as.GeoGap), par, strings.Join(as.Fired, ","))
	}
	tw.Flush()
	if len(s.Contributions) > 0 {
		fmt.Fprintln(w, "\nper-pass contribution (leave-one-out = all/(all−p)−1, add-one-in = (baseline+p)/baseline−1), geomean over cells:")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "pass\tleave-one-out\tadd-one-in")
		for _, c := range s.Contributions {
			l, a := "n/a", "n/a"
			if c.HasLOO {
				l = pct(c.GeoLeaveOneOut)
			}
			if c.HasAOI {
				a = pct(c.GeoAddOneIn)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Pass, l, a)
		}
		tw.Flush()
	}
	if s.ParityTotal > 0 {
		fmt.Fprintf(w, "\n!!! PARITY FAILURE: %d requests produced greedy tokens different from baseline !!!\n", s.ParityTotal)
	} else {
		fmt.Fprintln(w, "\nparity: every arm produced the baseline's greedy tokens on every request (0 mismatches)")
	}
}

// WriteJSONL writes one row per measurement.
func (r *Result) WriteJSONL(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(f)
	enc := json.NewEncoder(bw)
	for _, row := range r.Rows {
		if err := enc.Encode(row); err != nil {
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
		fmt.Fprintf(&b, "- level: %s; model: %s\n- commit %s, %s (%d CPUs), %s, %s\n- %d measured rounds (paired, interleaved; arm order alternates), %d warm-up\n\n",
			st.Level, p.Model, p.Commit, p.CPU, p.CPUs, p.GoVersion, p.Date, st.Repetitions, st.Warmup)
	}
	b.WriteString("## Workloads\n\n| workload | input | output | requests | concurrency |\n|---|---|---|---|---|\n")
	for _, w := range st.Workloads {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %v |\n", w.Name, w.InputLen, w.OutputLen, w.Requests, w.Concurrency)
	}
	b.WriteString("\n## Gap to baseline per cell\n\nOutput tokens/s; gap = median over rounds of the paired ratio arm/baseline, minus 1.\n\n")
	fmt.Fprintf(&b, "| arm | %s | geomean | parity | passes fired |\n|---|%s---|---|---|\n", strings.Join(s.Cells, " | "), strings.Repeat("---|", len(s.Cells)))
	for _, as := range s.Arms {
		var cols []string
		for _, cn := range s.Cells {
			cs := s.PerCell[as.Arm][cn]
			cols = append(cols, fmt.Sprintf("%.1f (%s)", cs.TokensPerS.Median, pct(cs.Gap)))
		}
		par := "0"
		if as.Parity > 0 {
			par = fmt.Sprintf("**%d MISMATCHES**", as.Parity)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", as.Arm, strings.Join(cols, " | "), pct(as.GeoGap), par, strings.Join(as.Fired, ", "))
	}
	b.WriteString("\n## Latency (medians over rounds)\n\n| arm | cell | TTFT p50 ms | TTFT p90 ms | ITL p50 ms | ITL p90 ms | E2E p50 ms |\n|---|---|---|---|---|---|---|\n")
	for _, as := range s.Arms {
		for _, cn := range s.Cells {
			cs := s.PerCell[as.Arm][cn]
			fmt.Fprintf(&b, "| %s | %s | %.1f | %.1f | %.2f | %.2f | %.1f |\n", as.Arm, cn, cs.TTFTP50Ms.Median, cs.TTFTP90Ms.Median, cs.ITLP50Ms.Median, cs.ITLP90Ms.Median, cs.E2EP50Ms.Median)
		}
	}
	if len(s.Contributions) > 0 {
		b.WriteString("\n## Per-pass contributions\n\nleave-one-out = all / (all without the pass) − 1; add-one-in = (baseline + the pass) / baseline − 1.\n\n")
		fmt.Fprintf(&b, "| pass | kind | %s | geomean |\n|---|---|%s---|\n", strings.Join(s.Cells, " | "), strings.Repeat("---|", len(s.Cells)))
		for _, c := range s.Contributions {
			for _, kind := range []string{"leave-one-out", "add-one-in"} {
				m, g, ok := c.LeaveOneOut, c.GeoLeaveOneOut, c.HasLOO
				if kind == "add-one-in" {
					m, g, ok = c.AddOneIn, c.GeoAddOneIn, c.HasAOI
				}
				if !ok {
					continue
				}
				var cols []string
				for _, cn := range s.Cells {
					cols = append(cols, pct(m[cn]))
				}
				fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", c.Pass, kind, strings.Join(cols, " | "), pct(g))
			}
		}
		for _, c := range charts {
			fmt.Fprintf(&b, "\n![%s](%s)\n", strings.TrimSuffix(filepath.Base(c), ".png"), filepath.Base(c))
		}
	}
	b.WriteString("\n## Noise\n\nRound-to-round spread of the baseline ((max−min)/median of output tokens/s):\n\n")
	for _, cn := range s.Cells {
		fmt.Fprintf(&b, "- %s: %.1f%%\n", cn, 100*s.BaselineSpread[cn])
	}
	if s.ParityTotal > 0 {
		fmt.Fprintf(&b, "\n## PARITY FAILURE\n\n**%d requests produced greedy tokens different from the baseline.**\n", s.ParityTotal)
	} else {
		b.WriteString("\n## Parity\n\nEvery arm produced exactly the baseline's greedy tokens on every request of every round (0 mismatches).\n")
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// WriteChart draws one kind of per-pass contribution ("add-one-in" or
// "leave-one-out") per cell as grouped bars; the format follows the file
// extension (.png or .svg). It returns false when the study has no arms of
// that kind.
func (r *Result) WriteChart(path, kind string, s *Summary) (bool, error) {
	type series struct {
		name string
		vals plotter.Values
	}
	var ss []series
	lo, hi := 0.0, 0.0
	for _, c := range s.Contributions {
		m, ok := c.AddOneIn, c.HasAOI
		if kind == "leave-one-out" {
			m, ok = c.LeaveOneOut, c.HasLOO
		}
		if !ok {
			continue
		}
		vals := make(plotter.Values, len(s.Cells))
		for j, cn := range s.Cells {
			vals[j] = 100 * m[cn]
			lo, hi = min(lo, vals[j]), max(hi, vals[j])
		}
		ss = append(ss, series{c.Pass, vals})
	}
	if len(ss) == 0 {
		return false, nil
	}
	p := plot.New()
	ref := "baseline"
	if kind == "leave-one-out" {
		ref = "all passes"
	}
	p.Title.Text = fmt.Sprintf("%s: %s contribution to output tokens/s (vs %s)", r.Study.Name, kind, ref)
	p.Y.Label.Text = "gain (%)"
	widthIn := max(8.0, 1.6*float64(len(s.Cells)))
	group := vg.Length(widthIn*72*0.75) / vg.Length(len(s.Cells))
	w := group / vg.Length(len(ss)+1)
	for i, se := range ss {
		bc, err := plotter.NewBarChart(se.vals, w)
		if err != nil {
			return false, err
		}
		bc.Color = plotutil.Color(i)
		bc.LineStyle.Width = 0
		bc.Offset = vg.Length(float64(i)-float64(len(ss)-1)/2) * w
		p.Add(bc)
		p.Legend.Add(se.name, bc)
	}
	p.Add(plotter.NewGrid())
	p.NominalX(s.Cells...)
	span := hi - lo
	if span == 0 {
		span = 1
	}
	p.Y.Min, p.Y.Max = lo-0.05*span, hi+0.6*span // headroom for the legend
	p.Legend.Top = true
	return true, p.Save(vg.Length(widthIn)*vg.Inch, 5*vg.Inch, path)
}

// WriteAll writes results.jsonl, summary.json, report.md and the
// contribution charts (contributions-*.png) into dir, returning the files written.
func (r *Result) WriteAll(dir string) ([]string, *Summary, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	s := r.Summarize()
	files := []string{filepath.Join(dir, "results.jsonl"), filepath.Join(dir, "summary.json"), filepath.Join(dir, "report.md")}
	if err := r.WriteJSONL(files[0]); err != nil {
		return nil, s, err
	}
	b, _ := json.MarshalIndent(s, "", "  ")
	if err := os.WriteFile(files[1], b, 0o644); err != nil {
		return nil, s, err
	}
	var charts []string
	for _, kind := range []string{"add-one-in", "leave-one-out"} {
		path := filepath.Join(dir, "contributions-"+kind+".png")
		ok, err := r.WriteChart(path, kind, s)
		if err != nil {
			return nil, s, err
		}
		if ok {
			charts = append(charts, path)
			files = append(files, path)
		}
	}
	if err := r.WriteMarkdown(files[2], s, charts); err != nil {
		return nil, s, err
	}
	return files, s, nil
}
