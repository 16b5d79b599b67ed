// Package serve is the gRPC server of glmflash (API glmflash.v1): streaming
// Generate, Abort, GetModelInfo and Score over a continuous-batching
// runtime, with the standard health service (NOT_SERVING while the model
// loads and while draining), server reflection (grpcurl needs no proto
// files), Prometheus metrics on an HTTP port and zerolog logs that carry
// request ids; beside it, on the same runtime, the OpenAI-compatible HTTP
// API of core/openai (with the same TLS, API keys and request bounds).
//
// Every input a client sends is checked before it reaches the runtime and a
// bad one gets a precise status (INVALID_ARGUMENT naming the field); no
// request can disturb another.
package serve

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/glmflash/glmflash/core/access"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/grammar"
	"github.com/glmflash/glmflash/core/openai"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/plan"
	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/core/speculative"
	"github.com/glmflash/glmflash/core/text"
	"github.com/glmflash/glmflash/internal/netlimit"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/safetensors"
	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ServiceName is the gRPC service, as health checks name it.
const ServiceName = "glmflash.v1.GLMFlash"

// RequestIDHeader is the response header that carries a Generate's id.
const RequestIDHeader = "x-request-id"

// LoadedModel is a model ready to serve.
type LoadedModel struct {
	Config  *model.Config
	Weights plan.Weights
	// Info is what pass eligibility reads of the weights (their dtypes;
	// nil: unknown, taken as BF16).
	Info   pass.WeightInfo
	Source string       // shown in GetModelInfo: a directory or a preset
	Text   *text.Model  // tokenizer and chat template (nil: token ids only)
	Close  func() error // releases the weights (may be nil)
}

// Options are a server's collaborators.
type Options struct {
	Log zerolog.Logger
	// Load opens the model. Serve calls it after the listeners are up,
	// while health reports NOT_SERVING.
	Load func(ctx context.Context) (*LoadedModel, error)
	// Passes rewrite every program's graph (nil: the graphs as built); the
	// engine's options are the configuration's (engine.FromConfig: device,
	// precision, CUDA section, pass eligibility; slots, rollback and
	// context limit from the runtime and speculative sections).
	Passes *pass.Pipeline
	// Engine adjusts the engine's options before it is made (tests); nil:
	// as the configuration says.
	Engine func(*engine.Options)
	// PassReport returns the pass pipeline's report (anything that
	// marshals to JSON) for GetModelInfo; nil (or a nil result) until
	// passes exist.
	PassReport func(*engine.Engine) any
	// Drafter, when set, makes the drafter of a configuration that
	// speculates, instead of the MTP drafter its method names (tests plug a
	// scripted drafter in here); it must draft at most the configured
	// steps.
	Drafter func(e *engine.Engine, sp config.Speculative) (speculative.Drafter, error)
}

// Server is one glmflash gRPC server.
type Server struct {
	cfg     *config.Config
	opts    Options
	log     zerolog.Logger
	metrics *Metrics
	grpc    *grpc.Server
	health  *health.Server
	http    *http.Server
	api     *http.Server // the OpenAI-compatible API
	lis     net.Listener
	mlis    net.Listener
	alis    net.Listener
	drain   atomic.Bool
	// weightsRefused: a step failed because the weights are refused
	// (stepFailed); health stays NOT_SERVING.
	weightsRefused atomic.Bool
	live           atomic.Pointer[live]
	ready          chan struct{}
	served         sync.Once
	keys           *access.Keys
	tls            *tls.Config // nil: plaintext
}

// live is the loaded state.
type live struct {
	rt      *sched.Scheduler
	eng     *engine.Engine
	draft   speculative.Drafter // nil without speculative decoding
	lim     limits
	model   *pb.ModelInfo
	engine  *pb.EngineInfo
	cfgJSON []byte
	closeFn func() error
	text    *text.Model
	// grammar compiles structured output over the vocabulary (nil, with
	// grammarErr, when the model has no byte-level tokenizer).
	grammar    *grammar.Compiler
	grammarErr error
	loaded     time.Time
}

// grammarOf is the structured-output compiler of a model's vocabulary.
func grammarOf(cfg *model.Config, tm *text.Model) (*grammar.Compiler, error) {
	if tm == nil || tm.Tok == nil {
		return nil, errors.New("the model has no tokenizer")
	}
	eos := make([]int32, len(cfg.EOSTokenIDs))
	for i, id := range cfg.EOSTokenIDs {
		eos[i] = int32(id)
	}
	v, err := grammar.NewVocab(tm.Tok, cfg.VocabSize, eos)
	if err != nil {
		return nil, err
	}
	return grammar.NewCompiler(v), nil
}

