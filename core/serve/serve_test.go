package serve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/kernels/parallel"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(parallel.HelperFunc)) // the kernel pool lives for the process
}

const fixture = "../../testdata/glm5next-tiny-a/checkpoint"

func fixtureLoader(gate <-chan struct{}) func(context.Context) (*LoadedModel, error) {
	return func(ctx context.Context) (*LoadedModel, error) {
		if gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		ck, err := model.Open(fixture)
		if err != nil {
			return nil, err
		}
		return &LoadedModel{Config: ck.Config(), Weights: ck, Source: fixture, Close: ck.Close}, nil
	}
}

// harness is a server on 127.0.0.1:0 and a client connected over TCP.
type harness struct {
	srv    *Server
	conn   *grpc.ClientConn
	client pb.GLMFlashClient
	stop   context.CancelFunc
	done   chan error
}

type setup struct {
	rt    config.Runtime
	drain time.Duration
	gate  <-chan struct{} // Load waits for it
	opts  func(*Options)
	cfg   func(*config.Config) // adjusts the configuration last
	// listened, when set, runs between Listen and Serve (a test wraps a
	// listener there).
	listened func(*Server)
}

func start(t *testing.T, su setup) *harness {
	t.Helper()
	cfg := config.Default()
	cfg.Model.Dir, cfg.Model.Preset = fixture, ""
	cfg.Server.GRPCAddr = "127.0.0.1:0"
	cfg.Server.MetricsAddr = "127.0.0.1:0"
	cfg.Server.HTTPAddr = "127.0.0.1:0"
	cfg.Server.DrainTimeout = su.drain
	if su.drain == 0 {
		cfg.Server.DrainTimeout = 5 * time.Second
	}
	switch su.rt.Slots {
	case 0:
		su.rt.Slots = 8
	case -1: // the memory planner's
		su.rt.Slots = 0
	}
	if su.rt.DefaultMaxTokens == 0 {
		su.rt.DefaultMaxTokens = 16
	}
	cfg.Runtime = su.rt
	if su.cfg != nil {
		su.cfg(cfg)
	}
	o := Options{Load: fixtureLoader(su.gate)}
	if su.opts != nil {
		su.opts(&o)
	}
	srv, err := New(cfg, o)
	require.NoError(t, err)
	require.NoError(t, srv.Listen())
	if su.listened != nil {
		su.listened(srv)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{srv: srv, stop: cancel, done: make(chan error, 1)}
	go func() { h.done <- srv.Serve(ctx) }()
	conn, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	h.conn = conn
	h.client = pb.NewGLMFlashClient(conn)
	t.Cleanup(func() { h.shutdown(t) })
	if su.gate == nil {
		select {
		case <-srv.Ready():
		case err := <-h.done:
			t.Fatalf("server stopped: %v", err)
		}
	}
	return h
}

// shutdown stops the server, waits for Serve and closes the client.
func (h *harness) shutdown(t *testing.T) {
	if h.stop == nil {
		return
	}
	h.stop()
	h.stop = nil
	select {
	case err := <-h.done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("server did not stop")
	}
	h.conn.Close()
}

// result is a finished stream.
type result struct {
	tokens []int32
	text   string // the tokens' texts and the finish's
	finish *pb.Finish
	header metadata.MD
}

func generate(ctx context.Context, c pb.GLMFlashClient, req *pb.GenerateRequest) (*result, error) {
	st, err := c.Generate(ctx, req)
	if err != nil {
		return nil, err
	}
	r := &result{}
	for {
		m, err := st.Recv()
		if err == io.EOF {
			if r.finish == nil {
				return r, errors.New("stream ended without a finish message")
			}
			r.header, _ = st.Header()
			return r, nil
		}
		if err != nil {
			return r, err
		}
		if r.finish != nil {
			return r, errors.New("a message after the finish")
		}
		switch k := m.Kind.(type) {
		case *pb.GenerateResponse_Token:
			if int(k.Token.Index) != len(r.tokens) {
				return r, fmt.Errorf("token index %d, want %d", k.Token.Index, len(r.tokens))
			}
			r.tokens = append(r.tokens, k.Token.Id)
			r.text += k.Token.Text
		case *pb.GenerateResponse_Finish:
			r.finish = k.Finish
			r.text += k.Finish.Text
		}
	}
}

func ptr[T any](v T) *T { return &v }

func prompt(n, seed int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((seed*131 + i*17 + i*i*7) % 256)
	}
	return p
}

