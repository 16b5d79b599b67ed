package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// MaxConcurrency bounds Spec.Concurrency (and --concurrency).
const MaxConcurrency = 1 << 16

// Spec is one benchmark run.
type Spec struct {
	Client   *Client
	Endpoint Endpoint
	// Model is the "model" of every request.
	Model string
	// Requests are the measured requests; Warmup the ones sent before them
	// (all at once, at most Concurrency at a time), not measured.
	Requests []Request
	Warmup   []Request
	// Concurrency bounds the requests in flight (0: no bound).
	Concurrency int
	// RequestRate is the Poisson arrival rate (requests per second); +Inf
	// sends every request at once (then only Concurrency holds them back).
	RequestRate float64
	// Seed draws the arrival times.
	Seed        uint64
	IgnoreEOS   bool
	Temperature float64
	// ExtraBody are more keys of every request's body.
	ExtraBody map[string]json.RawMessage
	// Timeout bounds each request (0: none).
	Timeout time.Duration
	// MaxErrors stops the run once that many requests failed (0: never).
	MaxErrors int
	SLO       SLO
	// MetricsURL is the server's Prometheus endpoint ("": not read) and
	// MetricsFilter the regular expression of the series reported.
	MetricsURL    string
	MetricsFilter string
	// Progress is told of every request that ended (done of total).
	Progress func(done, total int)
	// Clock is the time since an arbitrary origin (nil: the monotonic
	// clock); tests drive it to make the measurement exact.
	Clock func() time.Duration
	Log   zerolog.Logger
}

// Check refuses a spec that makes no sense, naming the option.
func (s *Spec) Check() error {
	switch {
	case s.Client == nil:
		return fmt.Errorf("loadgen: no client")
	case s.Endpoint != Completions && s.Endpoint != Chat:
		return &FieldError{Field: "endpoint", Msg: fmt.Sprintf("must be completions or chat, got %q", s.Endpoint)}
	case len(s.Requests) == 0:
		return &FieldError{Field: "num-prompts", Msg: "no requests"}
	case s.Concurrency < 0 || s.Concurrency > MaxConcurrency:
		return &FieldError{Field: "concurrency", Msg: fmt.Sprintf("must be in [0, %d] (0: no bound), got %d", MaxConcurrency, s.Concurrency)}
	case !(s.RequestRate > 0):
		return &FieldError{Field: "request-rate", Msg: fmt.Sprintf("must be > 0 requests/s or inf, got %v", s.RequestRate)}
	case s.Timeout < 0:
		return &FieldError{Field: "timeout", Msg: fmt.Sprintf("must be ≥ 0 (0: none), got %s", s.Timeout)}
	case s.MaxErrors < 0:
		return &FieldError{Field: "max-errors", Msg: fmt.Sprintf("must be ≥ 0 (0: no limit), got %d", s.MaxErrors)}
	case !(s.Temperature >= 0) || math.IsInf(s.Temperature, 0):
		return &FieldError{Field: "temperature", Msg: fmt.Sprintf("must be ≥ 0, got %v", s.Temperature)}
	}
	if _, err := regexp.Compile(s.filter()); err != nil {
		return &FieldError{Field: "metrics-filter", Msg: err.Error()}
	}
	for j, rs := range [][]Request{s.Warmup, s.Requests} {
		for i := range rs {
			if _, err := Body(s.Endpoint, s.Model, &rs[i], s.Temperature, s.IgnoreEOS, s.ExtraBody); err != nil {
				var fe *FieldError
				if errors.As(err, &fe) {
					return err
				}
				return fmt.Errorf("%s %d (of %d): %w", [...]string{"warm-up request", "request"}[j], i+1, len(rs), err)
			}
		}
	}
	return nil
}

// clock returns the spec's clock as the time since now.
func (s *Spec) clock() func() time.Duration {
	if s.Clock == nil {
		t0 := time.Now()
		return func() time.Duration { return time.Since(t0) }
	}
	t0 := s.Clock()
	return func() time.Duration { return s.Clock() - t0 }
}