// New makes a server of the model, server and runtime sections of cfg;
// Listen binds its ports and Serve runs it.
func New(cfg *config.Config, opts Options) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("config: %w", cfg.Explain(err))
	}
	if opts.Load == nil {
		return nil, errors.New("serve: Options.Load is nil")
	}
	s := &Server{cfg: cfg, opts: opts, log: opts.Log, metrics: NewMetrics(), health: health.NewServer(), ready: make(chan struct{})}
	tlsCfg, err := cfg.Server.TLS.ServerConfig("server.tls")
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	s.tls = tlsCfg
	if s.keys, err = cfg.Server.Auth.Load("server.auth"); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	lopts := []logging.Option{
		logging.WithLogOnEvents(logging.FinishCall),
		logging.WithLevels(func(c codes.Code) logging.Level {
			if c == codes.OK {
				return logging.LevelDebug
			}
			return logging.DefaultServerCodeToLevel(c)
		}),
	}
	rec := recovery.WithRecoveryHandler(func(p any) error {
		s.log.Error().Interface("panic", p).Msg("a handler panicked")
		return status.Error(codes.Internal, "internal error")
	})
	sc := cfg.Server
	gopts := []grpc.ServerOption{
		grpc.MaxSendMsgSize(sc.MaxResponseBytes),
		grpc.MaxRecvMsgSize(sc.MaxRequestBytes),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: sc.KeepaliveTime, Timeout: sc.KeepaliveTimeout,
			MaxConnectionAge: sc.MaxConnectionAge, MaxConnectionAgeGrace: sc.MaxConnectionAgeGrace, MaxConnectionIdle: sc.MaxConnectionIdle}),
		grpc.ConnectionTimeout(sc.ReadHeaderTimeout), // the handshake, TLS included
		grpc.MaxConcurrentStreams(uint32(sc.MaxConcurrentStreams)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.ChainUnaryInterceptor(logging.UnaryServerInterceptor(zerologAdapter(s.log), lopts...), recovery.UnaryServerInterceptor(rec), s.authUnary),
		grpc.ChainStreamInterceptor(logging.StreamServerInterceptor(zerologAdapter(s.log), lopts...), recovery.StreamServerInterceptor(rec), s.authStream),
	}
	if tlsCfg != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	s.grpc = grpc.NewServer(gopts...)
	pb.RegisterGLMFlashServer(s.grpc, &service{s: s})
	healthpb.RegisterHealthServer(s.grpc, s.health)
	if sc.Reflection {
		reflection.Register(s.grpc)
	}
	s.setHealth(healthpb.HealthCheckResponse_NOT_SERVING)
	return s, nil
}

