package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/grammar"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/core/text"
	"github.com/glmflash/glmflash/model/chat"
	pb "github.com/glmflash/glmflash/proto/glmflash/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// maxRequestID bounds a client-chosen request id.
const maxRequestID = 128

func badField(field, format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "%s: %s", field, fmt.Sprintf(format, args...))
}

// limits are what a request is checked against.
type limits struct {
	vocab            int
	context          int
	defaultMaxTokens int
	maxResponse      int         // bytes of one reply
	text             *text.Model // nil or without a tokenizer: ids only
	// grammar compiles structured output (nil: refused, grammarErr says
	// why).
	grammar    *grammar.Compiler
	grammarErr error
}

// constraintOf compiles a request's structured output (nil: none), whose
// output may take maxTok tokens.
func constraintOf(req *pb.GenerateRequest, lim limits, maxTok int) (sched.Constraint, error) {
	var spec grammar.Spec
	var field string
	switch so := req.GetStructuredOutput().(type) {
	case nil:
		return nil, nil
	case *pb.GenerateRequest_JsonSchema:
		spec, field = grammar.Spec{Kind: grammar.JSONSchema, Text: so.JsonSchema}, "json_schema"
	case *pb.GenerateRequest_JsonObject:
		if !so.JsonObject {
			return nil, nil
		}
		spec, field = grammar.Spec{Kind: grammar.JSONObject}, "json_object"
	case *pb.GenerateRequest_Regex:
		spec, field = grammar.Spec{Kind: grammar.Regex, Text: so.Regex}, "regex"
	case *pb.GenerateRequest_Choice:
		cs := so.Choice.GetChoices()
		if len(cs) == 0 {
			return nil, badField("choice.choices", "give at least one string")
		}
		b, err := json.Marshal(cs)
		if err != nil {
			return nil, badField("choice.choices", "%v", err)
		}
		spec, field = grammar.Spec{Kind: grammar.Choice, Text: string(b)}, "choice"
	}
	if lim.grammar == nil {
		why := "the model has no tokenizer"
		if lim.grammarErr != nil {
			why = lim.grammarErr.Error()
		}
		return nil, badField(field, "structured output is not available: %s", why)
	}
	g, err := lim.grammar.Compile(spec)
	if err != nil {
		return nil, badField(field, "%v", err)
	}
	if maxTok < g.MinTokens() {
		return nil, badField("max_tokens", "the %s output needs at least %d tokens (its shortest text is %d bytes, each a token at worst), got %d", field, g.MinTokens(), g.MinTokens(), maxTok)
	}
	return g.Matcher(), nil
}

func checkIDs(field string, ids []int32, vocab int) error {
	for i, t := range ids {
		if t < 0 || int(t) >= vocab {
			return badField(fmt.Sprintf("%s[%d]", field, i), "token id %d is outside the vocabulary [0, %d)", t, vocab)
		}
	}
	return nil
}

// checkEncoded checks the ids the tokenizer made of a text field (prompt,
// messages): an id outside the model's vocabulary (a tokenizer larger than
// the model) is the field's error, not one of prompt_ids, which the client
// did not send.
func checkEncoded(field string, ids []int32, vocab int) error {
	for i, t := range ids {
		if t < 0 || int(t) >= vocab {
			return badField(field, "the tokenizer gave token id %d (at position %d), outside the model's vocabulary [0, %d)", t, i, vocab)
		}
	}
	return nil
}

// maxChoices bounds GenerateRequest.n before the runtime's own bound is
// asked (so that no conversion overflows): config.MaxSlots, the most
// runtime.max_choices may be.
const maxChoices = config.MaxSlots

func checkRequestID(id string) error {
	if len(id) > maxRequestID {
		return badField("request_id", "longer than %d characters", maxRequestID)
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] > '~' {
			return badField("request_id", "character %d is not printable ASCII (spaces are not allowed either)", i)
		}
	}
	return nil
}