// alone runs a request by itself through a fresh engine in a plain loop.
func alone(t *testing.T, p []int32, maxTokens int, sp sample.Params, stops []int32) []int32 {
	t.Helper()
	ck, err := model.Open(fixture)
	require.NoError(t, err)
	defer ck.Close()
	e, err := engine.New(ck.Config(), ck, engine.Options{Slots: 1})
	require.NoError(t, err)
	slot, err := e.Store().Alloc()
	require.NoError(t, err)
	key := engine.Key{Mode: graph.Mixed, Logits: graph.LastLogits}
	res, err := e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: p}}})
	require.NoError(t, err)
	s := sample.New(sp)
	var out []int32
	for {
		tok := int32(s.Next(res.Row(0)))
		out = append(out, tok)
		for _, st := range stops {
			if st == tok {
				return out
			}
		}
		if len(out) == maxTokens {
			return out
		}
		res, err = e.Run(key, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: []int32{tok}}}})
		require.NoError(t, err)
	}
}

func greedy() *pb.SamplingParams { return &pb.SamplingParams{Temperature: ptr(0.0)} }

// 32 concurrent greedy streams over a real TCP connection each produce
// exactly the tokens their prompt produces alone, although they queue for 8
// slots, prefill in chunks and share forward passes.
func TestConcurrentGreedyStreamsMatchAlone(t *testing.T) {
	h := start(t, setup{rt: config.Runtime{Slots: 8, MaxBatchTokens: 24, PrefillChunk: 6}})
	const n = 32
	results := make([]*result, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := generate(context.Background(), h.client, &pb.GenerateRequest{
				PromptIds: prompt(1+(i*7)%29, i), MaxTokens: ptr(uint32(4 + i%9)), Sampling: greedy(),
			})
			if err != nil {
				t.Errorf("stream %d: %v", i, err)
				return
			}
			results[i] = r
		}()
	}
	wg.Wait()
	require.False(t, t.Failed())
	for i, r := range results {
		require.Equal(t, pb.FinishReason_FINISH_REASON_LENGTH, r.finish.Reason)
		require.Equal(t, uint32(len(r.tokens)), r.finish.Usage.CompletionTokens)
		require.Equal(t, uint32(1+(i*7)%29), r.finish.Usage.PromptTokens)
		require.Equal(t, alone(t, prompt(1+(i*7)%29, i), 4+i%9, sample.Greedy(), nil), r.tokens, "stream %d", i)
		require.Equal(t, []string{r.finish.RequestId}, r.header.Get(RequestIDHeader))
		require.NotNil(t, r.finish.Timings.TimeToFirstToken)
		require.LessOrEqual(t, r.finish.Timings.TimeToFirstToken.AsDuration(), r.finish.Timings.Total.AsDuration())
	}
	// the batches really were mixed
	require.Greater(t, histogramMax(t, h.srv, "glmflash_batch_size"), 1.0)
}