// authenticate checks the caller's API key (metadata "authorization:
// Bearer KEY" or "x-api-key: KEY") when the server has keys; health checks
// need none. The caller is put in the context for Generate and Abort.
func (s *Server) authenticate(ctx context.Context, method string) (context.Context, error) {
	if !s.keys.Required() || strings.HasPrefix(method, "/grpc.health.v1.Health/") {
		return ctx, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	p, err := s.keys.CheckHeaders(func(name string) string { return first(md.Get(name)) })
	if err != nil {
		s.metrics.Refused("unauthenticated")
		return ctx, status.Error(codes.Unauthenticated, err.Error())
	}
	return access.WithPrincipal(ctx, p), nil
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

func (s *Server) authUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, err := s.authenticate(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (s *Server) authStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, err := s.authenticate(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return handler(srv, &principalStream{ServerStream: ss, ctx: ctx})
}

// principalStream is a stream whose context carries the caller.
type principalStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (p *principalStream) Context() context.Context { return p.ctx }

func zerologAdapter(l zerolog.Logger) logging.Logger {
	return logging.LoggerFunc(func(_ context.Context, lvl logging.Level, msg string, fields ...any) {
		var ev *zerolog.Event
		switch lvl {
		case logging.LevelDebug:
			ev = l.Debug()
		case logging.LevelInfo:
			ev = l.Info()
		case logging.LevelWarn:
			ev = l.Warn()
		default:
			ev = l.Error()
		}
		ev.Fields(fields).Msg(msg)
	})
}

func (s *Server) setHealth(st healthpb.HealthCheckResponse_ServingStatus) {
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(ServiceName, st)
}

// stepFailed is told every failed step's error: weights refused
// (model.weights: guarded, the file changed or faulted) fail every later
// step too, so health turns NOT_SERVING (a load balancer stops sending
// here) and stays so; the requests themselves fail with the reason.
func (s *Server) stepFailed(err error) {
	if errors.Is(err, safetensors.ErrRefused) && s.weightsRefused.CompareAndSwap(false, true) {
		s.log.Error().Err(err).Msg("the checkpoint's weights are refused: health NOT_SERVING; every request fails with this reason")
		s.setHealth(healthpb.HealthCheckResponse_NOT_SERVING)
	}
}

// Metrics returns the server's metrics.
func (s *Server) Metrics() *Metrics { return s.metrics }

// Listen binds the gRPC and metrics addresses (port 0 picks a free port).
// Every listener bounds its connections (server.max_connections,
// max_connections_per_client) and every HTTP server its idle, header, body
// and write times (see core/openai.Limits).
func (s *Server) Listen() error {
	sc := s.cfg.Server
	lis, err := net.Listen("tcp", sc.GRPCAddr)
	if err != nil {
		return fmt.Errorf("serve: server.grpc_addr: %w", err)
	}
	s.lis = s.limiter().BusyListener(lis)
	limits := openai.Limits{BodyTimeout: sc.BodyTimeout, MinBodyRate: sc.MinBodyRate, WriteTimeout: sc.WriteTimeout}
	if sc.MetricsAddr != "" {
		mlis, err := net.Listen("tcp", sc.MetricsAddr)
		if err != nil {
			lis.Close()
			return fmt.Errorf("serve: server.metrics_addr: %w", err)
		}
		h := s.metrics.Handler()
		if !sc.MetricsPlaintext {
			h = s.keys.HTTP(h) // the same keys as the API (Prometheus: authorization.credentials)
		} else if s.tls != nil || s.keys.Required() {
			s.log.Warn().Str("metrics", mlis.Addr().String()).Msg("server.metrics_plaintext: /metrics is served in plain HTTP without API keys although server.tls or server.auth are on")
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", h)
		s.http, s.mlis = s.httpServer(s.guard(sc.MetricsAddr).HTTP(limits.Bound(mux), plainRefusal), mlis)
	}
	if sc.HTTPAddr != "" {
		alis, err := net.Listen("tcp", sc.HTTPAddr)
		if err != nil {
			s.lis.Close()
			if s.mlis != nil {
				s.mlis.Close()
			}
			return fmt.Errorf("serve: server.http_addr: %w", err)
		}
		var mh http.Handler
		if sc.HTTPMetrics {
			mh = s.metrics.Handler() // behind the API's TLS and keys, as every route of it
		}
		s.api, s.alis = s.httpServer(openai.New(openai.Options{
			Metrics:      mh,
			Model:        s.cfg.ServedName(),
			Live:         s.apiLive,
			Refused:      s.metrics.Refused,
			Draining:     s.drain.Load,
			Keys:         s.keys,
			MaxBodyBytes: sc.MaxRequestBytes,
			Limits:       limits,
			Guard:        s.guard(sc.HTTPAddr),
			Log:          s.log,
		}), alis)
	}
	return nil
}

// limiter is a listener's connection bound.
func (s *Server) limiter() *netlimit.Limiter {
	return netlimit.New(s.cfg.Server.MaxConnections, s.cfg.Server.MaxConnectionsPerClient)
}

// httpServer is an HTTP server of h on lis, with the server's TLS and
// connection limits: keep-alive connections close after
// server.idle_timeout, headers must arrive within read_header_timeout; no
// ReadTimeout or WriteTimeout, which would cut long streams: the body rate
// and per-write deadlines of openai.Limits bound those.
func (s *Server) httpServer(h http.Handler, lis net.Listener) (*http.Server, net.Listener) {
	sc := s.cfg.Server
	lim := s.limiter()
	return &http.Server{Handler: h, ReadHeaderTimeout: sc.ReadHeaderTimeout, IdleTimeout: sc.IdleTimeout,
		MaxHeaderBytes: 64 << 10, TLSConfig: s.tls.Clone() /* ServeTLS writes its protocols into it: one each */, ConnState: lim.ConnState}, lim.Listener(lis)
}

// guard checks Host and Origin headers for a listener bound to addr.
func (s *Server) guard(addr string) *access.Guard {
	hosts := s.cfg.Server.AllowedHosts
	if len(hosts) == 0 {
		hosts = access.DefaultHosts(addr)
	}
	return &access.Guard{Hosts: hosts, Origins: s.cfg.Server.AllowedOrigins}
}

func plainRefusal(w http.ResponseWriter, r *access.Refusal) { http.Error(w, r.Msg, r.Status) }

// apiLive is the loaded model as the HTTP API sees it (nil while loading).
func (s *Server) apiLive() *openai.Live {
	lv := s.live.Load()
	if lv == nil {
		return nil
	}
	return &openai.Live{RT: lv.rt, Text: lv.text, Vocab: lv.lim.vocab, Context: lv.lim.context, DefaultMaxTokens: lv.lim.defaultMaxTokens,
		Grammar: lv.grammar, GrammarErr: lv.grammarErr, Loaded: lv.loaded}
}

// HTTPAddr is the bound address of the OpenAI-compatible API, "" when
// disabled.
func (s *Server) HTTPAddr() string {
	if s.alis == nil {
		return ""
	}
	return s.alis.Addr().String()
}

// Addr is the bound gRPC address (after Listen).
func (s *Server) Addr() string { return s.lis.Addr().String() }

// MetricsAddr is the bound metrics address, "" when disabled.
func (s *Server) MetricsAddr() string {
	if s.mlis == nil {
		return ""
	}
	return s.mlis.Addr().String()
}

// Ready is closed once the model is loaded and the server is SERVING.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Runtime returns the runtime (nil before the model is loaded).
func (s *Server) Runtime() *sched.Scheduler {
	if lv := s.live.Load(); lv != nil {
		return lv.rt
	}
	return nil
}

// Engine returns the engine (nil before the model is loaded).
func (s *Server) Engine() *engine.Engine {
	if lv := s.live.Load(); lv != nil {
		return lv.eng
	}
	return nil
}

// Serve serves until ctx ends, then shuts down gracefully: health turns
// NOT_SERVING, new requests are refused (UNAVAILABLE), requests in flight
// finish or are aborted when server.drain_timeout passes, and everything is
// closed. It calls Listen if that was not done. It returns the error that
// stopped it (nil after a shutdown asked through ctx).
func (s *Server) Serve(ctx context.Context) error {
	first := false
	s.served.Do(func() { first = true })
	if !first {
		return errors.New("serve: Serve called twice")
	}
	if s.lis == nil {
		if err := s.Listen(); err != nil {
			return err
		}
	}
	errc := make(chan error, 3)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := s.grpc.Serve(s.lis); err != nil {
			errc <- fmt.Errorf("serve: grpc: %w", err)
		}
	}()
	if s.http != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			serve := s.http.Serve
			if s.tls != nil && !s.cfg.Server.MetricsPlaintext { // the same TLS as gRPC and the API
				serve = func(l net.Listener) error { return s.http.ServeTLS(l, "", "") }
			}
			if err := serve(s.mlis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("serve: metrics: %w", err)
			}
		}()
	}
	if s.api != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			serve := s.api.Serve
			if s.tls != nil { // the same TLS (and client CAs) as gRPC
				serve = func(l net.Listener) error { return s.api.ServeTLS(l, "", "") }
			}
			if err := serve(s.alis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("serve: http api: %w", err)
			}
		}()
	}
	s.log.Info().Str("grpc", s.Addr()).Str("http", s.HTTPAddr()).Str("metrics", s.MetricsAddr()).Msg("listening; loading the model (health: NOT_SERVING)")

	var runErr error
	if err := s.load(ctx); err != nil {
		if ctx.Err() == nil { // not a shutdown asked for while loading
			runErr = err
		}
	} else {
		s.setHealth(healthpb.HealthCheckResponse_SERVING)
		close(s.ready)
		lv := s.live.Load()
		s.log.Info().Str("model", lv.model.Source).Int("slots", int(lv.engine.Slots)).Int("context_limit", lv.lim.context).Msg("serving (health: SERVING)")
		select {
		case <-ctx.Done():
			s.log.Info().Msg("shutting down: draining")
		case runErr = <-errc:
		}
	}
	s.shutdown()
	wg.Wait()
	return runErr
}

