// Package openai is glmflash's OpenAI-compatible HTTP API, on the same
// runtime (scheduler) as the gRPC server: POST /v1/completions and
// POST /v1/chat/completions (whole responses, or Server-Sent Events with
// "stream": true), GET /v1/models and /v1/models/{id}, vLLM's
// POST /tokenize and /detokenize, GET /metrics (when the server gives its
// handler) and GET /health.
//
// Requests are decoded strictly: an unknown field, a wrong type or a bad
// value is a 400 whose error names the field ("param"); the OpenAI fields
// that change nothing here (store, metadata, user, service_tier) are
// accepted and ignored. An unknown model is a 404, a full wait queue a 429,
// a loading or draining server a 503 (both with Retry-After), in OpenAI's
// error JSON. A client's X-Request-Id (printable ASCII, at most 128 bytes)
// is the request's id, else one is made; either is echoed in the response's
// X-Request-Id. A client that disconnects cancels its request, whose cache
// slot the scheduler frees at its next step. With API keys, every route
// but /health needs one (401 without).
package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/glmflash/glmflash/core/access"
	"github.com/glmflash/glmflash/core/grammar"
	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/core/text"
	"github.com/glmflash/glmflash/core/toolcall"
	"github.com/rs/zerolog"
)

// Live is the loaded model a server generates with.
type Live struct {
	RT               *sched.Scheduler
	Text             *text.Model // nil or without a tokenizer: token-id prompts only
	Vocab            int
	Context          int // prompt + generated tokens
	DefaultMaxTokens int
	// Grammar compiles structured output over the model's vocabulary (nil:
	// structured output is refused, with GrammarErr as the reason).
	Grammar    *grammar.Compiler
	GrammarErr error
	// Loaded is when the model was loaded (the models' "created").
	Loaded time.Time
}

// SimulatedAcceptanceHeader is on every completion and chat response of a
// server whose speculative decoding simulates acceptance
// (speculative.simulate_acceptance): its value is the per-draft rate, and
// the outputs of requests it speculated for are not the model's (their
// usage.completion_tokens_details.simulated_acceptance says so per
// response, when usage is reported).
const SimulatedAcceptanceHeader = "X-Glmflash-Simulated-Acceptance"

// Options are a server's collaborators.
type Options struct {
	// Model is the name clients give in "model" (and /v1/models lists).
	Model string
	// Live returns the loaded model, or nil while loading.
	Live func() *Live
	// Refused counts a refused request by reason (invalid_argument,
	// not_found, resource_exhausted, unavailable); may be nil.
	Refused func(label string)
	// Draining reports a server that is shutting down; may be nil.
	Draining func() bool
	// Keys checks API keys (Authorization: Bearer KEY) on every route but
	// /health; nil (or no keys): everyone is let in.
	Keys *access.Keys
	// MaxBodyBytes bounds a request body (0: DefaultMaxBodyBytes).
	MaxBodyBytes int
	// Limits bound a request's body rate and writes.
	Limits Limits
	// Guard checks Host and Origin headers (nil: loopback names only, no
	// cross-origin calls).
	Guard *access.Guard
	// Metrics, when set, is served at GET /metrics (behind Keys, as every
	// route but /health), as vLLM serves its metrics on the API's port.
	Metrics http.Handler
	Log     zerolog.Logger
}

type server struct {
	o       Options
	started time.Time
}

// New returns the API's handler.
func New(o Options) http.Handler {
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	s := &server{o: o, started: time.Now()}
	auth := func(h http.HandlerFunc) http.Handler { return o.Keys.HTTPRefusing(h, s.unauthorized) }
	mux := http.NewServeMux()
	mux.Handle("POST /v1/completions", auth(withRequestID(s, s.completions)))
	mux.Handle("POST /v1/chat/completions", auth(withRequestID(s, s.chat)))
	mux.Handle("GET /v1/models", auth(s.models))
	mux.Handle("GET /v1/models/{id...}", auth(s.model)) // served names may hold slashes (org/name)
	mux.Handle("POST /tokenize", auth(withRequestID(s, s.tokenize)))
	mux.Handle("POST /detokenize", auth(withRequestID(s, s.detokenize)))
	if o.Metrics != nil {
		mux.Handle("GET /metrics", auth(o.Metrics.ServeHTTP))
	}
	mux.HandleFunc("GET /health", s.health) // no key needed, as for gRPC health checks
	notFound := auth(s.notFound)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { s.noRoute(w, r, notFound) })
	g := o.Guard
	if g == nil {
		g = &access.Guard{Hosts: access.LoopbackHosts}
	}
	return g.HTTP(o.Limits.Bound(mux), func(w http.ResponseWriter, r *access.Refusal) {
		s.fail(w, &apiError{status: r.Status, typ: "invalid_request_error", msg: r.Msg})
	})
}

