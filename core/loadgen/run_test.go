package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// behaviour scripts one request of the fake server (chosen by the prompt's
// first token id).
type behaviour struct {
	status   int           // ≠ 0: answer this status with an OpenAI error
	ttft     time.Duration // before the first output event
	itl      time.Duration // between output events
	events   int           // output events
	perEvent int           // tokens per event (usage counts events × perEvent)
	noUsage  bool          // no usage chunk
	cut      int           // > 0: the connection breaks after this many events
	errEvent bool          // an error event after the output
	plain    bool          // a JSON answer, not a stream
	hang     bool          // never answers (until the client goes)
}

// fakeServer is an OpenAI completions server whose requests follow
// scripts; it records the bodies and the peak concurrency.
type fakeServer struct {
	*httptest.Server
	scripts  map[int32]behaviour
	mu       sync.Mutex
	bodies   []map[string]any
	inflight atomic.Int32
	peak     atomic.Int32
	metrics  atomic.Int32 // /metrics scrapes
	tokens   atomic.Int64 // tokens sent (the fake counter)
}

func newFakeServer(t *testing.T, scripts map[int32]behaviour) *fakeServer {
	f := &fakeServer{scripts: scripts}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", f.completions)
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"object":"list","data":[{"id":"fake","object":"model","max_model_len":4096,"vocab_size":300}]}`)
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		n := f.metrics.Add(1)
		fmt.Fprintf(w, "# TYPE glmflash_generated_tokens_total counter\nglmflash_generated_tokens_total %d\n", f.tokens.Load())
		fmt.Fprintf(w, "# TYPE glmflash_requests_total counter\nglmflash_requests_total{status=\"length\"} %d\n", 10*n)
		fmt.Fprint(w, "# TYPE glmflash_running_requests gauge\nglmflash_running_requests 0\n")
		fmt.Fprintf(w, "# TYPE glmflash_time_to_first_token_seconds histogram\nglmflash_time_to_first_token_seconds_bucket{le=\"+Inf\"} %d\nglmflash_time_to_first_token_seconds_sum %d.5\nglmflash_time_to_first_token_seconds_count %d\n", n, n, n)
		fmt.Fprint(w, "# TYPE go_goroutines gauge\ngo_goroutines 7\n")
	})
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

func (f *fakeServer) completions(w http.ResponseWriter, r *http.Request) {
	n := f.inflight.Add(1)
	var once sync.Once
	leave := func() { once.Do(func() { f.inflight.Add(-1) }) } // before the last byte: the client may send its next request at once
	defer leave()
	for {
		p := f.peak.Load()
		if n <= p || f.peak.CompareAndSwap(p, n) {
			break
		}
	}
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	f.mu.Unlock()
	ids, _ := body["prompt"].([]any)
	var key int32
	if len(ids) > 0 {
		key = int32(ids[0].(float64))
	}
	b := f.scripts[key]
	switch {
	case b.hang:
		<-r.Context().Done()
		return
	case b.status != 0:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(b.status)
		fmt.Fprintf(w, `{"error":{"message":"scripted failure %d","type":"server_error"}}`, b.status)
		return
	case b.plain:
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"text":"abc","finish_reason":"length"}]}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	send := func(s string) {
		fmt.Fprintf(w, "data: %s\n\n", s)
		fl.Flush()
	}
	time.Sleep(b.ttft)
	for i := 0; i < b.events; i++ {
		if i > 0 {
			time.Sleep(b.itl)
		}
		if b.cut > 0 && i == b.cut {
			panic(http.ErrAbortHandler) // the connection breaks
		}
		send(fmt.Sprintf(`{"choices":[{"index":0,"text":%q,"finish_reason":null}]}`, strings.Repeat("x", max(1, b.perEvent))))
		f.tokens.Add(int64(max(1, b.perEvent)))
	}
	if b.errEvent {
		leave()
		send(`{"error":{"message":"generation failed: scripted","type":"server_error"}}`)
		fmt.Fprint(w, "data: [DONE]\n\n")
		return
	}
	send(`{"choices":[{"index":0,"text":"","finish_reason":"length"}]}`)
	if !b.noUsage {
		send(fmt.Sprintf(`{"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d}}`, len(ids), b.events*max(1, b.perEvent)))
	}
	leave()
	send("[DONE]")
}