// histogramMax returns the largest bucket bound with a new count, a rough
// sign of the largest observation.
func histogramMax(t *testing.T, s *Server, name string) float64 {
	mfs, err := s.Metrics().Registry().Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		prev, best := uint64(0), 0.0
		for _, b := range h.GetBucket() {
			if b.GetCumulativeCount() > prev {
				best = b.GetUpperBound()
			}
			prev = b.GetCumulativeCount()
		}
		return best
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// The same seed gives the same tokens, alone or batched with other streams.
func TestSeededSamplingIsReproducible(t *testing.T) {
	h := start(t, setup{rt: config.Runtime{Slots: 8, PrefillChunk: 5}})
	sp := &pb.SamplingParams{Temperature: ptr(1.1), TopP: ptr(0.95), TopK: 40, MinP: 0.01, Seed: ptr(uint64(42))}
	req := &pb.GenerateRequest{PromptIds: prompt(9, 5), MaxTokens: ptr(uint32(20)), Sampling: sp}
	first, err := generate(context.Background(), h.client, req)
	require.NoError(t, err)
	require.Equal(t, uint64(42), first.finish.Seed)
	want := alone(t, prompt(9, 5), 20, sample.Params{Temperature: 1.1, TopP: 0.95, TopK: 40, MinP: 0.01, Seed: 42}, nil)
	require.Equal(t, want, first.tokens)

	var wg sync.WaitGroup
	var again *result
	for i := 0; i < 7; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i == 3 {
				r, err := generate(context.Background(), h.client, req)
				if err == nil {
					again = r
				} else {
					t.Error(err)
				}
				return
			}
			other := &pb.GenerateRequest{PromptIds: prompt(3+i*4, 50+i), MaxTokens: ptr(uint32(25)),
				Sampling: &pb.SamplingParams{Temperature: ptr(0.8), Seed: ptr(uint64(i))}}
			if _, err := generate(context.Background(), h.client, other); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	require.NotNil(t, again)
	require.Equal(t, first.tokens, again.tokens)

	// without a seed the server draws one and reports it; replaying it
	// reproduces the tokens
	unseeded := &pb.GenerateRequest{PromptIds: prompt(9, 5), MaxTokens: ptr(uint32(12)), Sampling: &pb.SamplingParams{Temperature: ptr(1.0)}}
	a, err := generate(context.Background(), h.client, unseeded)
	require.NoError(t, err)
	unseeded.Sampling.Seed = ptr(a.finish.Seed)
	b, err := generate(context.Background(), h.client, unseeded)
	require.NoError(t, err)
	require.Equal(t, a.tokens, b.tokens)
}

func TestStopIDsAndLogprobs(t *testing.T) {
	h := start(t, setup{})
	want := alone(t, prompt(7, 1), 10, sample.Greedy(), nil)
	stop := want[3]
	cut := 1 + indexOf(want, stop)
	st, err := h.client.Generate(context.Background(), &pb.GenerateRequest{
		PromptIds: prompt(7, 1), MaxTokens: ptr(uint32(10)), Sampling: greedy(), StopIds: []int32{stop}, TopLogprobs: 4,
	})
	require.NoError(t, err)
	var toks []*pb.Token
	var fin *pb.Finish
	for {
		m, err := st.Recv()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if tk := m.GetToken(); tk != nil {
			toks = append(toks, tk)
		} else {
			fin = m.GetFinish()
		}
	}
	require.Equal(t, pb.FinishReason_FINISH_REASON_STOP, fin.Reason)
	require.Len(t, toks, cut)
	for i, tk := range toks {
		require.Equal(t, want[i], tk.Id)
		require.Len(t, tk.TopLogprobs, 4)
		require.Equal(t, tk.Id, tk.TopLogprobs[0].Id)
		require.InDelta(t, tk.Logprob, tk.TopLogprobs[0].Logprob, 1e-6)
		require.Less(t, tk.Logprob, float32(0))
	}
}

func indexOf(s []int32, v int32) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// scrape reads one sample from the HTTP metrics endpoint.
func scrape(t *testing.T, s *Server, name string) float64 {
	t.Helper()
	return scrapeWith(t, s, name, "")
}

// scrapeWith reads a metric with an API key (metrics take the server's keys).
func scrapeWith(t *testing.T, s *Server, name, key string) float64 {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	req, err := http.NewRequest("GET", "http://"+s.MetricsAddr()+"/metrics", nil)
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			require.NoError(t, err)
			return v
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

// scrapeLabeled reads a metric's sample whose state label is state.
func scrapeLabeled(t *testing.T, s *Server, name, state string) float64 {
	t.Helper()
	return scrape(t, s, name+`{state="`+state+`"}`)
}

// Cancelling a stream mid-generation frees its slot (the store and the
// slots gauge return to the baseline) and the other streams go on unharmed.
func TestCancelledStreamFreesItsSlot(t *testing.T) {
	h := start(t, setup{})
	eng := h.srv.Engine()
	require.Equal(t, 0, eng.Store().InUse())
	require.Equal(t, 0.0, scrape(t, h.srv, "glmflash_cache_slots_in_use"))
	require.Equal(t, 8.0, scrape(t, h.srv, "glmflash_cache_slots"))

	otherReq := &pb.GenerateRequest{PromptIds: prompt(12, 3), MaxTokens: ptr(uint32(60)), Sampling: greedy()}
	otherDone := make(chan *result, 1)
	go func() {
		r, err := generate(context.Background(), h.client, otherReq)
		if err != nil {
			t.Error(err)
		}
		otherDone <- r
	}()

	var streams []context.CancelFunc
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		streams = append(streams, cancel)
		st, err := h.client.Generate(ctx, &pb.GenerateRequest{PromptIds: prompt(5, 10+i), MaxTokens: ptr(uint32(4000)), Sampling: greedy()})
		require.NoError(t, err)
		m, err := st.Recv()
		require.NoError(t, err)
		require.NotNil(t, m.GetToken())
	}
	require.GreaterOrEqual(t, eng.Store().InUse(), 3)
	for _, cancel := range streams {
		cancel()
	}
	r := <-otherDone
	require.NotNil(t, r)
	require.Equal(t, alone(t, otherReq.PromptIds, 60, sample.Greedy(), nil), r.tokens)
	require.Eventually(t, func() bool { return eng.Store().InUse() == 0 }, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, 0.0, scrape(t, h.srv, "glmflash_cache_slots_in_use"))
	// the running gauge follows when the scheduler reaps (same lock hold,
	// but after the store frees the slot)
	require.Eventually(t, func() bool { return scrape(t, h.srv, "glmflash_running_requests") == 0 }, 10*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool {
		return scrape(t, h.srv, `glmflash_requests_total{status="cancelled"}`) == 3
	}, 10*time.Second, 5*time.Millisecond)
}

// A client deadline ends the request and frees its slot; Abort ends another.
func TestDeadlineAndAbort(t *testing.T) {
	h := start(t, setup{})
	eng := h.srv.Engine()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := generate(ctx, h.client, &pb.GenerateRequest{PromptIds: prompt(4, 1), MaxTokens: ptr(uint32(4000)), Sampling: greedy()})
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	require.Eventually(t, func() bool { return eng.Store().InUse() == 0 }, 10*time.Second, 5*time.Millisecond)

	st, err := h.client.Generate(context.Background(), &pb.GenerateRequest{RequestId: "job-1", PromptIds: prompt(4, 1), MaxTokens: ptr(uint32(4000)), Sampling: greedy()})
	require.NoError(t, err)
	_, err = st.Recv()
	require.NoError(t, err)
	hd, err := st.Header()
	require.NoError(t, err)
	require.Equal(t, []string{"job-1"}, hd.Get(RequestIDHeader))
	// a second request with the same id is refused while the first runs
	_, err = generate(context.Background(), h.client, &pb.GenerateRequest{RequestId: "job-1", PromptIds: prompt(4, 1), MaxTokens: ptr(uint32(2))})
	require.Equal(t, codes.AlreadyExists, status.Code(err))
	_, err = h.client.Abort(context.Background(), &pb.AbortRequest{RequestId: "job-1"})
	require.NoError(t, err)
	var fin *pb.Finish
	for {
		m, err := st.Recv()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if f := m.GetFinish(); f != nil {
			fin = f
		}
	}
	require.Equal(t, pb.FinishReason_FINISH_REASON_ABORT, fin.Reason)
	require.Equal(t, "job-1", fin.RequestId)
	require.Eventually(t, func() bool { return eng.Store().InUse() == 0 }, 10*time.Second, 5*time.Millisecond)
	_, err = h.client.Abort(context.Background(), &pb.AbortRequest{RequestId: "job-1"})
	require.Equal(t, codes.NotFound, status.Code(err))
}

// Every error a client can cause gets its status and names the field; none
// disturbs a stream that is running meanwhile.
func TestClientErrors(t *testing.T) {
	h := start(t, setup{rt: config.Runtime{ContextLimit: 64}})
	okReq := &pb.GenerateRequest{PromptIds: prompt(10, 8), MaxTokens: ptr(uint32(40)), Sampling: greedy()}
	okDone := make(chan *result, 1)
	go func() {
		r, err := generate(context.Background(), h.client, okReq)
		if err != nil {
			t.Error(err)
		}
		okDone <- r
	}()

	base := func() *pb.GenerateRequest {
		return &pb.GenerateRequest{PromptIds: []int32{1, 2, 3}, MaxTokens: ptr(uint32(4))}
	}
	cases := []struct {
		name  string
		field string
		mut   func(r *pb.GenerateRequest)
	}{
		{"token too large", "prompt_ids[1]", func(r *pb.GenerateRequest) { r.PromptIds = []int32{1, 256} }},
		{"negative token", "prompt_ids[0]", func(r *pb.GenerateRequest) { r.PromptIds = []int32{-5} }},
		{"empty prompt", "prompt_ids", func(r *pb.GenerateRequest) { r.PromptIds = nil }},
		{"prompt over the context", "prompt_ids", func(r *pb.GenerateRequest) { r.PromptIds = prompt(65, 1) }},
		{"prompt fills the context (default max_tokens)", "prompt_ids", func(r *pb.GenerateRequest) { r.PromptIds = prompt(64, 1); r.MaxTokens = nil }},
		{"max_tokens 0", "max_tokens", func(r *pb.GenerateRequest) { r.MaxTokens = ptr(uint32(0)) }},
		{"max_tokens too large", "max_tokens", func(r *pb.GenerateRequest) { r.MaxTokens = ptr(uint32(62)) }},
		{"max_tokens huge", "max_tokens", func(r *pb.GenerateRequest) { r.MaxTokens = ptr(uint32(math.MaxUint32)) }},
		{"negative temperature", "sampling.temperature", func(r *pb.GenerateRequest) { r.Sampling = &pb.SamplingParams{Temperature: ptr(-0.5)} }},
		{"NaN temperature", "sampling.temperature", func(r *pb.GenerateRequest) { r.Sampling = &pb.SamplingParams{Temperature: ptr(math.NaN())} }},
		{"infinite temperature", "sampling.temperature", func(r *pb.GenerateRequest) { r.Sampling = &pb.SamplingParams{Temperature: ptr(math.Inf(1))} }},
		{"top_p 0", "sampling.top_p", func(r *pb.GenerateRequest) { r.Sampling = &pb.SamplingParams{TopP: ptr(0.0)} }},
		{"top_p above 1", "sampling.top_p", func(r *pb.GenerateRequest) { r.Sampling = &pb.SamplingParams{TopP: ptr(1.5)} }},
		{"negative top_k", "sampling.top_k", func(r *pb.GenerateRequest) { r.Sampling = &pb.SamplingParams{TopK: -1} }},
		{"min_p 1", "sampling.min_p", func(r *pb.GenerateRequest) { r.Sampling = &pb.SamplingParams{MinP: 1} }},
		{"negative min_p", "sampling.min_p", func(r *pb.GenerateRequest) { r.Sampling = &pb.SamplingParams{MinP: -0.1} }},
		{"stop id out of range", "stop_ids[1]", func(r *pb.GenerateRequest) { r.StopIds = []int32{3, 999} }},
		{"too many stop ids", "stop_ids", func(r *pb.GenerateRequest) { r.StopIds = make([]int32, 1025) }},
		{"too many top logprobs", "top_logprobs", func(r *pb.GenerateRequest) { r.TopLogprobs = 21 }},
		{"request id with a space", "request_id", func(r *pb.GenerateRequest) { r.RequestId = "a b" }},
		{"request id too long", "request_id", func(r *pb.GenerateRequest) { r.RequestId = strings.Repeat("x", 129) }},
	}
	for _, c := range cases {
		r := base()
		c.mut(r)
		_, err := generate(context.Background(), h.client, r)
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", c.name, err)
		require.True(t, strings.HasPrefix(status.Convert(err).Message(), c.field+":"), "%s: %v", c.name, err)
	}
	// Score and Abort
	_, err := h.client.Score(context.Background(), &pb.ScoreRequest{})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.Contains(t, status.Convert(err).Message(), "token_ids")
	_, err = h.client.Score(context.Background(), &pb.ScoreRequest{TokenIds: []int32{300}})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.Contains(t, status.Convert(err).Message(), "token_ids[0]")
	_, err = h.client.Score(context.Background(), &pb.ScoreRequest{TokenIds: prompt(65, 1)})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	_, err = h.client.Abort(context.Background(), &pb.AbortRequest{})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	_, err = h.client.Abort(context.Background(), &pb.AbortRequest{RequestId: "never-was"})
	require.Equal(t, codes.NotFound, status.Code(err))

	// the exact context limit is fine
	r, err := generate(context.Background(), h.client, &pb.GenerateRequest{PromptIds: prompt(4, 2), MaxTokens: ptr(uint32(60)), Sampling: greedy()})
	require.NoError(t, err)
	require.Len(t, r.tokens, 60)

	ok := <-okDone
	require.NotNil(t, ok)
	require.Equal(t, alone(t, okReq.PromptIds, 40, sample.Greedy(), nil), ok.tokens)
	require.Positive(t, scrape(t, h.srv, `glmflash_requests_total{status="invalid_argument"}`))
}

// With one slot and no waiting room a second concurrent request is refused
// with RESOURCE_EXHAUSTED, and the running one is unharmed.
func TestQueueFull(t *testing.T) {
	h := start(t, setup{rt: config.Runtime{Slots: 1, MaxQueue: -1}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := h.client.Generate(ctx, &pb.GenerateRequest{PromptIds: prompt(4, 1), MaxTokens: ptr(uint32(4000)), Sampling: greedy()})
	require.NoError(t, err)
	_, err = st.Recv()
	require.NoError(t, err)
	_, err = generate(context.Background(), h.client, &pb.GenerateRequest{PromptIds: prompt(4, 2), MaxTokens: ptr(uint32(2))})
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	_, err = h.client.Score(context.Background(), &pb.ScoreRequest{TokenIds: prompt(4, 2)})
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	m, err := st.Recv()
	require.NoError(t, err)
	require.NotNil(t, m.GetToken())
	require.Equal(t, 2.0, scrape(t, h.srv, `glmflash_requests_total{status="resource_exhausted"}`))
}

// Health is NOT_SERVING while the model loads (requests get UNAVAILABLE),
// SERVING after, and NOT_SERVING again while draining, when new requests
// get UNAVAILABLE and those in flight finish.
func TestHealthLoadingAndDraining(t *testing.T) {
	gate := make(chan struct{})
	h := start(t, setup{gate: gate, drain: 10 * time.Second})
	hc := healthpb.NewHealthClient(h.conn)
	for _, svc := range []string{"", ServiceName} {
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		require.NoError(t, err)
		require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, resp.Status)
	}
	_, err := generate(context.Background(), h.client, &pb.GenerateRequest{PromptIds: []int32{1}})
	require.Equal(t, codes.Unavailable, status.Code(err))
	_, err = h.client.GetModelInfo(context.Background(), &pb.GetModelInfoRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err))
	close(gate)
	<-h.srv.Ready()
	resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: ServiceName})
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, resp.Status)

	// a stream in flight when the drain starts finishes normally
	st, err := h.client.Generate(context.Background(), &pb.GenerateRequest{PromptIds: prompt(3, 1), MaxTokens: ptr(uint32(300)), Sampling: greedy()})
	require.NoError(t, err)
	_, err = st.Recv()
	require.NoError(t, err)
	h.stop()
	require.Eventually(t, func() bool {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: ServiceName})
		return err == nil && r.Status == healthpb.HealthCheckResponse_NOT_SERVING
	}, 10*time.Second, time.Millisecond)
	_, err = generate(context.Background(), h.client, &pb.GenerateRequest{PromptIds: []int32{1}, MaxTokens: ptr(uint32(2))})
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	n := 1
	var fin *pb.Finish
	for {
		m, err := st.Recv()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if m.GetToken() != nil {
			n++
		} else {
			fin = m.GetFinish()
		}
	}
	require.Equal(t, pb.FinishReason_FINISH_REASON_LENGTH, fin.Reason)
	require.Equal(t, 300, n)
	require.NoError(t, <-h.done)
	h.conn.Close()
	h.stop = nil
}