// routes are the API's paths and the methods each takes (the patterns of
// New): a known path with another method is a 405 with Allow, not a 404.
var routes = map[string][]string{
	"/v1/completions":      {http.MethodPost},
	"/v1/chat/completions": {http.MethodPost},
	"/v1/models":           {http.MethodGet, http.MethodHead},
	"/tokenize":            {http.MethodPost},
	"/detokenize":          {http.MethodPost},
	"/metrics":             {http.MethodGet, http.MethodHead},
	"/health":              {http.MethodGet, http.MethodHead},
}

// noRoute answers what no pattern of New took: 405 with an Allow header for
// a known path (RFC 9110 §15.5.6; the catch-all pattern kept ServeMux from
// doing it; the routes are public, so before the key check, as /health is),
// else notFound.
func (s *server) noRoute(w http.ResponseWriter, r *http.Request, notFound http.Handler) {
	methods, ok := routes[r.URL.Path]
	if !ok && strings.HasPrefix(r.URL.Path, "/v1/models/") {
		methods, ok = routes["/v1/models"]
	}
	if r.URL.Path == "/metrics" && s.o.Metrics == nil {
		ok = false
	}
	if ok {
		allow := strings.Join(methods, ", ")
		w.Header().Set("Allow", allow)
		s.fail(w, &apiError{status: 405, typ: "invalid_request_error", msg: fmt.Sprintf("method %s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, allow)})
		return
	}
	notFound.ServeHTTP(w, r)
}

func (s *server) notFound(w http.ResponseWriter, r *http.Request) {
	have := "POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /v1/models/{id}, POST /tokenize, POST /detokenize, "
	if s.o.Metrics != nil {
		have += "GET /metrics, "
	}
	s.fail(w, &apiError{status: 404, typ: "not_found_error", msg: fmt.Sprintf("no route %s %s (have %sGET /health)", r.Method, r.URL.Path, have)})
}

// unauthorized refuses a request without a valid API key, as OpenAI does.
func (s *server) unauthorized(w http.ResponseWriter, err error) {
	s.fail(w, &apiError{status: 401, typ: "invalid_request_error", code: "invalid_api_key", msg: err.Error()})
}

func (s *server) fail(w http.ResponseWriter, e *apiError) {
	if s.o.Refused != nil {
		switch e.status {
		case 401:
			s.o.Refused("unauthenticated")
		case 400, 405, 408, 413, 415:
			s.o.Refused("invalid_argument")
		case 403, 421:
			s.o.Refused("permission_denied")
		case 404:
			s.o.Refused("not_found")
		case 409:
			s.o.Refused("already_exists")
		case 429:
			s.o.Refused("resource_exhausted")
		case 503:
			s.o.Refused("unavailable")
		}
	}
	if e.status == 408 {
		w.Header().Set("Connection", "close") // the rest of the body will not be read
	}
	switch e.status {
	case 429:
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterQueueFull))
	case 503:
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterUnavailable))
	}
	writeJSON(w, e.status, errorBody(e))
}

func errorBody(e *apiError) map[string]any {
	var param, code any
	if e.param != "" {
		param = e.param
	}
	if e.code != "" {
		code = e.code
	}
	return map[string]any{"error": map[string]any{"message": e.msg, "type": e.typ, "param": param, "code": code}}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

func (s *server) health(w http.ResponseWriter, r *http.Request) {
	lv := s.o.Live()
	if lv == nil {
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterUnavailable))
		writeJSON(w, 503, map[string]string{"status": "loading"})
		return
	}
	if s.o.Draining != nil && s.o.Draining() {
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterUnavailable))
		writeJSON(w, 503, map[string]string{"status": "draining"})
		return
	}
	writeJSON(w, 200, map[string]string{"status": "ok"})
}