// generateRequest checks a Generate request completely and converts it; the
// error is an INVALID_ARGUMENT status naming the field. Nothing reaches the
// runtime before this passes.
func generateRequest(ctx context.Context, req *pb.GenerateRequest, lim limits) (sched.Request, error) {
	var r sched.Request
	if err := checkRequestID(req.GetRequestId()); err != nil {
		return r, err
	}
	p, err := promptOf(ctx, req, lim)
	if err != nil {
		return r, err
	}
	if len(p) > lim.context {
		return r, badField("prompt_ids", "the prompt has %d tokens, more than the context limit %d", len(p), lim.context)
	}
	maxTok := 0
	if req.MaxTokens != nil {
		mt := req.GetMaxTokens()
		if mt == 0 {
			return r, badField("max_tokens", "must be ≥ 1, got 0")
		}
		if uint64(len(p))+uint64(mt) > uint64(lim.context) {
			return r, badField("max_tokens", "prompt (%d tokens) + max_tokens (%d) exceed the context limit %d", len(p), mt, lim.context)
		}
		maxTok = int(mt)
	} else {
		maxTok = min(lim.defaultMaxTokens, lim.context-len(p))
		if maxTok < 1 {
			return r, badField("prompt_ids", "the prompt (%d tokens) fills the context limit %d: no room to generate", len(p), lim.context)
		}
	}
	if n := len(req.GetStop()); n > text.MaxStops {
		return r, badField("stop", "at most %d stop strings, got %d", text.MaxStops, n)
	}
	for i, st := range req.GetStop() {
		if st == "" || len(st) > text.MaxStopLength {
			return r, badField(fmt.Sprintf("stop[%d]", i), "must be 1 to %d bytes, got %d", text.MaxStopLength, len(st))
		}
	}
	sp, err := samplingParams(req.GetSampling())
	if err != nil {
		return r, err
	}
	if n := len(req.GetStopIds()); n > sched.MaxStopIDs {
		return r, badField("stop_ids", "at most %d ids, got %d", sched.MaxStopIDs, n)
	}
	if err := checkIDs("stop_ids", req.GetStopIds(), lim.vocab); err != nil {
		return r, err
	}
	if n := req.GetTopLogprobs(); n > sched.MaxTopLogprobs {
		return r, badField("top_logprobs", "must be at most %d, got %d", sched.MaxTopLogprobs, n)
	}
	proc, err := processingOf(req.GetSampling(), lim.vocab)
	if err != nil {
		return r, err
	}
	minTok := req.GetSampling().GetMinTokens()
	if uint64(minTok) > uint64(maxTok) {
		return r, badField("sampling.min_tokens", "must be at most max_tokens (%d), got %d", maxTok, minTok)
	}
	n := req.GetN()
	if n > maxChoices { // the configured bound (runtime.max_choices, max_running) is the runtime's: Submit names it
		return r, badField("n", "must be at most %d, got %d", maxChoices, n)
	}
	c, err := constraintOf(req, lim, maxTok)
	if err != nil {
		return r, err
	}
	return sched.Request{
		ID: req.GetRequestId(), Prompt: p, Sampling: sp, StopIDs: req.GetStopIds(), IgnoreEOS: req.GetIgnoreEos(), NoSpeculation: req.GetDisableSpeculation(),
		MaxTokens: maxTok, TopLogprobs: int(req.GetTopLogprobs()), Processing: proc, MinTokens: int(minTok), N: int(n), Constraint: c,
	}, nil
}

