package loadgen

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Record is one measured request.
type Record struct {
	Index int `json:"index"`
	// Scheduled is its arrival time after the benchmark's start (the
	// request-rate schedule); Sent when it was sent (later when the
	// concurrency limit held it back).
	Scheduled time.Duration `json:"-"`
	Sent      time.Duration `json:"-"`
	// TTFT is the time from the send to the first event with output; E2E to
	// the stream's end. Chunks are the output events' times after the send.
	TTFT   time.Duration   `json:"-"`
	E2E    time.Duration   `json:"-"`
	Chunks []time.Duration `json:"-"`
	// PromptTokens and OutputTokens come from the server's usage (the final
	// chunk) where it sent one (UsageReported), else from the planned
	// prompt length and the number of output events.
	PromptTokens  int    `json:"prompt_tokens"`
	OutputTokens  int    `json:"output_tokens"`
	UsageReported bool   `json:"usage_reported"`
	RequestedLen  int    `json:"requested_output_tokens"`
	FinishReason  string `json:"finish_reason,omitempty"`
	// Err is the failure's kind and message; "" for a completed request.
	ErrKind string `json:"error_kind,omitempty"`
	ErrMsg  string `json:"error,omitempty"`
	// Cancelled: the run stopped it (--max-errors reached, or interrupted)
	// before it ended; neither completed nor failed.
	Cancelled bool `json:"cancelled,omitempty"`
}

// OK reports whether the request completed.
func (r *Record) OK() bool { return r.ErrKind == "" && !r.Cancelled }

// TPOT is the time per output token after the first: (E2E − TTFT) /
// (OutputTokens − 1); ok is false for a request of fewer than 2 tokens.
func (r *Record) TPOT() (d time.Duration, ok bool) {
	if r.OutputTokens < 2 {
		return 0, false
	}
	return (r.E2E - r.TTFT) / time.Duration(r.OutputTokens-1), true
}

// ITLs are the gaps between consecutive output events.
func (r *Record) ITLs() []time.Duration {
	if len(r.Chunks) < 2 {
		return nil
	}
	out := make([]time.Duration, len(r.Chunks)-1)
	for i := 1; i < len(r.Chunks); i++ {
		out[i-1] = r.Chunks[i] - r.Chunks[i-1]
	}
	return out
}

// SLO is the service-level objective of goodput: a request is good when it
// completed within every bound that is set (0: not set).
type SLO struct {
	TTFT time.Duration `json:"-"`
	TPOT time.Duration `json:"-"`
	E2E  time.Duration `json:"-"`
}

// Set reports whether any bound is set.
func (s SLO) Set() bool { return s.TTFT > 0 || s.TPOT > 0 || s.E2E > 0 }

// Meets reports whether a completed request meets every bound (a request of
// one token has no TPOT and meets the TPOT bound, as in vLLM).
func (s SLO) Meets(r *Record) bool {
	if !r.OK() {
		return false
	}
	if s.TTFT > 0 && r.TTFT > s.TTFT {
		return false
	}
	if tp, ok := r.TPOT(); s.TPOT > 0 && ok && tp > s.TPOT {
		return false
	}
	return s.E2E <= 0 || r.E2E <= s.E2E
}

// ParseSLO reads "ttft_ms=500,tpot_ms=50,e2e_ms=10000" (any of the keys,
// positive milliseconds).
func ParseSLO(s string) (SLO, error) {
	var slo SLO
	if strings.TrimSpace(s) == "" {
		return slo, &FieldError{Field: "slo", Msg: "empty (want KEY=MS[,KEY=MS…] with keys ttft_ms, tpot_ms, e2e_ms)"}
	}
	seen := map[string]bool{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return slo, &FieldError{Field: "slo", Msg: fmt.Sprintf("%q: want KEY=MS (keys ttft_ms, tpot_ms, e2e_ms)", kv)}
		}
		ms, err := strconv.ParseFloat(v, 64)
		if err != nil || !(ms > 0) || math.IsInf(ms, 0) || ms > 1e9 {
			return slo, &FieldError{Field: "slo", Msg: fmt.Sprintf("%s: want milliseconds > 0 (at most 1e9), got %q", k, v)}
		}
		if seen[k] {
			return slo, &FieldError{Field: "slo", Msg: fmt.Sprintf("%s given twice", k)}
		}
		seen[k] = true
		d := time.Duration(ms * float64(time.Millisecond))
		switch k {
		case "ttft_ms":
			slo.TTFT = d
		case "tpot_ms":
			slo.TPOT = d
		case "e2e_ms":
			slo.E2E = d
		default:
			return slo, &FieldError{Field: "slo", Msg: fmt.Sprintf("unknown key %q (want ttft_ms, tpot_ms, e2e_ms)", k)}
		}
	}
	return slo, nil
}