// Seconds a refused client is told to wait before it retries (Retry-After):
// a full queue drains as requests finish; a loading model takes longer, and
// a draining server's clients should go to another (a load balancer's
// retry does).
const (
	RetryAfterQueueFull   = 1
	RetryAfterUnavailable = 5
)

// modelObject is the served model as OpenAI's model object: created is when
// it was loaded (the server's start while it loads); max_model_len (vLLM's)
// the context limit once loaded, and vocab_size the vocabulary's (a load
// generator draws random token ids below it: glmflash bench serve).
func (s *server) modelObject() map[string]any {
	m := map[string]any{"id": s.o.Model, "object": "model", "created": s.started.Unix(), "owned_by": "glmflash", "root": s.o.Model}
	lv := s.o.Live()
	if lv == nil {
		return m
	}
	if !lv.Loaded.IsZero() {
		m["created"] = lv.Loaded.Unix()
	}
	m["max_model_len"] = lv.Context
	m["vocab_size"] = lv.Vocab
	if lv.Text != nil {
		// Whether chat completions are served, and if not because the
		// checkpoint's template failed to load, why.
		m["chat"] = lv.Text.Tok != nil && lv.Text.Chat != nil
		if lv.Text.ChatError != nil {
			m["chat_template_error"] = lv.Text.ChatError.Error()
		}
	}
	return m
}

func (s *server) models(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, 200, map[string]any{"object": "list", "data": []any{s.modelObject()}})
}

// model is GET /v1/models/{id}: the served model, or a 404 in OpenAI's
// shape for another id.
func (s *server) model(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if id != s.o.Model {
		s.fail(w, &apiError{status: 404, typ: "invalid_request_error", param: "model", code: "model_not_found",
			msg: fmt.Sprintf("The model %q does not exist (this server serves %q)", id, s.o.Model)})
		return
	}
	writeJSON(w, 200, s.modelObject())
}

// live returns the loaded model and the request limits, or a 503.
func (s *server) live() (*Live, limits, *apiError) {
	lv := s.o.Live()
	if lv == nil {
		return nil, limits{}, &apiError{status: 503, typ: "service_unavailable", msg: "the model is loading"}
	}
	if s.o.Draining != nil && s.o.Draining() {
		return nil, limits{}, &apiError{status: 503, typ: "service_unavailable", msg: "the server is shutting down"}
	}
	return lv, limits{vocab: lv.Vocab, context: lv.Context, defaultMaxTokens: lv.DefaultMaxTokens}, nil
}

func (s *server) checkModel(name string) *apiError {
	if name != "" && name != s.o.Model {
		return &apiError{status: 404, typ: "not_found_error", param: "model", code: "model_not_found", msg: fmt.Sprintf("model: %q is not served here (this server serves %q)", name, s.o.Model)}
	}
	return nil
}

// submitError maps a runtime refusal to its status; a refused field is
// named in this API's spelling (apiField).
func submitError(err error, isChat bool) *apiError {
	var ie *sched.InvalidError
	switch {
	case errors.As(err, &ie):
		return badField(apiField(ie.Field, isChat), "%s", ie.Msg)
	case errors.Is(err, sched.ErrDuplicateID):
		return &apiError{status: 409, typ: "invalid_request_error", param: "X-Request-Id", code: "duplicate_request_id", msg: "X-Request-Id: a request with this id is in flight"}
	case errors.Is(err, sched.ErrQueueFull):
		return &apiError{status: 429, typ: "rate_limit_error", code: "queue_full", msg: "the request queue is full; retry later"}
	case errors.Is(err, sched.ErrDraining), errors.Is(err, sched.ErrClosed):
		return &apiError{status: 503, typ: "service_unavailable", msg: "the server is shutting down"}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &apiError{status: 499, typ: "cancelled", msg: err.Error()}
	}
	return &apiError{status: 500, typ: "server_error", msg: err.Error()}
}