func (s *Server) load(ctx context.Context) error {
	t0 := time.Now()
	lm, err := s.opts.Load(ctx)
	if err != nil {
		return fmt.Errorf("serve: loading the model: %w", err)
	}
	closeFn := lm.Close
	if closeFn == nil {
		closeFn = func() error { return nil }
	}
	fail := func(err error) error {
		_ = closeFn() // the load failed: that error is the one to report
		return err
	}
	cfg := lm.Config
	rc := s.cfg.Runtime
	def := engine.DefaultsFor(s.cfg.Device)
	rcfg := sched.Config{MaxRunning: rc.MaxRunning, MaxQueue: rc.MaxQueue, MaxBatchTokens: rc.MaxBatchTokens, PrefillChunk: rc.PrefillChunk, ContextLimit: rc.ContextLimit, MaxChoices: rc.MaxChoices}
	if rcfg.PrefillChunk == 0 {
		rcfg.PrefillChunk = def.PrefillChunk
	}
	capSlots := rc.Slots
	if capSlots == 0 {
		capSlots = config.MaxSlots // the planner's; checked again with its slots below
	}
	preCfg := rcfg
	if preCfg.MaxRunning == 0 {
		preCfg.MaxRunning = 1 // the plan's, below
	}
	pre, err := preCfg.WithDefaults(cfg, capSlots) // the configured limits, before the plan
	if err != nil {
		return fail(fmt.Errorf("serve: %w", err))
	}
	if err := s.cfg.CheckModel(cfg); err != nil { // layer indices of captures and adapters
		return fail(fmt.Errorf("serve: %w", err))
	}
	sp := s.cfg.Speculative
	var dflash *model.DFlashCheckpoint
	if sp.DFlash() {
		if dflash, err = openDFlash(sp, cfg, s.cfg.Model.WeightsFor(s.cfg.Device)); err != nil {
			return fail(fmt.Errorf("serve: %w", s.cfg.Explain(&config.KeyError{Key: "speculative.draft_model", Err: err})))
		}
		prev := closeFn
		closeFn = func() error { return errors.Join(dflash.Close(), prev()) }
	} else if sp.On() && !cfg.HasMTP() {
		return fail(fmt.Errorf("serve: %w", s.cfg.Explain(&config.KeyError{Key: "speculative.method", Err: fmt.Errorf("mtp needs the checkpoint's MTP layer, and its config declares none (num_nextn_predict_layers is %d)", cfg.NumNextNPredictLayers)})))
	}
	es := engine.Setup{Model: cfg, Weights: lm.Info, Pipeline: s.opts.Passes, MaxPositions: pre.ContextLimit}
	spans := sp.Steps() // drafts per verify span
	if dflash != nil {
		spans = dflash.DFlashConfig().BlockSize - 1
	}
	if sp.On() {
		es.Rollback = spans + 1 // the longest verify span
	}
	eo := engine.FromConfig(s.cfg, es)
	eo.Planned = true // the stores are made by the memory plan, once the weights are loaded
	if dflash != nil {
		eo.DFlash = dflash
	}
	if s.opts.Engine != nil {
		s.opts.Engine(&eo)
	}
	eng, err := engine.New(cfg, lm.Weights, eo)
	if err != nil {
		return fail(err)
	}
	// The trunk's programs first: their weights are then held, and the
	// memory planner sizes the caches from what is left.
	for _, key := range sched.Programs {
		if _, err := eng.Program(key); err != nil {
			return fail(fmt.Errorf("serve: compiling %s: %w", key, err))
		}
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
	}
	frac := rc.MemoryFraction
	if frac == 0 {
		frac = def.MemoryFraction
	}
	mbt := rc.MaxBatchTokens
	if mbt == 0 {
		mbt = max(def.MaxBatchTokens, rcfg.PrefillChunk)
	}
	mp, err := eng.PlanMemory(engine.MemoryRequest{Fraction: frac, Slots: rc.Slots, MaxRunning: rc.MaxRunning, DefaultSlots: def.Slots,
		ContextLimit: pre.ContextLimit, MaxBatchTokens: mbt}, engine.PlanStores{MTP: sp.On() && dflash == nil})
	if err != nil {
		return fail(fmt.Errorf("serve: %w", err))
	}
	rcfg.MaxRunning, rcfg.MaxBatchTokens = mp.MaxRunning, mp.MaxBatchTokens
	eff, err := rcfg.WithDefaults(cfg, mp.Slots)
	if err != nil {
		return fail(fmt.Errorf("serve: %w", err))
	}
	s.logPlan(mp)
	var programs []engine.Key // the drafter's
	var draft speculative.Drafter
	mtpErr, share := eng.MTPReady(), sp.Share(cfg.IndexShareForMTPIteration) && !sp.DFlash() // index sharing is between MTP draft steps
	if sp.On() {
		if mtpErr != nil && !sp.DFlash() {
			return fail(fmt.Errorf("serve: %w", s.cfg.Explain(&config.KeyError{Key: "speculative.method", Err: fmt.Errorf("mtp: %w", mtpErr)})))
		}
		if s.opts.Drafter != nil {
			if draft, err = s.opts.Drafter(eng, sp); err != nil {
				return fail(fmt.Errorf("serve: %w", err))
			}
			programs = append(programs, sched.SpecProgram(draft))
		} else if sp.DFlash() {
			d, err := speculative.NewDFlash(eng)
			if err != nil {
				return fail(fmt.Errorf("serve: %w", err))
			}
			draft = d
			programs = append(append(programs, sched.SpecProgram(d)), d.Keys()...)
		} else {
			d, err := speculative.NewMTP(eng, speculative.MTPOptions{Steps: sp.Steps(), IndexShare: share})
			if err != nil {
				return fail(fmt.Errorf("serve: %w", err))
			}
			draft = d
			programs = append(append(programs, sched.SpecProgram(d)), d.Keys()...)
		}
		s.log.Info().Str("speculative", sp.String()).Str("drafter", draft.Name()).Bool("index_share", share).Msg("speculative decoding")
	} else if mtpErr != nil && cfg.HasMTP() {
		s.log.Warn().Err(mtpErr).Msg("the config declares an MTP layer the checkpoint cannot run: no MTP drafting")
	}
	// Compile every program the scheduler runs now, not inside a step.
	for _, key := range programs {
		if _, err := eng.Program(key); err != nil {
			return fail(fmt.Errorf("serve: compiling %s: %w", key, err))
		}
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
	}
	rt, err := sched.New(eng, eff, sched.Options{Metrics: s.metrics, Log: s.log, Drafter: draft, SimulateAcceptance: sp.SimulateAcceptance, StepFailed: s.stepFailed})
	if err != nil {
		return fail(err)
	}
	s.metrics.setStore(eng.Store())
	s.metrics.maxRunning.Set(float64(eff.MaxRunning))
	s.metrics.specSimulated.Set(sp.SimulateAcceptance)
	if sp.SimulateAcceptance > 0 {
		s.log.Warn().Float64("simulate_acceptance", sp.SimulateAcceptance).Msg("speculative acceptance is SIMULATED: drafts are accepted by a seeded chain whatever the model says, outputs are not the model's")
	}
	hf, err := cfg.MarshalHF()
	if err != nil {
		rt.Close()
		return fail(err)
	}
	lv := &live{rt: rt, eng: eng, draft: draft, closeFn: closeFn, cfgJSON: hf, text: lm.Text, loaded: time.Now(),
		lim:   limits{vocab: cfg.VocabSize, context: eff.ContextLimit, defaultMaxTokens: rc.DefaultMaxTokens, maxResponse: s.cfg.Server.MaxResponseBytes, text: lm.Text},
		model: withChat(modelInfo(cfg, s.paths(lm.Source), eng.WeightBytes(), hf, mtpErr == nil), lm.Text),
		engine: &pb.EngineInfo{Slots: u32(mp.Slots), MaxRunning: u32(eff.MaxRunning), MaxQueue: u32(eff.MaxQueue), MaxBatchTokens: u32(eff.MaxBatchTokens), PrefillChunk: u32(eff.PrefillChunk), ContextLimit: u32(eff.ContextLimit), DefaultMaxTokens: u32(rc.DefaultMaxTokens),
			Backend: eng.Backend().Info().Backend, Device: eng.Backend().Info().Device, Speculative: sp.String(),
			SpeculativeIndexShare: sp.On() && share, Memory: memoryInfo(mp)},
	}
	if lv.grammar, lv.grammarErr = grammarOf(cfg, lm.Text); lv.grammarErr != nil && lm.Text != nil {
		s.log.Warn().Err(lv.grammarErr).Msg("structured output is off")
	}
	lv.lim.grammar, lv.lim.grammarErr = lv.grammar, lv.grammarErr
	s.live.Store(lv)
	s.log.Info().Str("took", time.Since(t0).Round(time.Millisecond).String()).Str("source", lm.Source).Msg("model loaded")
	return nil
}