// A server shut down with streams open aborts them at the drain deadline,
// and leaves no goroutine behind.
func TestShutdownWithOpenStreamsLeaksNothing(t *testing.T) {
	h := start(t, setup{drain: 100 * time.Millisecond})
	var streams []grpc.ServerStreamingClient[pb.GenerateResponse]
	for i := 0; i < 4; i++ {
		st, err := h.client.Generate(context.Background(), &pb.GenerateRequest{PromptIds: prompt(5, i), MaxTokens: ptr(uint32(4000)), Sampling: greedy()})
		require.NoError(t, err)
		_, err = st.Recv()
		require.NoError(t, err)
		streams = append(streams, st)
	}
	// and one that never reads past its first message
	_, err := h.client.Generate(context.Background(), &pb.GenerateRequest{PromptIds: prompt(5, 9), MaxTokens: ptr(uint32(4000)), Sampling: greedy()})
	require.NoError(t, err)
	eng := h.srv.Engine()
	h.shutdown(t)
	for _, st := range streams {
		var fin *pb.Finish
		for {
			m, err := st.Recv()
			if err != nil {
				break
			}
			if f := m.GetFinish(); f != nil {
				fin = f
			}
		}
		require.NotNil(t, fin)
		require.Equal(t, pb.FinishReason_FINISH_REASON_ABORT, fin.Reason)
		require.Contains(t, fin.Message, "draining")
	}
	require.Equal(t, 0, eng.Store().InUse())
	goleak.VerifyNone(t, goleak.IgnoreAnyFunction(parallel.HelperFunc))
}