func (s *Spec) filter() string {
	if s.MetricsFilter == "" {
		return DefaultMetricsFilter
	}
	return s.MetricsFilter
}

// Result is a run's outcome (the JSON of --output; docs/bench-serve.md
// documents it).
type Result struct {
	Metrics
	// Aborted says why the run stopped before its last request ("" when it
	// did not).
	Aborted string `json:"aborted,omitempty"`
	// Errors are the failures by kind, with the first messages of each.
	Errors        map[string]*ErrorKind `json:"errors"`
	ServerMetrics *ServerMetrics        `json:"server_metrics,omitempty"`
	Records       []Record              `json:"-"`
}

// ErrorKind counts the failures of one kind.
type ErrorKind struct {
	Count    int      `json:"count"`
	Examples []string `json:"examples"`
}

// MetricsSettle is how long the scrapes wait after the last stream ended:
// a server may count a step's tokens after it has streamed them (glmflash
// does, once per step), so a scrape at once could miss the last step.
const MetricsSettle = 200 * time.Millisecond

// examplesPerKind is how many messages of each error kind a result keeps.
const examplesPerKind = 3

// Run warms the server up, reads its metrics, sends the requests by the
// spec's schedule and concurrency, reads the metrics again and computes the
// figures. It returns an error only when nothing can be measured (a failed
// warm-up); failed requests are in the result. A cancelled ctx stops the
// run: the requests in flight are cancelled and the result says so.
func Run(ctx context.Context, s Spec) (*Result, error) {
	if err := s.Check(); err != nil {
		return nil, err
	}
	filter := regexp.MustCompile(s.filter())
	if len(s.Warmup) > 0 {
		if err := s.warmup(ctx); err != nil {
			return nil, err
		}
	}
	res := &Result{Errors: map[string]*ErrorKind{}}
	var before map[string]sample
	if s.MetricsURL != "" {
		res.ServerMetrics = &ServerMetrics{URL: s.MetricsURL, Filter: filter.String()}
		if len(s.Warmup) > 0 {
			settle(ctx)
		}
		var err error
		if before, err = s.Client.scrape(ctx, s.MetricsURL, filter); err != nil {
			res.ServerMetrics.Error = "before the run: " + err.Error()
			s.Log.Warn().Err(err).Str("url", s.MetricsURL).Msg("the server's metrics cannot be read; the run goes on without them")
		}
	}
	recs, dur, aborted := s.measure(ctx)
	res.Records, res.Aborted = recs, aborted
	if s.MetricsURL != "" && res.ServerMetrics.Error == "" {
		settle(ctx)
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		after, err := s.Client.scrape(sctx, s.MetricsURL, filter)
		cancel()
		if err != nil {
			res.ServerMetrics.Error = "after the run: " + err.Error()
			s.Log.Warn().Err(err).Str("url", s.MetricsURL).Msg("the server's metrics cannot be read after the run")
		} else {
			res.ServerMetrics.Series = diffMetrics(before, after)
		}
	}
	res.Metrics = Compute(recs, dur, s.SLO, s.IgnoreEOS)
	for i := range recs {
		r := &recs[i]
		if r.OK() || r.Cancelled {
			continue
		}
		k := res.Errors[r.ErrKind]
		if k == nil {
			k = &ErrorKind{Examples: []string{}}
			res.Errors[r.ErrKind] = k
		}
		k.Count++
		if len(k.Examples) < examplesPerKind {
			k.Examples = append(k.Examples, fmt.Sprintf("request %d: %s", r.Index, r.ErrMsg))
		}
	}
	return res, nil
}