func u32(v int) uint32 { return uint32(max(0, v)) }

// logPlan logs the memory plan: what was free, what the pools take and
// what binds the running sequences.
func (s *Server) logPlan(p *engine.MemoryPlan) {
	s.log.Info().Int64("free_bytes", p.Free).Int64("total_bytes", p.Total).Float64("memory_fraction", p.Fraction).
		Int64("budget_bytes", p.Budget).Int64("planned_bytes", p.Planned).Int64("workspace_bytes", p.Workspace).
		Int("kv_pages", p.Pages).Int("page_tokens", p.PageTokens).Int64("page_bytes", p.PageBytes).
		Int("state_slots", p.Slots).Int64("state_slot_bytes", p.SlotBytes).Int("context_sequences", p.ContextSeqs).
		Int("max_running", p.MaxRunning).Int("max_batch_tokens", p.MaxBatchTokens).Str("binding", p.Binding).
		Msg("memory plan")
}

// memoryInfo is the plan as GetModelInfo reports it.
func memoryInfo(p *engine.MemoryPlan) *pb.MemoryPlan {
	u64 := func(v int64) uint64 { return uint64(max(0, v)) }
	return &pb.MemoryPlan{FreeBytes: u64(p.Free), TotalBytes: u64(p.Total), MemoryFraction: p.Fraction, BudgetBytes: u64(p.Budget),
		PlannedBytes: u64(p.Planned), WorkspaceBytes: u64(p.Workspace), KvPages: u32(p.Pages), PageTokens: u32(p.PageTokens),
		PageBytes: u64(p.PageBytes), StateSlots: u32(p.Slots), StateSlotBytes: u64(p.SlotBytes), ContextSequences: u32(p.ContextSeqs),
		Binding: p.Binding}
}