func TestScoreMatchesEngine(t *testing.T) {
	h := start(t, setup{rt: config.Runtime{PrefillChunk: 4}})
	toks := prompt(11, 4)
	ck, err := model.Open(fixture)
	require.NoError(t, err)
	defer ck.Close()
	e, err := engine.New(ck.Config(), ck, engine.Options{Slots: 1})
	require.NoError(t, err)
	slot, _ := e.Store().Alloc()
	want, err := e.Run(engine.Key{Mode: graph.Mixed, Logits: graph.AllLogits}, &backend.Batch{Seqs: []backend.Seq{{Slot: slot, Tokens: toks}}})
	require.NoError(t, err)

	all, err := h.client.Score(context.Background(), &pb.ScoreRequest{TokenIds: toks, AllPositions: true})
	require.NoError(t, err)
	require.Equal(t, uint32(11), all.Rows)
	require.Equal(t, uint32(256), all.VocabSize)
	require.Len(t, all.Logits, 11*256)
	for i := range all.Logits {
		require.InDelta(t, want.Logits[i], all.Logits[i], 1e-4)
	}
	last, err := h.client.Score(context.Background(), &pb.ScoreRequest{TokenIds: toks})
	require.NoError(t, err)
	require.Equal(t, uint32(1), last.Rows)
	for i, v := range last.Logits {
		require.InDelta(t, want.Row(10)[i], v, 1e-4)
	}
	require.Equal(t, 0, h.srv.Engine().Store().InUse())
}