// Dist summarizes a sample in milliseconds: mean, population standard
// deviation, and percentiles by linear interpolation between the closest
// ranks (NumPy's default, as sglang.bench_serving and vLLM report them).
type Dist struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean"`
	Std  float64 `json:"std"`
	Min  float64 `json:"min"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

// Summarize makes the Dist of a sample (zero with N 0 for none).
func Summarize(ds []time.Duration) Dist {
	if len(ds) == 0 {
		return Dist{}
	}
	xs := make([]float64, len(ds))
	for i, d := range ds {
		xs[i] = float64(d) / float64(time.Millisecond)
	}
	sort.Float64s(xs)
	var sum float64
	for _, x := range xs {
		sum += x
	}
	mean := sum / float64(len(xs))
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	return Dist{N: len(xs), Mean: mean, Std: math.Sqrt(ss / float64(len(xs))), Min: xs[0],
		P50: Percentile(xs, 50), P90: Percentile(xs, 90), P99: Percentile(xs, 99), Max: xs[len(xs)-1]}
}

// Percentile is the p-th percentile (0 ≤ p ≤ 100) of sorted xs, linearly
// interpolated between the closest ranks: rank h = (n−1)·p/100.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	h := float64(n-1) * p / 100
	lo := int(math.Floor(h))
	if lo >= n-1 {
		return sorted[n-1]
	}
	return sorted[lo] + (h-float64(lo))*(sorted[lo+1]-sorted[lo])
}

// Metrics are a run's figures over its completed requests.
type Metrics struct {
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
	Cancelled int `json:"cancelled"`
	// DurationS is the benchmark's duration: from its start (the first
	// send's schedule) to the end of its last request.
	DurationS    float64 `json:"duration_s"`
	InputTokens  int     `json:"input_tokens"`
	OutputTokens int     `json:"output_tokens"`
	// Throughputs over DurationS.
	RequestThroughput float64 `json:"request_throughput"`
	InputThroughput   float64 `json:"input_throughput"`
	OutputThroughput  float64 `json:"output_throughput"`
	TotalThroughput   float64 `json:"total_throughput"`
	// Concurrency is the mean number of requests in flight: Σ E2E /
	// DurationS.
	Concurrency float64 `json:"concurrency"`
	// OutputChunks is the number of output events; TokensPerChunk
	// OutputTokens / OutputChunks (above 1 when the server sends several
	// tokens in one event, as speculative decoding does).
	OutputChunks   int     `json:"output_chunks"`
	TokensPerChunk float64 `json:"tokens_per_chunk"`
	TTFT           Dist    `json:"ttft_ms"`
	TPOT           Dist    `json:"tpot_ms"`
	ITL            Dist    `json:"itl_ms"`
	E2E            Dist    `json:"e2e_ms"`
	// ClientWait is how long requests waited for the concurrency limit after
	// their scheduled arrival.
	ClientWait Dist `json:"client_wait_ms"`
	// Goodput: requests meeting every bound of the SLO, and their rate.
	Goodput *Goodput `json:"goodput,omitempty"`
	// UsageMissing counts completed requests whose stream had no usage
	// (their tokens were counted as output events).
	UsageMissing int `json:"usage_missing"`
	// LengthMismatch counts completed requests (with ignore_eos) whose
	// output tokens differ from what they asked for.
	LengthMismatch int            `json:"length_mismatch"`
	FinishReasons  map[string]int `json:"finish_reasons"`
}

// Goodput is the requests that met the SLO.
type Goodput struct {
	TTFTms float64 `json:"ttft_ms,omitempty"`
	TPOTms float64 `json:"tpot_ms,omitempty"`
	E2Ems  float64 `json:"e2e_ms,omitempty"`
	Good   int     `json:"good"`
	// Fraction is Good / completed + failed requests.
	Fraction float64 `json:"fraction"`
	// Rate is Good / DurationS (requests per second).
	Rate float64 `json:"rate"`
}

// Compute derives the run's figures from its records; duration is the
// benchmark's; ignoreEOS says whether the output lengths were forced (the
// mismatch count).
func Compute(recs []Record, duration time.Duration, slo SLO, ignoreEOS bool) Metrics {
	m := Metrics{DurationS: duration.Seconds(), FinishReasons: map[string]int{}}
	var ttft, tpot, itl, e2e, wait []time.Duration
	var sumE2E time.Duration
	for i := range recs {
		r := &recs[i]
		switch {
		case r.Cancelled:
			m.Cancelled++
			continue
		case !r.OK():
			m.Failed++
			continue
		}
		m.Completed++
		m.InputTokens += r.PromptTokens
		m.OutputTokens += r.OutputTokens
		m.OutputChunks += len(r.Chunks)
		if !r.UsageReported {
			m.UsageMissing++
		}
		if ignoreEOS && r.OutputTokens != r.RequestedLen {
			m.LengthMismatch++
		}
		if r.FinishReason != "" {
			m.FinishReasons[r.FinishReason]++
		}
		ttft = append(ttft, r.TTFT)
		e2e = append(e2e, r.E2E)
		sumE2E += r.E2E
		wait = append(wait, max(0, r.Sent-r.Scheduled))
		if d, ok := r.TPOT(); ok {
			tpot = append(tpot, d)
		}
		itl = append(itl, r.ITLs()...)
	}
	m.TTFT, m.TPOT, m.ITL, m.E2E, m.ClientWait = Summarize(ttft), Summarize(tpot), Summarize(itl), Summarize(e2e), Summarize(wait)
	if m.OutputChunks > 0 {
		m.TokensPerChunk = float64(m.OutputTokens) / float64(m.OutputChunks)
	}
	if s := m.DurationS; s > 0 {
		m.RequestThroughput = float64(m.Completed) / s
		m.InputThroughput = float64(m.InputTokens) / s
		m.OutputThroughput = float64(m.OutputTokens) / s
		m.TotalThroughput = float64(m.InputTokens+m.OutputTokens) / s
		m.Concurrency = sumE2E.Seconds() / s
	}
	if slo.Set() {
		g := &Goodput{TTFTms: ms(slo.TTFT), TPOTms: ms(slo.TPOT), E2Ems: ms(slo.E2E)}
		for i := range recs {
			if slo.Meets(&recs[i]) {
				g.Good++
			}
		}
		if n := m.Completed + m.Failed; n > 0 {
			g.Fraction = float64(g.Good) / float64(n)
		}
		if m.DurationS > 0 {
			g.Rate = float64(g.Good) / m.DurationS
		}
		m.Goodput = g
	}
	return m
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// sortedKeys returns a map's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