// apiField turns a runtime field (the gRPC API's spelling: sampling.top_p,
// stop_ids[2], prompt_ids[3], logit_bias[7]) into this API's (top_p,
// stop_token_ids[2], prompt[3], or messages for a chat, whose ids the
// client did not send, logit_bias["7"]).
func apiField(field string, isChat bool) string {
	name, index, _ := strings.Cut(field, "[")
	if index != "" {
		index = "[" + index
	}
	switch name {
	case "stop_ids":
		return "stop_token_ids" + index
	case "prompt_ids":
		if isChat {
			return "messages"
		}
		return "prompt" + index
	case "logit_bias":
		if id, ok := strings.CutSuffix(strings.TrimPrefix(index, "["), "]"); ok {
			return fmt.Sprintf("logit_bias[%q]", id)
		}
	}
	return strings.TrimPrefix(field, "sampling.")
}

func (s *server) completions(w http.ResponseWriter, r *http.Request) {
	if e := jsonBody(r); e != nil {
		s.fail(w, e)
		return
	}
	lv, lim, e := s.live()
	if e != nil {
		s.fail(w, e)
		return
	}
	var req completionRequest
	if e := decode(http.MaxBytesReader(w, r.Body, int64(s.o.MaxBodyBytes)+1), &req, s.o.MaxBodyBytes); e != nil {
		s.fail(w, e)
		return
	}
	if e := s.checkModel(req.Model); e != nil {
		s.fail(w, e)
		return
	}
	p, e := checkCompletion(r.Context(), &req, lv.Text, lim, lv)
	if e != nil {
		s.fail(w, e)
		return
	}
	s.run(w, r, lv, p, false)
}

func (s *server) chat(w http.ResponseWriter, r *http.Request) {
	if e := jsonBody(r); e != nil {
		s.fail(w, e)
		return
	}
	lv, lim, e := s.live()
	if e != nil {
		s.fail(w, e)
		return
	}
	var req chatRequest
	if e := decode(http.MaxBytesReader(w, r.Body, int64(s.o.MaxBodyBytes)+1), &req, s.o.MaxBodyBytes); e != nil {
		s.fail(w, e)
		return
	}
	if e := s.checkModel(req.Model); e != nil {
		s.fail(w, e)
		return
	}
	p, e := checkChat(r.Context(), &req, lv.Text, lim, lv)
	if e != nil {
		s.fail(w, e)
		return
	}
	s.run(w, r, lv, p, true)
}

// run submits a checked request and writes its response, whole or as SSE:
// one choice per sched.Group choice (n), each read by its own text stream
// and parsed by its own parsers (choices.go).
func (s *server) run(w http.ResponseWriter, r *http.Request, lv *Live, p params, isChat bool) {
	ctx := r.Context() // ends when the client goes away: the runtime cancels the request
	id := requestIDOf(ctx)
	p.req.Owner = access.FromContext(ctx).ID // only this key (or an admin) may Abort it over gRPC
	p.req.ID = access.ScopedID(p.req.Owner, id)
	p.req.Stops = lv.Text.StopWatch(p.stops, lv.RT.EndIDs(p.req), p.req.MinTokens, !p.skipSpecial)
	g, err := lv.RT.SubmitGroup(ctx, p.req)
	if err != nil {
		s.fail(w, submitError(err, isChat))
		return
	}
	if sim := lv.RT.SimulatedAcceptance(); sim > 0 { // the server's speculative.simulate_acceptance: outputs may not be the model's
		w.Header().Set(SimulatedAcceptanceHeader, strconv.FormatFloat(sim, 'g', -1, 64))
	}
	out := &response{s: s, w: w, lv: lv, p: p, chat: isChat, created: time.Now().Unix()}
	if isChat {
		out.id = "chatcmpl-" + id
	} else {
		out.id = "cmpl-" + id
	}
	var streams []*text.Stream
	for _, h := range g.Choices() {
		// A stop string ends the choice as stopped (finish_reason, metrics
		// and logs say stop), not aborted.
		st := text.NewStream(lv.Text, h, p.stops, lv.RT.EndIDs(p.req), func(n int) { _ = lv.RT.Stop(h.ID(), n) })
		st.StopsAfter(p.req.MinTokens) // min_tokens: no stop string before either
		if !p.skipSpecial {
			st.KeepSpecial()
		}
		streams = append(streams, st)
		co := &choiceOut{}
		if isChat {
			co.parse = newChatOut(&p)
		}
		out.choices = append(out.choices, co)
	}
	if p.stream {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(200)
		if isChat {
			for i := range out.choices {
				out.event(i, map[string]any{"role": "assistant", "content": ""}, nil, nil)
			}
		} else {
			out.flush() // the client has the request id (to abort it) at once
		}
	}
	if !out.read(ctx, streams, func() { lv.RT.Abort(g.ID()) }) {
		return // the client went away; the runtime frees the slots
	}
	if out.ended {
		return
	}
	if out.err != nil {
		// A write failed (the client stopped reading for server.write_timeout,
		// or left): the request ends now, not when it would have finished.
		lv.RT.Abort(g.ID())
		s.o.Log.Info().Str("request_id", g.ID()).Err(out.err).Msg("the client stopped reading: stream closed, request aborted")
		return
	}
	out.finish()
}