// requests makes n requests whose first id picks the script.
func requests(keys ...int32) []Request {
	out := make([]Request, len(keys))
	for i, k := range keys {
		out[i] = Request{PromptIDs: []int32{k, 1, 2, 3}, PromptLen: 4, OutputLen: 6}
	}
	return out
}

// A run against scripted streams: every request completes, the concurrency
// bound holds, the bodies ask for what the benchmark needs, the measured
// times are the scripted ones (sleeps never end early; the slack bounds how
// late), goodput separates the fast requests from the slow, and the
// server's counters are reported as deltas.
func TestRunMeasuresScriptedStreams(t *testing.T) {
	fast := behaviour{ttft: 20 * ms_, itl: 30 * ms_, events: 3, perEvent: 2}
	slow := behaviour{ttft: 400 * ms_, itl: 30 * ms_, events: 3, perEvent: 2}
	f := newFakeServer(t, map[int32]behaviour{1: fast, 2: slow})
	c := NewClient(f.URL, "sk-test", 4)
	defer c.CloseIdle()
	var progress []int
	var pmu sync.Mutex
	res, err := Run(context.Background(), Spec{
		Client: c, Endpoint: Completions, Model: "fake",
		Requests: requests(1, 2, 1, 1, 2, 1), Warmup: requests(1), Concurrency: 2, RequestRate: math.Inf(1),
		IgnoreEOS: true, SLO: SLO{TTFT: 200 * ms_}, MetricsURL: f.URL + "/metrics",
		Progress: func(done, total int) {
			pmu.Lock()
			progress = append(progress, done)
			pmu.Unlock()
			require.Equal(t, 6, total)
		},
		Log: zerolog.Nop(),
	})
	require.NoError(t, err)
	require.Equal(t, 6, res.Completed)
	require.Zero(t, res.Failed)
	require.Empty(t, res.Errors)
	require.Equal(t, []int{1, 2, 3, 4, 5, 6}, progress)
	require.EqualValues(t, 2, f.peak.Load(), "--concurrency 2")
	require.Len(t, f.bodies, 7, "one warm-up and six requests")
	b := f.bodies[0] // the warm-up, sent alone
	require.Equal(t, "fake", b["model"])
	require.Equal(t, true, b["stream"])
	require.Equal(t, true, b["ignore_eos"])
	require.Equal(t, map[string]any{"include_usage": true}, b["stream_options"])
	require.EqualValues(t, 6, b["max_tokens"])
	require.EqualValues(t, 0, b["temperature"])
	require.Equal(t, []any{1.0, 1.0, 2.0, 3.0}, b["prompt"])

	require.Equal(t, 6*6, res.OutputTokens, "usage: 3 events × 2 tokens")
	require.Equal(t, 6*3, res.OutputChunks)
	require.InDelta(t, 2, res.TokensPerChunk, 1e-12)
	require.Equal(t, 6*4, res.InputTokens)
	require.Equal(t, 6*2, res.ITL.N, "two gaps per request")
	require.Equal(t, 6, res.TPOT.N)
	require.Zero(t, res.LengthMismatch, "6 tokens asked, 3 events × 2 tokens given")
	const slack = 150 * ms_
	for _, r := range res.Records {
		want := fast
		if r.Index == 1 || r.Index == 4 {
			want = slow
		}
		require.GreaterOrEqual(t, r.TTFT, want.ttft, "request %d", r.Index)
		require.Less(t, r.TTFT, want.ttft+slack, "request %d", r.Index)
		for _, g := range r.ITLs() {
			require.GreaterOrEqual(t, g, want.itl)
			require.Less(t, g, want.itl+slack)
		}
		tp, ok := r.TPOT()
		require.True(t, ok)
		require.Equal(t, (r.E2E-r.TTFT)/5, tp)
	}
	require.Equal(t, 4, res.Goodput.Good, "the four fast requests meet TTFT ≤ 200 ms")
	require.GreaterOrEqual(t, res.DurationS, (2*0.46+4*0.08)/2, "two lanes: at least half the serial sum")
	require.Less(t, res.DurationS, 2*0.46+4*0.08+0.5, "below the serial sum")

	sm := res.ServerMetrics
	require.NotNil(t, sm)
	require.Empty(t, sm.Error)
	byName := map[string]Series{}
	for _, s := range sm.Series {
		byName[seriesText(s)] = s
	}
	require.NotContains(t, byName, "go_goroutines", "the default filter")
	require.InDelta(t, 36, *byName["glmflash_generated_tokens_total"].Delta, 0, "the run's tokens, not the warm-up's")
	require.InDelta(t, 10, *byName[`glmflash_requests_total{status="length"}`].Delta, 0)
	require.InDelta(t, 1, *byName["glmflash_time_to_first_token_seconds_count"].Delta, 0)
	require.InDelta(t, 1, *byName["glmflash_time_to_first_token_seconds_sum"].Delta, 0)
	require.Equal(t, "gauge", byName["glmflash_running_requests"].Type)
}