// processingOf reads the logits processors of SamplingParams (absent:
// none), each field checked with its name.
func processingOf(s *pb.SamplingParams, vocab int) (sample.Processing, error) {
	var p sample.Processing
	if s == nil {
		return p, nil
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	p.RepetitionPenalty = 1
	if s.RepetitionPenalty != nil {
		p.RepetitionPenalty = s.GetRepetitionPenalty()
		if !finite(p.RepetitionPenalty) || !(p.RepetitionPenalty > 0 && p.RepetitionPenalty <= 100) {
			return p, badField("sampling.repetition_penalty", "must be in (0, 100] (1 is off), got %v", p.RepetitionPenalty)
		}
	}
	p.PresencePenalty = s.GetPresencePenalty()
	if !finite(p.PresencePenalty) || p.PresencePenalty < -2 || p.PresencePenalty > 2 {
		return p, badField("sampling.presence_penalty", "must be in [-2, 2], got %v", p.PresencePenalty)
	}
	p.FrequencyPenalty = s.GetFrequencyPenalty()
	if !finite(p.FrequencyPenalty) || p.FrequencyPenalty < -2 || p.FrequencyPenalty > 2 {
		return p, badField("sampling.frequency_penalty", "must be in [-2, 2], got %v", p.FrequencyPenalty)
	}
	bias := s.GetLogitBias()
	if len(bias) > sample.MaxLogitBias {
		return p, badField("sampling.logit_bias", "at most %d entries, got %d", sample.MaxLogitBias, len(bias))
	}
	if len(bias) > 0 {
		ids := slices.Sorted(maps.Keys(bias)) // the first bad entry by id, whatever the map's order
		p.LogitBias = make(map[int32]float64, len(bias))
		for _, t := range ids {
			b := float64(bias[t])
			if t < 0 || int(t) >= vocab {
				return p, badField("sampling.logit_bias", "token id %d is outside the vocabulary [0, %d)", t, vocab)
			}
			if !finite(b) || b < -100 || b > 100 {
				return p, badField(fmt.Sprintf("sampling.logit_bias[%d]", t), "must be in [-100, 100], got %v", b)
			}
			p.LogitBias[t] = b
		}
	}
	if err := p.Validate(vocab); err != nil { // already checked; kept as a guard
		return p, badField("sampling", "%v", err)
	}
	return p, nil
}

// promptOf reads the prompt: exactly one of prompt_ids, prompt (text) and
// messages (a conversation for the chat template).
func promptOf(ctx context.Context, req *pb.GenerateRequest, lim limits) ([]int32, error) {
	given := 0
	for _, b := range []bool{len(req.GetPromptIds()) > 0, req.GetPrompt() != "", len(req.GetMessages()) > 0} {
		if b {
			given++
		}
	}
	if given != 1 {
		return nil, badField("prompt_ids", "give exactly one of prompt_ids, prompt and messages (got %d)", given)
	}
	switch {
	case req.GetPrompt() != "":
		ids, err := lim.text.EncodePrompt(ctx, req.GetPrompt(), lim.context)
		if err != nil {
			return nil, badField("prompt", "%v", err)
		}
		return ids, checkEncoded("prompt", ids, lim.vocab)
	case len(req.GetMessages()) > 0:
		if len(req.GetMessages()) > maxMessages {
			return nil, badField("messages", "more than %d messages", maxMessages)
		}
		msgs := make([]chat.Message, len(req.GetMessages()))
		for i, m := range req.GetMessages() {
			role, ok := chat.TemplateRole(m.GetRole())
			if !ok {
				return nil, badField(fmt.Sprintf("messages[%d].role", i), "unknown role %q (have %s)", m.GetRole(), strings.Join(chat.Roles, ", "))
			}
			msgs[i] = chat.Message{Role: role, Content: m.GetContent()}
		}
		_, ids, err := lim.text.EncodeChat(ctx, msgs, lim.context)
		if err != nil {
			return nil, badField("messages", "%v", err)
		}
		if len(ids) == 0 {
			return nil, badField("messages", "the chat template rendered an empty prompt")
		}
		return ids, checkEncoded("messages", ids, lim.vocab)
	}
	p := req.GetPromptIds()
	return p, checkIDs("prompt_ids", p, lim.vocab)
}

// maxMessages bounds a conversation.
const maxMessages = 4096

// Defaults of the optional sampling fields.
const (
	DefaultTemperature = 1.0
	DefaultTopP        = 1.0
)

func samplingParams(s *pb.SamplingParams) (sample.Params, error) {
	sp := sample.Params{Temperature: DefaultTemperature, TopP: DefaultTopP}
	if s == nil {
		sp.Seed = rand.Uint64()
		return sp, nil
	}
	if s.Temperature != nil {
		sp.Temperature = s.GetTemperature()
		if !(sp.Temperature >= 0) || math.IsInf(sp.Temperature, 0) {
			return sp, badField("sampling.temperature", "must be a finite value ≥ 0 (0 is greedy), got %v", sp.Temperature)
		}
	}
	if s.TopP != nil {
		sp.TopP = s.GetTopP()
		if !(sp.TopP > 0 && sp.TopP <= 1) {
			return sp, badField("sampling.top_p", "must be in (0, 1], got %v", sp.TopP)
		}
	}
	sp.TopK = int(s.GetTopK())
	if sp.TopK < 0 {
		return sp, badField("sampling.top_k", "must be ≥ 0 (0 is off), got %d", sp.TopK)
	}
	sp.MinP = s.GetMinP()
	if !(sp.MinP >= 0 && sp.MinP < 1) {
		return sp, badField("sampling.min_p", "must be in [0, 1), got %v", sp.MinP)
	}
	if s.Seed != nil {
		sp.Seed = s.GetSeed()
	} else {
		sp.Seed = rand.Uint64()
	}
	return sp, sp.Validate() // already checked; kept as a guard
}

func scoreRequest(req *pb.ScoreRequest, lim limits) (sched.Request, error) {
	ids := req.GetTokenIds()
	if len(ids) == 0 {
		return sched.Request{}, badField("token_ids", "empty")
	}
	if err := checkIDs("token_ids", ids, lim.vocab); err != nil {
		return sched.Request{}, err
	}
	if len(ids) > lim.context {
		return sched.Request{}, badField("token_ids", "%d tokens, more than the context limit %d", len(ids), lim.context)
	}
	rows := 1
	if req.GetAllPositions() {
		rows = len(ids)
	}
	// 4 bytes a logit, and room for the message's framing
	if need := int64(rows)*int64(lim.vocab)*4 + 64; lim.maxResponse > 0 && need > int64(lim.maxResponse) {
		field := "token_ids"
		if req.GetAllPositions() {
			field = "all_positions"
		}
		return sched.Request{}, badField(field, "%d rows × %d logits need %d bytes, more than server.max_response_bytes (%d): score fewer tokens or only the last position", rows, lim.vocab, need, lim.maxResponse)
	}
	return sched.Request{ID: "score-" + sched.NewID(), Prompt: ids, Score: true, AllPositions: req.GetAllPositions()}, nil
}

// runtimeStatus maps a scheduler error to the metrics label of a refused
// request and its gRPC status.
func runtimeStatus(err error) (string, error) {
	var ie *sched.InvalidError
	switch {
	case errors.As(err, &ie):
		return "invalid_argument", status.Error(codes.InvalidArgument, ie.Error())
	case errors.Is(err, sched.ErrQueueFull):
		return "resource_exhausted", status.Error(codes.ResourceExhausted, "the request queue is full; retry later")
	case errors.Is(err, sched.ErrDraining), errors.Is(err, sched.ErrClosed):
		return "unavailable", status.Error(codes.Unavailable, "the server is shutting down")
	case errors.Is(err, sched.ErrDuplicateID):
		return "already_exists", status.Error(codes.AlreadyExists, "request_id: a request with this id is in flight")
	case errors.Is(err, sched.ErrNotFound):
		return "not_found", status.Error(codes.NotFound, "no request with this id is in flight")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "cancelled", status.FromContextError(err).Err()
	}
	return "internal", status.Error(codes.Internal, err.Error())
}