// response accumulates (or streams) one request's output.
type response struct {
	s       *server
	w       http.ResponseWriter
	lv      *Live
	p       params
	chat    bool
	id      string
	created int64
	choices []*choiceOut
	err     error // the first failed write of a stream
	ended   bool  // a stream ended early, with an error event
}

// choiceOut is one choice's output so far.
type choiceOut struct {
	text   strings.Builder
	offset int   // bytes of text the tokens so far make (legacy text_offset)
	lp     []any // chat: content logprobs; completions: see legacy
	legacy legacyLogprobs
	final  *text.Final
	reason string // its finish_reason, once final
	// chat: the output's parsers, and what they gave (whole responses)
	parse     *chatOut
	reasoning strings.Builder
	deltas    []toolcall.Delta
	calls     int // tool calls started
}

type legacyLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

func (o *response) logprobsOf(co *choiceOut, toks []sched.Token) (any, bool) {
	if !o.p.logprobs || len(toks) == 0 {
		return nil, false
	}
	if o.chat {
		var content []any
		for _, t := range toks {
			s, b := o.lv.Text.TokenText(t.ID)
			item := map[string]any{"token": s, "logprob": finite(t.Logprob), "bytes": byteList(b)}
			top := []any{}
			for _, a := range t.Top {
				as, ab := o.lv.Text.TokenText(a.ID)
				top = append(top, map[string]any{"token": as, "logprob": finite(a.Logprob), "bytes": byteList(ab)})
			}
			item["top_logprobs"] = top
			content = append(content, item)
		}
		return content, true
	}
	var l legacyLogprobs
	for _, t := range toks {
		s, b := o.lv.Text.TokenText(t.ID)
		l.Tokens = append(l.Tokens, s)
		l.TokenLogprobs = append(l.TokenLogprobs, finite(t.Logprob))
		top := map[string]float64{}
		for _, a := range t.Top {
			as, _ := o.lv.Text.TokenText(a.ID)
			top[as] = finite(a.Logprob)
		}
		l.TopLogprobs = append(l.TopLogprobs, top)
		// text_offset is where the token's first byte is in the text: the
		// text is the tokens' bytes, so it advances by those, not by the
		// token's shown string (a token holding part of a UTF-8 sequence
		// shows as U+FFFD, 3 bytes, and pointed past the text, issue 37).
		l.TextOffset = append(l.TextOffset, co.offset)
		co.offset += len(b)
	}
	return l, true
}

func byteList(b []byte) []int {
	out := make([]int, len(b))
	for i, c := range b {
		out[i] = int(c)
	}
	return out
}