func TestGetModelInfoAndReflection(t *testing.T) {
	report := map[string]any{"passes": []string{"example"}}
	h := start(t, setup{opts: func(o *Options) { o.PassReport = func(*engine.Engine) any { return report } }})
	info, err := h.client.GetModelInfo(context.Background(), &pb.GetModelInfoRequest{})
	require.NoError(t, err)
	require.Equal(t, uint32(256), info.Model.VocabSize)
	require.Equal(t, uint32(8), info.Model.NumLayers)
	require.Equal(t, uint32(6), info.Model.KdaLayers)
	require.Equal(t, uint32(2), info.Model.DsaLayers)
	require.Zero(t, info.Model.MtpLayers)
	require.False(t, info.Model.MtpWeights)
	require.Equal(t, uint32(4096), info.Engine.ContextLimit)
	require.Equal(t, uint32(8), info.Engine.Slots)
	require.Contains(t, info.Model.ConfigJson, "glm5_next")
	require.JSONEq(t, `{"passes":["example"]}`, info.PassReportJson)
	require.Len(t, info.ConfigHash, 64)
	again, err := h.client.GetModelInfo(context.Background(), &pb.GetModelInfoRequest{})
	require.NoError(t, err)
	require.True(t, proto.Equal(info, again))

	// reflection: grpcurl-style discovery without proto files
	rc, err := reflectionpb.NewServerReflectionClient(h.conn).ServerReflectionInfo(context.Background())
	require.NoError(t, err)
	require.NoError(t, rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}))
	resp, err := rc.Recv()
	require.NoError(t, err)
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	require.Contains(t, names, ServiceName)
	require.Contains(t, names, "grpc.health.v1.Health")
	require.NoError(t, rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: ServiceName}}))
	resp, err = rc.Recv()
	require.NoError(t, err)
	require.NotEmpty(t, resp.GetFileDescriptorResponse().GetFileDescriptorProto())
	require.NoError(t, rc.CloseSend())
}