// settle waits MetricsSettle (less when ctx ends).
func settle(ctx context.Context) {
	t := time.NewTimer(MetricsSettle)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// warmup sends the warm-up requests (at most Concurrency at a time); any
// failure fails the run: the server does not answer as a benchmark needs.
func (s *Spec) warmup(ctx context.Context) error {
	t0 := time.Now()
	now := s.clock()
	limit := len(s.Warmup)
	if s.Concurrency > 0 {
		limit = min(limit, s.Concurrency)
	}
	sem := make(chan struct{}, limit)
	recs := make([]Record, len(s.Warmup))
	var wg sync.WaitGroup
	for i := range s.Warmup {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			s.one(ctx, i, &s.Warmup[i], now, &recs[i])
		}()
	}
	wg.Wait()
	for i := range recs {
		if r := &recs[i]; !r.OK() {
			if r.Cancelled {
				return fmt.Errorf("warm-up request %d: cancelled", i)
			}
			return fmt.Errorf("warm-up request %d failed (%s): %s", i, r.ErrKind, r.ErrMsg)
		}
	}
	s.Log.Info().Int("requests", len(recs)).Dur("took", time.Since(t0)).Msg("warm-up done")
	return nil
}

// one sends request i and fills its record.
func (s *Spec) one(ctx context.Context, i int, r *Request, now func() time.Duration, rec *Record) {
	rec.Index, rec.RequestedLen, rec.PromptTokens = i, r.OutputLen, r.PromptLen
	body, err := Body(s.Endpoint, s.Model, r, s.Temperature, s.IgnoreEOS, s.ExtraBody)
	if err != nil { // Check built every body already
		rec.ErrKind, rec.ErrMsg = "request", err.Error()
		return
	}
	s.Client.stream(ctx, s.Endpoint, body, s.Timeout, now, rec)
}

// measure sends the requests and returns their records, the benchmark's
// duration and why it stopped early ("" when it did not).
func (s *Spec) measure(ctx context.Context) ([]Record, time.Duration, string) {
	arrivals := Arrivals(len(s.Requests), s.RequestRate, s.Seed)
	recs := make([]Record, len(s.Requests))
	launched := make([]bool, len(s.Requests))
	for i := range recs {
		recs[i].Index, recs[i].Scheduled = i, arrivals[i]
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	var (
		mu      sync.Mutex
		done    int
		failed  int
		aborted string
		wg      sync.WaitGroup
	)
	var sem chan struct{}
	if s.Concurrency > 0 {
		sem = make(chan struct{}, s.Concurrency)
	}
	now := s.clock()
	s.Log.Info().Int("requests", len(s.Requests)).Int("concurrency", s.Concurrency).Float64("request_rate", s.RequestRate).
		Str("endpoint", s.Endpoint.Path()).Str("model", s.Model).Msg("benchmark started")
	finish := func(rec *Record) {
		mu.Lock()
		done++
		if !rec.OK() && !rec.Cancelled {
			failed++
			s.Log.Debug().Int("request", rec.Index).Str("kind", rec.ErrKind).Str("error", rec.ErrMsg).Msg("request failed")
			if s.MaxErrors > 0 && failed >= s.MaxErrors && aborted == "" {
				aborted = fmt.Sprintf("--max-errors %d reached", s.MaxErrors)
				stop()
			}
		}
		d := done
		mu.Unlock()
		if s.Progress != nil {
			s.Progress(d, len(s.Requests))
		}
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
loop:
	for i := range s.Requests {
		rec := &recs[i]
		if wait := arrivals[i] - now(); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-rctx.Done():
				break loop
			}
		}
		if sem != nil {
			select {
			case sem <- struct{}{}:
			case <-rctx.Done():
				break loop
			}
		}
		if rctx.Err() != nil {
			if sem != nil {
				<-sem
			}
			break loop
		}
		launched[i] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			if sem != nil {
				defer func() { <-sem }()
			}
			s.one(rctx, i, &s.Requests[i], now, rec)
			finish(rec)
		}()
	}
	wg.Wait()
	dur := now()
	// requests never sent (the run stopped first) are cancelled
	for i := range recs {
		if !launched[i] {
			recs[i].Index, recs[i].RequestedLen, recs[i].PromptTokens = i, s.Requests[i].OutputLen, s.Requests[i].PromptLen
			recs[i].Cancelled = true
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if aborted == "" && ctx.Err() != nil {
		aborted = "interrupted: " + context.Cause(ctx).Error()
	}
	s.Log.Info().Dur("duration", dur).Int("failed", failed).Str("aborted", aborted).Msg("benchmark ended")
	return recs, dur, aborted
}