// Failures are counted by kind with their first messages; the run goes on.
func TestRunCountsErrorsByKind(t *testing.T) {
	ok := behaviour{events: 2, perEvent: 1}
	f := newFakeServer(t, map[int32]behaviour{
		1: ok, 2: {status: 500}, 3: {status: 429}, 4: {events: 3, cut: 1}, 5: {events: 2, errEvent: true},
		6: {plain: true}, 7: {hang: true}, 8: {events: 0}, 9: {events: 2, noUsage: true},
	})
	c := NewClient(f.URL, "", 8)
	defer c.CloseIdle()
	res, err := Run(context.Background(), Spec{
		Client: c, Endpoint: Completions, Model: "fake", Requests: requests(1, 2, 2, 2, 2, 3, 4, 5, 6, 7, 8, 9),
		RequestRate: math.Inf(1), Timeout: 300 * ms_, Log: zerolog.Nop(),
	})
	require.NoError(t, err)
	require.Equal(t, 2, res.Completed, "requests 0 and 11")
	require.Equal(t, 10, res.Failed)
	kinds := map[string]int{}
	for k, e := range res.Errors {
		kinds[k] = e.Count
	}
	require.Equal(t, map[string]int{"http_500": 4, "http_429": 1, KindBrokenStream: 1, KindStreamError: 1, KindNotStreaming: 1, KindTimeout: 1, KindNoOutput: 1}, kinds)
	require.Len(t, res.Errors["http_500"].Examples, examplesPerKind)
	require.Equal(t, "request 1: server_error: scripted failure 500", res.Errors["http_500"].Examples[0])
	require.Contains(t, res.Errors[KindTimeout].Examples[0], "no end within --timeout 300ms")
	require.Contains(t, res.Errors[KindStreamError].Examples[0], "generation failed: scripted")
	require.Equal(t, 1, res.UsageMissing)
	require.Equal(t, 4, res.OutputTokens, "2 from usage, 2 counted as events")
}

// --max-errors stops the run: what was not sent is cancelled, the result
// says why.
func TestRunStopsAtMaxErrors(t *testing.T) {
	f := newFakeServer(t, map[int32]behaviour{1: {status: 503}, 2: {events: 1}})
	c := NewClient(f.URL, "", 1)
	defer c.CloseIdle()
	res, err := Run(context.Background(), Spec{
		Client: c, Endpoint: Completions, Model: "fake", Requests: requests(2, 1, 1, 2, 2, 2), Concurrency: 1,
		RequestRate: math.Inf(1), MaxErrors: 2, Log: zerolog.Nop(),
	})
	require.NoError(t, err)
	require.Equal(t, "--max-errors 2 reached", res.Aborted)
	require.Equal(t, 1, res.Completed)
	require.Equal(t, 2, res.Failed)
	require.Equal(t, 3, res.Cancelled)
}

// A failed warm-up fails the run; a missing /metrics is a warning only; a
// cancelled context stops the run and says so.
func TestRunWarmupMetricsAndInterrupt(t *testing.T) {
	f := newFakeServer(t, map[int32]behaviour{1: {status: 500}, 2: {events: 1}, 3: {hang: true}})
	c := NewClient(f.URL, "", 4)
	defer c.CloseIdle()
	spec := Spec{Client: c, Endpoint: Completions, Model: "fake", Requests: requests(2), RequestRate: math.Inf(1), Log: zerolog.Nop()}
	s := spec
	s.Warmup = requests(2, 1)
	_, err := Run(context.Background(), s)
	require.ErrorContains(t, err, "warm-up request 1 failed (http_500): server_error: scripted failure 500")

	s = spec
	s.MetricsURL = f.URL + "/no-metrics"
	res, err := Run(context.Background(), s)
	require.NoError(t, err)
	require.Equal(t, 1, res.Completed)
	require.Contains(t, res.ServerMetrics.Error, "before the run: GET "+f.URL+"/no-metrics: HTTP 404")

	f = newFakeServer(t, map[int32]behaviour{2: {events: 1}, 3: {hang: true}})
	s = spec
	s.Client = NewClient(f.URL, "", 4)
	defer s.Client.CloseIdle()
	s.Requests = requests(2, 3, 3)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer cancel() // at the latest after 10 s: a broken run ends rather than hangs
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * ms_) {
			f.mu.Lock()
			n := len(f.bodies)
			f.mu.Unlock()
			if n == 3 && f.inflight.Load() == 2 {
				return
			}
		}
	}()
	res, err = Run(ctx, s)
	require.NoError(t, err)
	require.Equal(t, "interrupted: context canceled", res.Aborted)
	require.Equal(t, 1, res.Completed)
	require.Equal(t, 2, res.Cancelled)
	require.Zero(t, res.Failed)
}