func (o *response) add(i int, c *text.Chunk) {
	co := o.choices[i]
	lp, has := o.logprobsOf(co, c.Tokens)
	if o.chat {
		o.addChat(i, co.parse.feed(c.Text, false), lp, has)
		return
	}
	if !o.p.stream {
		co.text.WriteString(c.Text)
		if has {
			l := lp.(legacyLogprobs)
			co.legacy.Tokens = append(co.legacy.Tokens, l.Tokens...)
			co.legacy.TokenLogprobs = append(co.legacy.TokenLogprobs, l.TokenLogprobs...)
			co.legacy.TopLogprobs = append(co.legacy.TopLogprobs, l.TopLogprobs...)
			co.legacy.TextOffset = append(co.legacy.TextOffset, l.TextOffset...)
		}
		return
	}
	if c.Text == "" && !has {
		return
	}
	o.event(i, c.Text, lp, nil)
}

// addChat takes a chat choice's parsed output (and the logprobs of the
// tokens that made it): whole responses keep it, streams send each piece
// as a delta, the logprobs on the first (or on an empty content delta).
func (o *response) addChat(i int, pieces []outPiece, lp any, has bool) {
	co := o.choices[i]
	for _, pc := range pieces {
		if pc.delta.Call && pc.delta.ID != "" {
			co.calls++
		}
	}
	if !o.p.stream {
		for _, pc := range pieces {
			if pc.reasoning != "" {
				co.reasoning.WriteString(pc.reasoning)
				continue
			}
			co.deltas = append(co.deltas, pc.delta)
		}
		if has {
			co.lp = append(co.lp, lp.([]any)...)
		}
		return
	}
	var lpv any
	if has {
		lpv = map[string]any{"content": lp}
	}
	if len(pieces) == 0 && has {
		o.event(i, map[string]any{"content": ""}, lpv, nil)
		return
	}
	for _, pc := range pieces {
		o.event(i, chatDelta(pc), lpv, nil)
		lpv = nil
	}
}

// chatDelta is a piece of output as a streamed chat delta.
func chatDelta(pc outPiece) map[string]any {
	d := pc.delta
	switch {
	case pc.reasoning != "":
		return map[string]any{"reasoning_content": pc.reasoning}
	case !d.Call:
		return map[string]any{"content": d.Content}
	case d.ID != "":
		return map[string]any{"tool_calls": []any{map[string]any{"index": d.Index, "id": d.ID, "type": "function", "function": map[string]any{"name": d.Name, "arguments": d.Arguments}}}}
	}
	return map[string]any{"tool_calls": []any{map[string]any{"index": d.Index, "function": map[string]any{"arguments": d.Arguments}}}}
}

func finishReason(f *text.Final) (string, *apiError) {
	switch f.Reason {
	case sched.FinishStop:
		return "stop", nil
	case sched.FinishLength:
		return "length", nil
	case sched.FinishAbort:
		return "abort", nil
	case sched.FinishCancelled:
		return "abort", nil
	}
	return "", &apiError{status: 500, typ: "server_error", msg: "generation failed: " + f.Message}
}

// message is a whole chat response's message of a choice: content (null
// when the turn is only tool calls), reasoning_content (with a reasoning
// parser: null when there was none) and tool_calls.
func (co *choiceOut) message() map[string]any {
	content, calls := toolcall.Collect(co.deltas)
	m := map[string]any{"role": "assistant", "content": content}
	if content == "" && len(calls) > 0 {
		m["content"] = nil
	}
	if co.parse.think != nil {
		m["reasoning_content"] = nil
		if r := co.reasoning.String(); r != "" {
			m["reasoning_content"] = r
		}
	}
	if len(calls) > 0 {
		list := make([]any, len(calls))
		for i, c := range calls {
			list[i] = map[string]any{"id": c.ID, "type": "function", "function": map[string]any{"name": c.Name, "arguments": c.Arguments}}
		}
		m["tool_calls"] = list
	}
	return m
}

