package serve

import (
	"net/http"
	"sync/atomic"
	"time"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/sched"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are the server's Prometheus metrics, on a registry of its own (so
// that several servers can live in one process, as in tests). It implements
// sched.Metrics.
type Metrics struct {
	reg        *prometheus.Registry
	requests   *prometheus.CounterVec
	ttft       prometheus.Histogram
	itl        prometheus.Histogram
	duration   prometheus.Histogram
	queueTime  prometheus.Histogram
	batchSeqs  prometheus.Histogram
	batchToks  prometheus.Histogram
	stepTime   prometheus.Histogram
	generated  prometheus.Counter
	prompt     prometheus.Counter
	queueDepth prometheus.Gauge
	running    prometheus.Gauge
	// speculative decoding
	specDrafted  prometheus.Counter
	specAccepted prometheus.Counter
	specSteps    prometheus.Counter
	specLength   prometheus.Histogram
	// specSimulated is speculative.simulate_acceptance (0: off)
	specSimulated prometheus.Gauge
	store         atomic.Pointer[storeRef]
	// the memory plan's: running sequences at most, and preemptions for KV
	// pages
	maxRunning  prometheus.Gauge
	preemptions prometheus.Counter
}

// latency buckets: 1 ms to ~2 min.
var latencyBuckets = prometheus.ExponentialBucketsRange(0.001, 120, 28)

// NewMetrics registers every metric (and the Go and process collectors).
func NewMetrics() *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{reg: reg}
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "glmflash_requests_total",
		Help: "Requests by final status: stop, length, abort, cancelled, error, scored (finished) or invalid_argument, resource_exhausted, unavailable, already_exists, unauthenticated, permission_denied (a foreign Host or Origin) (refused).",
	}, []string{"status"})
	f(m.requests)
	m.ttft = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "glmflash_time_to_first_token_seconds", Help: "Arrival to first generated token.", Buckets: latencyBuckets})
	f(m.ttft)
	m.itl = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "glmflash_inter_token_latency_seconds", Help: "Gap between consecutive tokens of a request.", Buckets: latencyBuckets})
	f(m.itl)
	m.duration = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "glmflash_request_duration_seconds", Help: "Arrival to end of a request.", Buckets: latencyBuckets})
	f(m.duration)
	m.queueTime = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "glmflash_queue_time_seconds", Help: "Arrival to admission (a cache slot given).", Buckets: latencyBuckets})
	f(m.queueTime)
	m.batchSeqs = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "glmflash_batch_size", Help: "Sequences per forward pass.", Buckets: prometheus.ExponentialBuckets(1, 2, 9)})
	f(m.batchSeqs)
	m.batchToks = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "glmflash_batch_tokens", Help: "Tokens per forward pass.", Buckets: prometheus.ExponentialBuckets(1, 2, 13)})
	f(m.batchToks)
	m.stepTime = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "glmflash_step_duration_seconds", Help: "Duration of one forward pass.", Buckets: latencyBuckets})
	f(m.stepTime)
	m.generated = prometheus.NewCounter(prometheus.CounterOpts{Name: "glmflash_generated_tokens_total", Help: "Completion tokens produced (rate() gives tokens/s)."})
	f(m.generated)
	m.prompt = prometheus.NewCounter(prometheus.CounterOpts{Name: "glmflash_prompt_tokens_total", Help: "Prompt tokens run (prefill)."})
	f(m.prompt)
	m.specDrafted = prometheus.NewCounter(prometheus.CounterOpts{Name: "glmflash_spec_draft_tokens_total", Help: "Draft tokens proposed by the speculative drafter and verified by the target."})
	f(m.specDrafted)
	m.specAccepted = prometheus.NewCounter(prometheus.CounterOpts{Name: "glmflash_spec_accepted_tokens_total", Help: "Draft tokens the target accepted (acceptance rate = this / glmflash_spec_draft_tokens_total)."})
	f(m.specAccepted)
	m.specSteps = prometheus.NewCounter(prometheus.CounterOpts{Name: "glmflash_spec_verify_steps_total", Help: "Verify spans run (one per speculating sequence and step)."})
	f(m.specSteps)
	m.specLength = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "glmflash_spec_acceptance_length", Help: "Tokens a verify span produced: accepted drafts + the target's own token.",
		Buckets: prometheus.LinearBuckets(1, 1, 16)})
	f(m.specLength)
	m.specSimulated = prometheus.NewGauge(prometheus.GaugeOpts{Name: "glmflash_spec_simulated_acceptance", Help: "The per-draft rate at which verify spans' acceptance is simulated (speculative.simulate_acceptance): outputs are not the model's. 0: off."})
	f(m.specSimulated)
	m.queueDepth = prometheus.NewGauge(prometheus.GaugeOpts{Name: "glmflash_queue_depth", Help: "Requests waiting for a cache slot."})
	f(m.queueDepth)
	m.running = prometheus.NewGauge(prometheus.GaugeOpts{Name: "glmflash_running_requests", Help: "Requests holding a cache slot."})
	f(m.running)
	f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "glmflash_cache_slots_in_use", Help: "Allocated cache slots."}, func() float64 {
		if s := m.store.Load(); s != nil {
			return float64(s.InUse())
		}
		return 0
	}))
	f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "glmflash_cache_slots", Help: "Cache slots in all."}, func() float64 {
		if s := m.store.Load(); s != nil {
			return float64(s.Capacity())
		}
		return 0
	}))
	m.maxRunning = prometheus.NewGauge(prometheus.GaugeOpts{Name: "glmflash_max_running", Help: "Requests that may run at once, as the memory planner sized them (within runtime.slots and runtime.max_running)."})
	f(m.maxRunning)
	m.preemptions = prometheus.NewCounter(prometheus.CounterOpts{Name: "glmflash_preemptions_total", Help: "Running requests preempted because the KV page pool ran out (their pages freed, recomputed later; no streamed token lost or repeated)."})
	f(m.preemptions)
	pages := func(used bool) func() float64 {
		return func() float64 {
			if s := m.store.Load(); s != nil {
				if ps, ok := s.Store.(backend.PagedStore); ok {
					st := ps.PageStats()
					if used {
						return float64(st.Used)
					}
					return float64(st.Free)
				}
			}
			return 0
		}
	}
	slots := func(used bool) func() float64 {
		return func() float64 {
			if s := m.store.Load(); s != nil {
				n := s.InUse()
				if used {
					return float64(n)
				}
				return float64(s.Capacity() - n)
			}
			return 0
		}
	}
	for _, st := range []string{"free", "used"} {
		f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "glmflash_kv_pages", Help: "KV cache pages (MLA latents and indexer pooled keys of runtime.kv_page_tokens tokens) by state.",
			ConstLabels: prometheus.Labels{"state": st}}, pages(st == "used")))
		f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "glmflash_state_slots", Help: "State slots (a sequence's KDA conv and recurrent state) by state.",
			ConstLabels: prometheus.Labels{"state": st}}, slots(st == "used")))
	}
	f(collectors.NewGoCollector())
	f(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Registry is the registry the metrics live in.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// storeRef holds the engine's store for the slot gauges.
type storeRef struct{ backend.Store }

func (m *Metrics) setStore(s backend.Store) { m.store.Store(&storeRef{s}) }

var _ sched.PreemptMetrics = (*Metrics)(nil) // the scheduler counts preemptions through it

// Preempted counts a request preempted for KV pages (sched.PreemptMetrics).
func (m *Metrics) Preempted() { m.preemptions.Inc() }

// Refused counts a request refused before it reached the runtime.
func (m *Metrics) Refused(status string) { m.requests.WithLabelValues(status).Inc() }

// Step implements sched.Metrics.
func (m *Metrics) Step(seqs, tokens int, d time.Duration) {
	m.batchSeqs.Observe(float64(seqs))
	m.batchToks.Observe(float64(tokens))
	m.stepTime.Observe(d.Seconds())
}

// FirstToken implements sched.Metrics.
func (m *Metrics) FirstToken(d time.Duration) { m.ttft.Observe(d.Seconds()) }

// InterToken implements sched.Metrics.
func (m *Metrics) InterToken(d time.Duration) { m.itl.Observe(d.Seconds()) }

// Tokens implements sched.Metrics.
func (m *Metrics) Tokens(prompt, completion int) {
	m.prompt.Add(float64(prompt))
	m.generated.Add(float64(completion))
}

// Finished implements sched.Metrics.
func (m *Metrics) Finished(f *sched.Final) {
	m.requests.WithLabelValues(f.Reason.String()).Inc()
	m.duration.Observe(f.Total.Seconds())
	if f.Queue > 0 {
		m.queueTime.Observe(f.Queue.Seconds())
	}
}

// Depth implements sched.Metrics.
func (m *Metrics) Depth(queued, running int) {
	m.queueDepth.Set(float64(queued))
	m.running.Set(float64(running))
}

// Verified implements sched.Metrics.
func (m *Metrics) Verified(drafted, accepted int) {
	m.specDrafted.Add(float64(drafted))
	m.specAccepted.Add(float64(accepted))
	m.specSteps.Inc()
	m.specLength.Observe(float64(accepted + 1))
}
