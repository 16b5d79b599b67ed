package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Schema names the JSON document's version (docs/bench-serve.md).
const Schema = "glmflash.bench-serve/v1"

// Setup says what was run, for the report.
type Setup struct {
	BaseURL  string `json:"base_url"`
	Endpoint string `json:"endpoint"`
	Model    string `json:"model"`
	// Dataset is "random" or the JSONL file's path.
	Dataset    string  `json:"dataset"`
	InputLen   int     `json:"input_len,omitempty"`
	OutputLen  int     `json:"output_len,omitempty"`
	RangeRatio float64 `json:"range_ratio,omitempty"`
	VocabSize  int     `json:"vocab_size,omitempty"`
	// PromptFormat is ids or text.
	PromptFormat string `json:"prompt_format"`
	NumPrompts   int    `json:"num_prompts"`
	Warmup       int    `json:"warmup_requests"`
	Concurrency  int    `json:"concurrency"`
	// RequestRate is requests/s, or the string "inf".
	RequestRate json.RawMessage `json:"request_rate"`
	Seed        uint64          `json:"seed"`
	IgnoreEOS   bool            `json:"ignore_eos"`
	Temperature float64         `json:"temperature"`
	TimeoutS    float64         `json:"timeout_s"`
	MaxErrors   int             `json:"max_errors"`
	// Served is the glmflash configuration --serve started ("" when the run
	// pointed at a server).
	Served string `json:"served,omitempty"`
}

// RateJSON spells a request rate for Setup.RequestRate.
func RateJSON(rate float64) json.RawMessage {
	if math.IsInf(rate, 1) {
		return json.RawMessage(`"inf"`)
	}
	return json.RawMessage(strconv.FormatFloat(rate, 'g', -1, 64))
}

// Report is the JSON document of a run.
type Report struct {
	Schema    string `json:"schema"`
	Tool      string `json:"tool"`
	StartedAt string `json:"started_at"`
	Setup     Setup  `json:"setup"`
	*Result
	// Requests are the per-request records (--output-requests).
	Requests []RequestJSON `json:"requests,omitempty"`
}

// RequestJSON is one request's record in the report, times in ms.
type RequestJSON struct {
	Record
	ScheduledMS float64   `json:"scheduled_ms"`
	SentMS      float64   `json:"sent_ms"`
	TTFTMS      float64   `json:"ttft_ms"`
	E2EMS       float64   `json:"e2e_ms"`
	TPOTMS      *float64  `json:"tpot_ms,omitempty"`
	ITLMS       []float64 `json:"itl_ms"`
}

// NewReport makes the document; withRequests adds the records.
func NewReport(tool string, started time.Time, setup Setup, r *Result, withRequests bool) *Report {
	rep := &Report{Schema: Schema, Tool: tool, StartedAt: started.UTC().Format(time.RFC3339), Setup: setup, Result: r}
	if withRequests {
		for _, rec := range r.Records {
			j := RequestJSON{Record: rec, ScheduledMS: ms(rec.Scheduled), SentMS: ms(rec.Sent), TTFTMS: ms(rec.TTFT), E2EMS: ms(rec.E2E), ITLMS: []float64{}}
			if d, ok := rec.TPOT(); ok && rec.OK() {
				v := ms(d)
				j.TPOTMS = &v
			}
			for _, g := range rec.ITLs() {
				j.ITLMS = append(j.ITLMS, ms(g))
			}
			rep.Requests = append(rep.Requests, j)
		}
	}
	return rep
}

// JSON is the document, indented.
func (r *Report) JSON() ([]byte, error) { return json.MarshalIndent(r, "", "  ") }