// usage is OpenAI's usage object: the prompt once, the choices'
// completions summed; a request the server speculated for reports its
// drafts as OpenAI's predicted outputs do (completion_tokens_details:
// accepted and rejected prediction tokens), and, when its acceptance was
// simulated (speculative.simulate_acceptance), the per-draft rate
// (completion_tokens_details.simulated_acceptance, glmflash's own field).
func (o *response) usage() map[string]any {
	prompt, completion, accepted, drafted, steps := 0, 0, 0, 0, 0
	simulated := 0.0
	for _, co := range o.choices {
		f := co.final
		prompt = f.PromptTokens
		completion += f.CompletionTokens
		accepted, drafted, steps = accepted+f.Spec.Accepted, drafted+f.Spec.Drafted, steps+f.Spec.Steps
		simulated = max(simulated, f.SimulatedAcceptance)
	}
	u := map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
	if steps > 0 {
		d := map[string]any{"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": drafted - accepted}
		if simulated > 0 { // speculative.simulate_acceptance: the output is not the model's
			d["simulated_acceptance"] = simulated
		}
		u["completion_tokens_details"] = d
	}
	return u
}

// event writes one SSE chunk of choice i: a chat delta or a completion's
// text.
func (o *response) event(i int, delta any, logprobs any, reason any) {
	choice := map[string]any{"index": i, "logprobs": logprobs, "finish_reason": reason}
	obj := "text_completion"
	if o.chat {
		choice["delta"] = delta
		obj = "chat.completion.chunk"
	} else {
		choice["text"] = delta
	}
	o.sse(map[string]any{"id": o.id, "object": obj, "created": o.created, "model": o.s.o.Model, "choices": []any{choice}})
}

func (o *response) sse(v any) {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
	if o.err != nil {
		return
	}
	if _, err := fmt.Fprintf(o.w, "data: %s\n", b.String()); err != nil { // Encode ended the line
		o.err = err
		return
	}
	o.flush()
}

// flush sends what a stream has written (within its write deadline).
func (o *response) flush() {
	if o.err != nil {
		return
	}
	if err := http.NewResponseController(o.w).Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		o.err = err
	}
}

// finished takes choice i's final: what its parsers held is written (or
// kept) and, in a stream, its finish event. It returns the failure a final
// that is an error makes.
func (o *response) finished(i int) *apiError {
	co := o.choices[i]
	reason, e := finishReason(co.final)
	if e != nil {
		return e
	}
	if o.chat {
		o.addChat(i, co.parse.feed("", true), nil, false) // what the parsers held
		if co.calls > 0 && reason == "stop" {
			reason = "tool_calls"
		}
	}
	co.reason = reason
	if !o.p.stream {
		return nil
	}
	if o.chat {
		o.event(i, map[string]any{}, nil, reason)
	} else {
		o.event(i, "", nil, reason)
	}
	return nil
}

// finish ends the response once every choice has its final: the usage
// and [DONE] of a stream, or the whole response.
func (o *response) finish() {
	if o.p.stream {
		if o.p.includeUsage {
			obj := "text_completion"
			if o.chat {
				obj = "chat.completion.chunk"
			}
			o.sse(map[string]any{"id": o.id, "object": obj, "created": o.created, "model": o.s.o.Model, "choices": []any{}, "usage": o.usage()})
		}
		o.done()
		return
	}
	choices := make([]any, len(o.choices))
	for i, co := range o.choices {
		if _, e := finishReason(co.final); e != nil {
			o.s.fail(o.w, e)
			return
		}
		choice := map[string]any{"index": i, "finish_reason": co.reason, "logprobs": nil}
		if o.chat {
			choice["message"] = co.message()
			if o.p.logprobs {
				content := co.lp
				if content == nil {
					content = []any{}
				}
				choice["logprobs"] = map[string]any{"content": content}
			}
		} else {
			choice["text"] = co.text.String()
			if o.p.logprobs {
				choice["logprobs"] = co.legacy
			}
		}
		choices[i] = choice
	}
	obj := "text_completion"
	if o.chat {
		obj = "chat.completion"
	}
	writeJSON(o.w, 200, map[string]any{"id": o.id, "object": obj, "created": o.created, "model": o.s.o.Model, "choices": choices, "usage": o.usage()})
}

// done ends a stream: [DONE], flushed.
func (o *response) done() {
	if o.err == nil {
		if _, err := fmt.Fprint(o.w, "data: [DONE]\n\n"); err != nil {
			o.err = err
		}
	}
	o.flush()
}