// absPath finds absolute paths in free text and JSON.
var absPath = regexp.MustCompile(`(^|[\s"'(=:,\[])(/[^\s"'(),\[\]]+)`)

// paths hides the absolute paths of str (the model directory, configuration
// and plugin files) behind their last element ("…/engine.yaml"), unless
// server.expose_paths: a client needs no map of the server's disk.
func (s *Server) paths(str string) string {
	if s.cfg.Server.ExposePaths {
		return str
	}
	var b strings.Builder
	last := 0
	for _, m := range absPath.FindAllStringSubmatchIndex(str, -1) {
		b.WriteString(str[last:m[4]])
		b.WriteString("…/" + filepath.Base(str[m[4]:m[5]]))
		last = m[5]
	}
	b.WriteString(str[last:])
	return b.String()
}

// withChat records in mi whether chat requests are served, and why not
// when the chat template failed to load.
func withChat(mi *pb.ModelInfo, tm *text.Model) *pb.ModelInfo {
	if tm != nil {
		mi.Chat = tm.Tok != nil && tm.Chat != nil
		if tm.ChatError != nil {
			mi.ChatTemplateError = tm.ChatError.Error()
		}
	}
	return mi
}

func modelInfo(cfg *model.Config, source string, weightBytes int64, hf []byte, mtpWeights bool) *pb.ModelInfo {
	mi := &pb.ModelInfo{
		ModelType: "glm5_next", Source: source, VocabSize: u32(cfg.VocabSize), HiddenSize: u32(cfg.HiddenSize),
		NumLayers: u32(cfg.NumHiddenLayers), RoutedExperts: u32(cfg.NRoutedExperts), ExpertsPerToken: u32(cfg.NumExpertsPerTok),
		MaxPositionEmbeddings: u32(cfg.MaxPositionEmbeddings), WeightBytes: uint64(max(0, weightBytes)), ConfigJson: string(hf),
		MtpLayers: u32(cfg.NumNextNPredictLayers), MtpWeights: cfg.HasMTP() && mtpWeights,
	}
	for l := 0; l < cfg.NumHiddenLayers; l++ {
		if cfg.IsKDA(l) {
			mi.KdaLayers++
		} else {
			mi.DsaLayers++
		}
		if cfg.IsMoE(l) {
			mi.MoeLayers++
		}
	}
	for _, id := range cfg.EOSTokenIDs {
		mi.EosTokenIds = append(mi.EosTokenIds, int32(id))
	}
	if cfg.Quant != nil {
		mi.Quantization = cfg.Quant.Method
	}
	return mi
}

// shutdown: NOT_SERVING, drain, stop gRPC, close; all within
// server.drain_timeout (each stage gets at least a second to say goodbye),
// even when a forward pass is running.
func (s *Server) shutdown() {
	s.drain.Store(true) // before health says so: a request that sees NOT_SERVING is refused
	s.health.Shutdown() // every service NOT_SERVING, and it stays so
	deadline := time.Now().Add(s.cfg.Server.DrainTimeout)
	rest := func() time.Duration { return max(time.Until(deadline), time.Second) }
	lv := s.live.Load()
	if lv != nil {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		if n := lv.rt.Drain(ctx); n > 0 {
			s.log.Warn().Int("aborted", n).Dur("drain_timeout", s.cfg.Server.DrainTimeout).Msg("drain deadline passed: aborted requests in flight")
		}
		cancel()
	}
	// Handlers end once their requests are final; a client that stopped
	// reading could still hold one, so GracefulStop gets a bounded wait.
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(rest()):
		s.log.Warn().Msg("graceful stop timed out; closing connections")
		s.grpc.Stop()
		<-stopped
	}
	for _, hs := range []*http.Server{s.api, s.http} {
		if hs == nil {
			continue
		}
		// After the drain every API request has its final; a client that
		// stopped reading gets a bounded wait, then its connection closes.
		ctx, cancel := context.WithTimeout(context.Background(), min(rest(), 2*time.Second))
		if err := hs.Shutdown(ctx); err != nil {
			hs.Close()
		}
		cancel()
	}
	if lv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), rest())
		stoppedRT := lv.rt.CloseWithin(ctx)
		cancel()
		if !stoppedRT {
			// the weights stay mapped for the step; the process's exit ends it
			s.log.Warn().Dur("drain_timeout", s.cfg.Server.DrainTimeout).Msg("a forward pass is still running past the drain deadline: not waiting for it")
		} else {
			if lv.draft != nil {
				if err := lv.draft.Close(); err != nil {
					s.log.Warn().Err(err).Msg("closing the drafter")
				}
			}
			if err := lv.closeFn(); err != nil {
				s.log.Warn().Err(err).Msg("closing the model")
			}
		}
	}
	s.log.Info().Msg("stopped")
}