// WriteText writes the report as a table.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	line := func(title string) {
		pad := max(0, 60-len(title)-2)
		fmt.Fprintf(&b, "%s %s %s\n", strings.Repeat("=", pad/2), title, strings.Repeat("=", pad-pad/2))
	}
	kv := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	s, m := r.Setup, r.Metrics
	line("Serving benchmark (glmflash bench serve)")
	fmt.Fprintf(kv, "Server:\t%s%s (model %s)\n", s.BaseURL, Endpoint(s.Endpoint).Path(), s.Model)
	work := s.Dataset
	if s.Dataset == "random" {
		work = fmt.Sprintf("random, input %d, output %d, range ratio %g, %s prompts", s.InputLen, s.OutputLen, s.RangeRatio, s.PromptFormat)
	}
	fmt.Fprintf(kv, "Workload:\t%s\n", work)
	conc := "unbounded"
	if s.Concurrency > 0 {
		conc = strconv.Itoa(s.Concurrency)
	}
	fmt.Fprintf(kv, "Concurrency (limit / achieved):\t%s / %.2f\n", conc, m.Concurrency)
	fmt.Fprintf(kv, "Request rate (req/s):\t%s\n", strings.Trim(string(s.RequestRate), `"`))
	fmt.Fprintf(kv, "Requests (completed / failed / cancelled):\t%d / %d / %d of %d (+%d warm-up)\n", m.Completed, m.Failed, m.Cancelled, s.NumPrompts, s.Warmup)
	if r.Aborted != "" {
		fmt.Fprintf(kv, "ABORTED:\t%s\n", r.Aborted)
	}
	fmt.Fprintf(kv, "Benchmark duration (s):\t%.3f\n", m.DurationS)
	fmt.Fprintf(kv, "Input / output tokens:\t%d / %d\n", m.InputTokens, m.OutputTokens)
	fmt.Fprintf(kv, "Request throughput (req/s):\t%.3f\n", m.RequestThroughput)
	fmt.Fprintf(kv, "Input token throughput (tok/s):\t%.2f\n", m.InputThroughput)
	fmt.Fprintf(kv, "Output token throughput (tok/s):\t%.2f\n", m.OutputThroughput)
	fmt.Fprintf(kv, "Total token throughput (tok/s):\t%.2f\n", m.TotalThroughput)
	fmt.Fprintf(kv, "Output tokens per event:\t%.3f\n", m.TokensPerChunk)
	if g := m.Goodput; g != nil {
		var bounds []string
		for _, x := range []struct {
			n string
			v float64
		}{{"TTFT", g.TTFTms}, {"TPOT", g.TPOTms}, {"E2E", g.E2Ems}} {
			if x.v > 0 {
				bounds = append(bounds, fmt.Sprintf("%s ≤ %g ms", x.n, x.v))
			}
		}
		fmt.Fprintf(kv, "Goodput (req/s):\t%.3f (%d good, %.1f%%; %s)\n", g.Rate, g.Good, 100*g.Fraction, strings.Join(bounds, ", "))
	}
	if m.UsageMissing > 0 {
		fmt.Fprintf(kv, "Streams without usage:\t%d (their output tokens are counted as events)\n", m.UsageMissing)
	}
	if m.LengthMismatch > 0 {
		fmt.Fprintf(kv, "Output length ≠ requested:\t%d (does the server honour ignore_eos?)\n", m.LengthMismatch)
	}
	if len(m.FinishReasons) > 0 {
		var fr []string
		for _, k := range sortedKeys(m.FinishReasons) {
			fr = append(fr, fmt.Sprintf("%s %d", k, m.FinishReasons[k]))
		}
		fmt.Fprintf(kv, "Finish reasons:\t%s\n", strings.Join(fr, ", "))
	}
	kv.Flush()
	line("Latency (ms)")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "\tn\tmean\tstd\tp50\tp90\tp99\tmax\t\n")
	for _, d := range []struct {
		name string
		d    Dist
	}{{"TTFT", m.TTFT}, {"TPOT", m.TPOT}, {"ITL", m.ITL}, {"E2E", m.E2E}, {"client wait", m.ClientWait}} {
		if d.d.N == 0 {
			fmt.Fprintf(tw, "%s\t0\t—\t—\t—\t—\t—\t—\t\n", d.name)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", d.name, d.d.N, d.d.Mean, d.d.Std, d.d.P50, d.d.P90, d.d.P99, d.d.Max)
	}
	tw.Flush()
	if len(r.Errors) > 0 {
		line("Errors")
		for _, k := range sortedKeys(r.Errors) {
			e := r.Errors[k]
			fmt.Fprintf(&b, "%s: %d\n", k, e.Count)
			for _, x := range e.Examples {
				fmt.Fprintf(&b, "    %s\n", clip(x, 300))
			}
		}
	}
	if sm := r.ServerMetrics; sm != nil {
		line("Server metrics (after − before)")
		if sm.Error != "" {
			fmt.Fprintf(&b, "not read: %s\n", sm.Error)
		}
		mw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		shown := 0
		for _, se := range sm.Series {
			if se.Delta == nil || *se.Delta == 0 {
				continue
			}
			shown++
			fmt.Fprintf(mw, "%s\t%s\n", seriesText(se), strconv.FormatFloat(*se.Delta, 'g', 8, 64))
		}
		mw.Flush()
		if shown == 0 && sm.Error == "" {
			fmt.Fprintf(&b, "no series of %s changed\n", sm.Filter)
		}
	}
	b.WriteString(strings.Repeat("=", 60) + "\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func seriesText(s Series) string {
	if len(s.Labels) == 0 {
		return s.Name
	}
	var ls []string
	for _, k := range sortedKeys(s.Labels) {
		ls = append(ls, fmt.Sprintf("%s=%q", k, s.Labels[k]))
	}
	return s.Name + "{" + strings.Join(ls, ",") + "}"
}