func TestDefaultsForOptionalFields(t *testing.T) {
	sp, err := samplingParams(nil)
	require.NoError(t, err)
	require.Equal(t, DefaultTemperature, sp.Temperature)
	require.Equal(t, DefaultTopP, sp.TopP)
	r, err := generateRequest(context.Background(), &pb.GenerateRequest{PromptIds: []int32{1}}, limits{vocab: 10, context: 8, defaultMaxTokens: 100})
	require.NoError(t, err)
	require.Equal(t, 7, r.MaxTokens, "the default is clipped to the context")
	sp, err = samplingParams(&pb.SamplingParams{Temperature: ptr(0.0), Seed: ptr(uint64(9))})
	require.NoError(t, err)
	require.Equal(t, sample.Params{TopP: 1, Seed: 9}, sp)
}

// A shutdown asked for while the model loads is a clean stop.
func TestShutdownWhileLoading(t *testing.T) {
	gate := make(chan struct{})
	h := start(t, setup{gate: gate})
	hc := healthpb.NewHealthClient(h.conn)
	resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, resp.Status)
	h.shutdown(t) // requires Serve to return nil
}

// The model's EOS ends a stream with STOP; ignore_eos generates on.
func TestEOSAndIgnoreEOS(t *testing.T) {
	want := alone(t, prompt(7, 1), 10, sample.Greedy(), nil)
	eos := want[2]
	h := start(t, setup{opts: func(o *Options) {
		o.Load = func(ctx context.Context) (*LoadedModel, error) {
			lm, err := fixtureLoader(nil)(ctx)
			if err != nil {
				return nil, err
			}
			c := lm.Config.Clone()
			c.EOSTokenIDs = []int{int(eos)}
			lm.Config = c
			return lm, nil
		}
	}})
	r, err := generate(context.Background(), h.client, &pb.GenerateRequest{PromptIds: prompt(7, 1), MaxTokens: ptr(uint32(10)), Sampling: greedy()})
	require.NoError(t, err)
	require.Equal(t, pb.FinishReason_FINISH_REASON_STOP, r.finish.Reason)
	require.Equal(t, want[:1+indexOf(want, eos)], r.tokens)
	r, err = generate(context.Background(), h.client, &pb.GenerateRequest{PromptIds: prompt(7, 1), MaxTokens: ptr(uint32(10)), Sampling: greedy(), IgnoreEos: true})
	require.NoError(t, err)
	require.Equal(t, pb.FinishReason_FINISH_REASON_LENGTH, r.finish.Reason)
	require.Equal(t, want, r.tokens)
}