// configHash is the hex SHA-256 of the model's HF JSON, the engine settings
// and the pass report.
func configHash(lv *live, report string) string {
	b, _ := json.Marshal(struct {
		Model  json.RawMessage `json:"model"`
		Engine *pb.EngineInfo  `json:"engine"`
		Passes string          `json:"passes"`
	}{lv.cfgJSON, lv.engine, report})
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// service implements pb.GLMFlashServer.
type service struct {
	pb.UnimplementedGLMFlashServer
	s *Server
}

func (sv *service) live() (*live, error) {
	lv := sv.s.live.Load()
	if lv == nil {
		sv.s.metrics.Refused("unavailable")
		return nil, status.Error(codes.Unavailable, "the model is loading")
	}
	return lv, nil
}

// admitting refuses new work once the drain has begun (the runtime
// refuses it too, from a moment later).
func (sv *service) admitting() error {
	if sv.s.drain.Load() {
		sv.s.metrics.Refused("unavailable")
		return status.Error(codes.Unavailable, "the server is shutting down")
	}
	return nil
}

func (sv *service) invalid(err error) error {
	sv.s.metrics.Refused("invalid_argument")
	return err
}

func (sv *service) refused(err error) error {
	label, st := runtimeStatus(err)
	sv.s.metrics.Refused(label)
	return st
}

func (sv *service) Generate(req *pb.GenerateRequest, stream grpc.ServerStreamingServer[pb.GenerateResponse]) error {
	lv, err := sv.live()
	if err != nil {
		return err
	}
	if err := sv.admitting(); err != nil {
		return err
	}
	ctx := stream.Context()
	r, err := generateRequest(ctx, req, lv.lim)
	if err != nil {
		return sv.invalid(err)
	}
	if r.ID == "" {
		r.ID = sched.NewID()
	}
	r.Owner = access.FromContext(ctx).ID
	clientID := r.ID
	r.ID = access.ScopedID(r.Owner, r.ID) // ids are per key: another key's same id is no collision
	logging.AddFields(ctx, logging.Fields{"request_id", r.ID})
	r.Stops = lv.text.StopWatch(req.GetStop(), lv.rt.EndIDs(r), r.MinTokens, req.SkipSpecialTokens != nil && !req.GetSkipSpecialTokens())
	g, err := lv.rt.SubmitGroup(ctx, r)
	if err != nil {
		return sv.refused(err)
	}
	if err := stream.SendHeader(metadata.Pairs(RequestIDHeader, clientID)); err != nil {
		return err
	}
	send, stopSend := sendWithin(stream, sv.s.cfg.Server.WriteTimeout)
	defer stopSend()
	// The text layer decodes the tokens (and matches stop strings; stop ids
	// and EOS add no text); without a tokenizer its chunks carry ids only.
	// Choices (n > 1) are read at once, each Token and Finish naming its
	// choice.
	var streams []*text.Stream
	for _, h := range g.Choices() {
		ts := text.NewStream(lv.text, h, req.GetStop(), lv.rt.EndIDs(r), func(n int) { _ = lv.rt.Stop(h.ID(), n) })
		ts.StopsAfter(r.MinTokens)
		if req.SkipSpecialTokens != nil && !req.GetSkipSpecialTokens() {
			ts.KeepSpecial()
		}
		streams = append(streams, ts)
	}
	tails := make([]string, len(streams))
	choices := text.Merge(ctx, streams)
	defer choices.Close()
	for {
		it, done, err := choices.Next()
		if err != nil {
			return status.FromContextError(err).Err()
		}
		if done {
			return nil
		}
		i := it.Choice
		if c := it.Chunk; c != nil {
			if len(c.Tokens) == 0 {
				tails[i] += c.Text // released at the end: goes with the finish
				continue
			}
			for j, t := range c.Tokens {
				msg := &pb.Token{Id: t.ID, Logprob: t.Logprob, Index: uint32(t.Index), Choice: uint32(i)}
				if j == len(c.Tokens)-1 {
					msg.Text = c.Text
				}
				for _, a := range t.Top {
					msg.TopLogprobs = append(msg.TopLogprobs, &pb.TokenLogprob{Id: a.ID, Logprob: a.Logprob})
				}
				if err := send(&pb.GenerateResponse{Kind: &pb.GenerateResponse_Token{Token: msg}}); err != nil {
					lv.rt.Abort(g.ID()) // now, not when it would have finished
					sv.s.log.Info().Str("request_id", g.ID()).Err(err).Msg("the client stopped reading: stream closed, request aborted")
					return err
				}
			}
			continue
		}
		tf := it.Final
		f := tf.Final
		var reason pb.FinishReason
		switch f.Reason {
		case sched.FinishStop:
			reason = pb.FinishReason_FINISH_REASON_STOP
		case sched.FinishLength:
			reason = pb.FinishReason_FINISH_REASON_LENGTH
		case sched.FinishAbort:
			reason = pb.FinishReason_FINISH_REASON_ABORT
		case sched.FinishCancelled:
			if err := ctx.Err(); err != nil {
				return status.FromContextError(err).Err()
			}
			reason = pb.FinishReason_FINISH_REASON_ABORT
		default:
			reason = pb.FinishReason_FINISH_REASON_ERROR
		}
		err = send(&pb.GenerateResponse{Kind: &pb.GenerateResponse_Finish{Finish: &pb.Finish{
			RequestId: clientID, Reason: reason, Message: f.Message, Seed: f.Seed, Text: tails[i], Stop: tf.StopString,
			Usage: &pb.Usage{PromptTokens: u32(f.PromptTokens), CompletionTokens: u32(f.CompletionTokens)},
			Timings: &pb.Timings{
				Queue: durationpb.New(f.Queue), TimeToFirstToken: durationpb.New(f.TTFT), Total: durationpb.New(f.Total),
			},
			Speculative: specStats(f.Spec, f.SimulatedAcceptance),
			Choice:      uint32(i),
		}}})
		if err != nil {
			lv.rt.Abort(g.ID())
			return err
		}
	}
}

// sendWithin sends a stream's messages from a goroutine of its own, each
// within d: a client that stops reading blocks Send in flow control (its
// keepalive pings still answered), and would hold the handler and its
// request until it disconnects. After a timeout the handler returns, which
// ends the stream and the blocked Send with it. stop ends the goroutine
// once its Send has returned.
func sendWithin(stream grpc.ServerStreamingServer[pb.GenerateResponse], d time.Duration) (send func(*pb.GenerateResponse) error, stop func()) {
	msgs := make(chan *pb.GenerateResponse)
	sent := make(chan error, 1)
	go func() {
		for m := range msgs {
			sent <- stream.Send(m)
		}
	}()
	t := time.NewTimer(d)
	t.Stop()
	failed := error(nil)
	send = func(m *pb.GenerateResponse) error {
		if failed != nil {
			return failed
		}
		msgs <- m // the goroutine waits for the next message once the last one's result is taken
		t.Reset(d)
		defer t.Stop()
		select {
		case err := <-sent:
			if err != nil {
				failed = err
			}
			return err
		case <-t.C:
			failed = status.Errorf(codes.DeadlineExceeded, "the client read nothing for server.write_timeout (%s): stream closed", d)
			return failed
		}
	}
	return send, func() { close(msgs) }
}

// specStats is a request's speculation for its Finish message (nil when
// the server did not speculate for it), with the rate its acceptance was
// simulated at (0: the model's own).
func specStats(s speculative.Stats, simulated float64) *pb.SpeculativeStats {
	if s.Steps == 0 {
		return nil
	}
	return &pb.SpeculativeStats{VerifySteps: u32(s.Steps), DraftTokens: u32(s.Drafted), AcceptedTokens: u32(s.Accepted), AcceptanceLength: s.AcceptanceLength(),
		SimulatedAcceptance: simulated}
}

func (sv *service) Abort(ctx context.Context, req *pb.AbortRequest) (*pb.AbortResponse, error) {
	lv, err := sv.live()
	if err != nil {
		return nil, err
	}
	if req.GetRequestId() == "" {
		return nil, sv.invalid(badField("request_id", "empty"))
	}
	if err := checkRequestID(req.GetRequestId()); err != nil {
		return nil, sv.invalid(err) // as Generate checks it: no id it could not have started
	}
	p := access.FromContext(ctx)
	// The caller's own id first; an admin may also name another key's
	// request by its server-side id (owner/id, as the logs show it).
	id := req.GetRequestId()
	err = lv.rt.AbortBy(access.ScopedID(p.ID, id), p.ID, p.Admin)
	if errors.Is(err, sched.ErrNotFound) && p.Admin && p.ID != "" {
		err = lv.rt.AbortBy(id, p.ID, true)
		if errors.Is(err, sched.ErrNotFound) { // another key's request by the id its client gave
			ids := lv.rt.Matching(func(sid, owner string) bool { return owner != "" && sid == access.ScopedID(owner, id) })
			switch len(ids) {
			case 0:
			case 1:
				err = lv.rt.AbortBy(ids[0], p.ID, true)
			default:
				slices.Sort(ids)
				return nil, sv.invalid(badField("request_id", "%d callers have a request %q in flight: name one as OWNER/ID (%s)", len(ids), id, strings.Join(ids, ", ")))
			}
		}
	}
	if err != nil {
		_, st := runtimeStatus(err)
		return nil, st
	}
	sv.s.log.Info().Str("request_id", req.GetRequestId()).Msg("abort requested")
	return &pb.AbortResponse{}, nil
}

func (sv *service) GetModelInfo(ctx context.Context, _ *pb.GetModelInfoRequest) (*pb.GetModelInfoResponse, error) {
	lv, err := sv.live()
	if err != nil {
		return nil, err
	}
	report := ""
	if sv.s.opts.PassReport != nil {
		if r := sv.s.opts.PassReport(lv.eng); r != nil {
			b, err := json.Marshal(r)
			if err != nil {
				return nil, status.Errorf(codes.Internal, "pass report: %v", err)
			}
			if string(b) != "null" {
				report = sv.s.paths(string(b))
			}
		}
	}
	return &pb.GetModelInfoResponse{Model: lv.model, Engine: lv.engine, PassReportJson: report, ConfigHash: configHash(lv, report)}, nil
}

func (sv *service) Score(ctx context.Context, req *pb.ScoreRequest) (*pb.ScoreResponse, error) {
	lv, err := sv.live()
	if err != nil {
		return nil, err
	}
	if err := sv.admitting(); err != nil {
		return nil, err
	}
	r, err := scoreRequest(req, lv.lim)
	if err != nil {
		return nil, sv.invalid(err)
	}
	h, err := lv.rt.Submit(ctx, r)
	if err != nil {
		return nil, sv.refused(err)
	}
	_, f, err := h.Wait(ctx)
	if err != nil {
		return nil, status.FromContextError(err).Err()
	}
	switch f.Reason {
	case sched.FinishScored:
		return &pb.ScoreResponse{Rows: u32(f.Rows), VocabSize: u32(f.Vocab), Logits: f.Logits}, nil
	case sched.FinishAbort:
		return nil, status.Error(codes.Unavailable, f.Message)
	case sched.FinishCancelled:
		if err := ctx.Err(); err != nil {
			return nil, status.FromContextError(err).Err()
		}
		return nil, status.Error(codes.Canceled, f.Message)
	}
	return nil, status.Error(codes.Internal, f.Message)
}

// openDFlash opens speculative.draft_model's DFlash drafter (its weights
// held as the model's are) and checks it against the model.
func openDFlash(sp config.Speculative, cfg *model.Config, weights string) (*model.DFlashCheckpoint, error) {
	mode, err := safetensors.ParseMode(weights)
	if err != nil {
		return nil, err
	}
	return model.OpenDFlashFor(sp.DraftModel, cfg, model.OpenOptions{Weights: mode})
}
