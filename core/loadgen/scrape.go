package loadgen

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"sort"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// DefaultMetricsFilter selects the series of glmflash, vLLM and SGLang (the
// process's CPU seconds too); other series (go_*, the rest of process_*)
// are left out unless --metrics-filter says otherwise.
const DefaultMetricsFilter = `^(glmflash_|vllm:|sglang:|process_cpu_seconds_total$)`

// sample is one series' value at a scrape.
type sample struct {
	name, typ string
	labels    map[string]string
	value     float64
}

// Series is one series of the server's metrics, before and after the run.
// Counters (and a histogram's or summary's _count and _sum) have a Delta;
// a series absent before counts from 0 when it is a counter, and has no
// Before when it is a gauge.
type Series struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
	Type   string            `json:"type"`
	Before *float64          `json:"before,omitempty"`
	After  float64           `json:"after"`
	Delta  *float64          `json:"delta,omitempty"`
}

// ServerMetrics is the server's Prometheus metrics around the run.
type ServerMetrics struct {
	URL    string `json:"url"`
	Filter string `json:"filter"`
	// Error says why the metrics could not be read (the run goes on
	// without them).
	Error  string   `json:"error,omitempty"`
	Series []Series `json:"series,omitempty"`
}

// scrape reads a Prometheus text exposition (the samples whose name
// matches filter).
func (c *Client) scrape(ctx context.Context, url string, filter *regexp.Regexp) (map[string]sample, error) {
	req, err := c.newRequest(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("GET %s: HTTP %d: %s", url, resp.StatusCode, bodyMessage(b))
	}
	return parseMetrics(io.LimitReader(resp.Body, 64<<20), filter)
}

// parseMetrics reads the text format into samples keyed by name and
// labels; histograms and summaries give their _count and _sum.
func parseMetrics(r io.Reader, filter *regexp.Regexp) (map[string]sample, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("the metrics are not in the Prometheus text format: %w", err)
	}
	out := map[string]sample{}
	add := func(name, typ string, m *dto.Metric, v float64) {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		s := sample{name: name, typ: typ, labels: labels, value: v}
		out[seriesKey(name, labels)] = s
	}
	for name, f := range fams {
		if !filter.MatchString(name) {
			continue
		}
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				add(name, "counter", m, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				add(name, "gauge", m, m.GetGauge().GetValue())
			case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
				add(name+"_count", "histogram", m, float64(m.GetHistogram().GetSampleCount()))
				add(name+"_sum", "histogram", m, m.GetHistogram().GetSampleSum())
			case dto.MetricType_SUMMARY:
				add(name+"_count", "summary", m, float64(m.GetSummary().GetSampleCount()))
				add(name+"_sum", "summary", m, m.GetSummary().GetSampleSum())
			case dto.MetricType_UNTYPED:
				add(name, "untyped", m, m.GetUntyped().GetValue())
			}
		}
	}
	return out, nil
}

func seriesKey(name string, labels map[string]string) string {
	ks := sortedKeys(labels)
	var b strings.Builder
	b.WriteString(name)
	for _, k := range ks {
		fmt.Fprintf(&b, "|%s=%q", k, labels[k])
	}
	return b.String()
}

// diffMetrics pairs the scrapes: every series after the run, with its value
// before and the delta of the cumulative ones.
func diffMetrics(before, after map[string]sample) []Series {
	var out []Series
	for k, a := range after {
		s := Series{Name: a.name, Labels: a.labels, Type: a.typ, After: a.value}
		if len(s.Labels) == 0 {
			s.Labels = nil
		}
		b, had := before[k]
		if had {
			v := b.value
			s.Before = &v
		}
		switch a.typ {
		case "counter", "histogram", "summary":
			d := a.value
			if had {
				d -= b.value
			}
			s.Delta = &d
		case "gauge", "untyped":
			if had {
				d := a.value - b.value
				s.Delta = &d
			}
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		return seriesKey(out[i].Name, out[i].Labels) < seriesKey(out[j].Name, out[j].Labels)
	})
	return out
}