// Every program the scheduler runs is compiled before the server is ready:
// the first Score compiles nothing inside the scheduler (where it would
// stall every stream).
func TestEveryProgramCompiledBeforeServing(t *testing.T) {
	var mu sync.Mutex
	var compiled []engine.Key
	h := start(t, setup{opts: func(o *Options) {
		o.Engine = func(eo *engine.Options) {
			eo.Hook = func(_ *ir.Graph, key engine.Key) error {
				mu.Lock()
				compiled = append(compiled, key)
				mu.Unlock()
				return nil
			}
		}
	}})
	mu.Lock()
	before := append([]engine.Key(nil), compiled...)
	mu.Unlock()
	require.ElementsMatch(t, sched.Programs, before, "compiled by the time the server is ready")
	_, err := h.client.Score(context.Background(), &pb.ScoreRequest{TokenIds: prompt(5, 1), AllPositions: true})
	require.NoError(t, err)
	_, err = generate(context.Background(), h.client, &pb.GenerateRequest{PromptIds: prompt(5, 1), MaxTokens: ptr(uint32(2)), Sampling: greedy()})
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, before, compiled, "no program was compiled while serving")
}

// A Score whose reply would exceed server.max_response_bytes is refused
// before any work (INVALID_ARGUMENT naming the field); within the bound it
// is served.
func TestScoreReplyIsBounded(t *testing.T) {
	require.Equal(t, 64<<20, config.Default().Server.MaxResponseBytes)
	h := start(t, setup{cfg: func(c *config.Config) { c.Server.MaxResponseBytes = 8 << 10 }})
	_, err := h.client.Score(context.Background(), &pb.ScoreRequest{TokenIds: prompt(11, 4), AllPositions: true})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "all_positions: 11 rows × 256 logits need 11328 bytes, more than server.max_response_bytes (8192)")
	require.Zero(t, scrape(t, h.srv, "glmflash_prompt_tokens_total"), "no work was done")
	r, err := h.client.Score(context.Background(), &pb.ScoreRequest{TokenIds: prompt(11, 4), AllPositions: false})
	require.NoError(t, err)
	require.Equal(t, uint32(1), r.Rows)
	r, err = h.client.Score(context.Background(), &pb.ScoreRequest{TokenIds: prompt(7, 4), AllPositions: true})
	require.NoError(t, err)
	require.Equal(t, uint32(7), r.Rows)
}

// GetModelInfo reports the MTP layers apart from the trunk's layer counts,
// and whether the checkpoint holds them.
func TestModelInfoReportsMTP(t *testing.T) {
	cfg, err := randckpt.Preset("tiny-mtp")
	require.NoError(t, err)
	mi := modelInfo(cfg, "x", 0, nil, true)
	require.Equal(t, uint32(1), mi.MtpLayers)
	require.True(t, mi.MtpWeights)
	require.Equal(t, uint32(8), mi.NumLayers)
	require.Equal(t, uint32(2), mi.DsaLayers)
	require.Equal(t, uint32(5), mi.MoeLayers)
	require.False(t, modelInfo(cfg, "x", 0, nil, false).MtpWeights)
	cfg.NumNextNPredictLayers = 0
	mi = modelInfo(cfg, "x", 0, nil, true)
	require.Zero(t, mi.MtpLayers)
	require.False(t, mi.MtpWeights, "no MTP layer, no MTP weights to report")
}