// A request rate spaces the sends by the Poisson schedule.
func TestRunFollowsTheRequestRate(t *testing.T) {
	f := newFakeServer(t, map[int32]behaviour{1: {events: 1}})
	c := NewClient(f.URL, "", 4)
	defer c.CloseIdle()
	res, err := Run(context.Background(), Spec{Client: c, Endpoint: Completions, Model: "fake", Requests: requests(1, 1, 1, 1, 1),
		RequestRate: 20, Seed: 5, Log: zerolog.Nop()})
	require.NoError(t, err)
	arr := Arrivals(5, 20, 5)
	for _, r := range res.Records {
		require.Equal(t, arr[r.Index], r.Scheduled)
		require.GreaterOrEqual(t, r.Sent, r.Scheduled)
		require.Less(t, r.Sent, r.Scheduled+100*ms_)
	}
}

// The spec's settings are checked, naming the option.
func TestSpecCheck(t *testing.T) {
	c := NewClient("http://127.0.0.1:1", "", 1)
	base := Spec{Client: c, Endpoint: Completions, Model: "m", Requests: requests(1), RequestRate: math.Inf(1)}
	for want, mod := range map[string]func(*Spec){
		`--endpoint: must be completions or chat, got "embeddings"`: func(s *Spec) { s.Endpoint = "embeddings" },
		"--concurrency: must be in [0, 65536]":                      func(s *Spec) { s.Concurrency = -1 },
		"--request-rate: must be > 0 requests/s or inf, got 0":      func(s *Spec) { s.RequestRate = 0 },
		"--request-rate: must be > 0 requests/s or inf, got NaN":    func(s *Spec) { s.RequestRate = math.NaN() },
		"--timeout: must be ≥ 0":                                    func(s *Spec) { s.Timeout = -1 },
		"--max-errors: must be ≥ 0":                                 func(s *Spec) { s.MaxErrors = -2 },
		"--metrics-filter: error parsing regexp":                    func(s *Spec) { s.MetricsFilter = "(" },
		"--num-prompts: no requests":                                func(s *Spec) { s.Requests = nil },
		`--extra-body: key "max_tokens" is set by the benchmark itself`: func(s *Spec) {
			s.ExtraBody = map[string]json.RawMessage{"max_tokens": json.RawMessage("3")}
		},
		"request 1 (of 1): a chat request needs text or messages (token ids cannot be sent to /v1/chat/completions)": func(s *Spec) { s.Endpoint = Chat },
		"a request with messages needs --endpoint chat": func(s *Spec) {
			s.Requests = []Request{{Messages: []Message{{Role: "user", Content: "hi"}}, OutputLen: 1}}
		},
	} {
		s := base
		mod(&s)
		require.ErrorContains(t, s.Check(), want)
	}
	require.NoError(t, base.Check())
}

// A chat request's body: messages (a text prompt becomes one user
// message), extra keys merged.
func TestChatBody(t *testing.T) {
	b, err := Body(Chat, "m", &Request{PromptText: "hello", OutputLen: 3}, 0.5, false, map[string]json.RawMessage{"top_k": json.RawMessage("1")})
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(b, &got))
	require.Equal(t, []any{map[string]any{"role": "user", "content": "hello"}}, got["messages"])
	require.EqualValues(t, 1, got["top_k"])
	require.EqualValues(t, 0.5, got["temperature"])
	require.NotContains(t, got, "ignore_eos")
	require.NotContains(t, got, "prompt")
}
