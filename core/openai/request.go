package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/glmflash/glmflash/core/reasoning"
	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/core/text"
	"github.com/glmflash/glmflash/core/toolcall"
	"github.com/glmflash/glmflash/model/chat"
)

// DefaultMaxBodyBytes bounds a request body when Options.MaxBodyBytes is 0
// (the server passes its server.max_request_bytes).
const DefaultMaxBodyBytes = 4 << 20

// maxMessages bounds a chat conversation.
const maxMessages = 4096

// maxChoices bounds "n" before the runtime's own bound (runtime.max_choices
// within max_running) is asked: OpenAI's own limit.
const maxChoices = 128

// apiError is an error a client caused (or a state it met): an HTTP status
// and OpenAI's error object.
type apiError struct {
	status int
	typ    string // invalid_request_error, not_found_error, …
	param  string // the field, for 400s
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func badField(field, format string, args ...any) *apiError {
	return &apiError{status: 400, typ: "invalid_request_error", param: field, msg: field + ": " + fmt.Sprintf(format, args...)}
}

// common are the fields both endpoints take.
type common struct {
	Model            string         `json:"model"`
	MaxTokens        *int64         `json:"max_tokens"`
	Temperature      *float64       `json:"temperature"`
	TopP             *float64       `json:"top_p"`
	Seed             *int64         `json:"seed"`
	Stop             stopList       `json:"stop"`
	N                *int64         `json:"n"`
	Stream           bool           `json:"stream"`
	StreamOptions    *streamOptions `json:"stream_options"`
	PresencePenalty  *float64       `json:"presence_penalty"`
	FrequencyPenalty *float64       `json:"frequency_penalty"`
	// LogitBias maps token ids (as strings, OpenAI's form) to a bias in
	// [−100, 100] added to their logits.
	LogitBias map[string]float64 `json:"logit_bias"`

	// vLLM's extra sampling fields.
	TopK              *int64   `json:"top_k"`
	MinP              *float64 `json:"min_p"`
	RepetitionPenalty *float64 `json:"repetition_penalty"`
	MinTokens         *int64   `json:"min_tokens"`
	StopTokenIDs      []int64  `json:"stop_token_ids"`
	// SkipSpecialTokens leaves special tokens' text out of the output
	// (default true, as vLLM).
	SkipSpecialTokens *bool `json:"skip_special_tokens"`
	// IgnoreEOS goes on past the model's end-of-sequence ids (vLLM's extra
	// field); by default they end generation with finish_reason "stop".
	IgnoreEOS bool `json:"ignore_eos"`
	// The structured output constraint (response_format, vLLM's guided_*
	// and structured_outputs).
	structured

	// Accepted and ignored, as vLLM does: they change nothing here (no
	// stored completions, no billing tiers), but OpenAI's SDKs send them.
	// They are still checked for their type and OpenAI's bounds.
	User        string            `json:"user"`
	Store       *bool             `json:"store"`
	Metadata    map[string]string `json:"metadata"`
	ServiceTier *string           `json:"service_tier"`
}

// Bounds of the accepted-and-ignored fields (OpenAI's).
const (
	maxUser          = 512 // bytes of user (OpenAI recommends a hash of an id)
	maxMetadataPairs = 16
	maxMetadataKey   = 64
	maxMetadataValue = 512
)

// maxServiceTier bounds service_tier: OpenAI's tiers (auto, default, flex,
// scale, priority, fast, …) grow, and it is ignored here, so any tier name
// (lower-case letters and _) is accepted.
const maxServiceTier = 32

type streamOptions struct {
	IncludeUsage       bool  `json:"include_usage"`
	IncludeObfuscation *bool `json:"include_obfuscation"` // accepted; there is nothing to obfuscate
}

// stopList is "stop": a string, a list of strings, or null.
type stopList []string

// UnmarshalJSON reads "stop"; a wrong type is a *json.UnmarshalTypeError,
// which the decoder completes with the field's path ("stop", "stop.1"), so
// that the error names the field (issue 37: it named none).
func (s *stopList) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = stopList{one}
		return nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(b, &items); err != nil {
		return &json.UnmarshalTypeError{Value: jsonKind(b), Type: reflect.TypeFor[stopList]()}
	}
	many := make([]string, len(items))
	for i, it := range items {
		if err := json.Unmarshal(it, &many[i]); err != nil {
			return &json.UnmarshalTypeError{Value: jsonKind(it), Type: reflect.TypeFor[string](), Field: strconv.Itoa(i)}
		}
	}
	*s = many
	return nil
}

// jsonKind names the kind of a JSON value for errors (as the decoder's
// UnmarshalTypeError.Value does).
func jsonKind(b []byte) string {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 {
		return "nothing"
	}
	switch b[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "bool"
	case 'n':
		return "null"
	}
	return "number"
}

// wantOf says what a field of type t takes, in JSON's words (not Go's).
func wantOf(t reflect.Type) string {
	if t == reflect.TypeFor[stopList]() {
		return "a string or a list of strings"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return "a JSON value of another type"
}

// fieldPath turns the decoder's dotted field path into the request's
// notation: "common.stop.1" → "stop[1]"; the decoder does not know list
// indices of struct fields ("messages.role"), only those an UnmarshalJSON
// reported.
func fieldPath(f string) string {
	var b strings.Builder
	for i, part := range strings.Split(strings.TrimPrefix(f, "common."), ".") {
		if part == "common" {
			continue
		}
		if _, err := strconv.Atoi(part); err == nil {
			b.WriteString("[" + part + "]")
			continue
		}
		if i > 0 && b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(part)
	}
	return b.String()
}

// completionRequest is POST /v1/completions.
type completionRequest struct {
	common
	Prompt   json.RawMessage `json:"prompt"`
	Logprobs *int64          `json:"logprobs"`
	Echo     bool            `json:"echo"`
}

// chatRequest is POST /v1/chat/completions.
type chatRequest struct {
	common
	Messages            []chatMessage   `json:"messages"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	Logprobs            bool            `json:"logprobs"`
	TopLogprobs         *int64          `json:"top_logprobs"`
	Tools               []toolParam     `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	ParallelToolCalls   *bool           `json:"parallel_tool_calls"`
	// ChatTemplateKwargs are extra variables of the chat template
	// (enable_thinking …), as vLLM takes them.
	ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs"`
}

type chatMessage struct {
	Role             string            `json:"role"`
	Content          json.RawMessage   `json:"content"`
	Name             string            `json:"name"`
	ToolCalls        []messageToolCall `json:"tool_calls"`
	ToolCallID       string            `json:"tool_call_id"`
	ReasoningContent *string           `json:"reasoning_content"`
}

// decode reads a JSON body of at most limit bytes strictly: an unknown
// field, a wrong type or trailing data is a 400 naming the field, a larger
// body a 413.
func decode(r io.Reader, v any, limit int) *apiError {
	b, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) || len(b) > limit {
		return &apiError{status: 413, typ: "invalid_request_error", msg: fmt.Sprintf("the body is larger than %d bytes (server.max_request_bytes)", limit)}
	}
	if errors.Is(err, errBodyTimeout) {
		return &apiError{status: 408, typ: "invalid_request_error", msg: "reading the body: " + err.Error()}
	}
	if err != nil {
		return &apiError{status: 400, typ: "invalid_request_error", msg: "reading the body: " + err.Error()}
	}
	if k := jsonKind(b); k != "object" {
		return &apiError{status: 400, typ: "invalid_request_error", param: "body", msg: fmt.Sprintf("body: the request must be a JSON object, got JSON %s", k)}
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &te):
			f := fieldPath(te.Field)
			if f == "" {
				f = "body"
			}
			return badField(f, "want %s, got JSON %s", wantOf(te.Type), te.Value)
		case errors.As(err, &se):
			return &apiError{status: 400, typ: "invalid_request_error", msg: fmt.Sprintf("the body is not JSON: %v (offset %d)", se, se.Offset)}
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			f := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return badField(f, "unknown field")
		}
		// A field's own UnmarshalJSON failed ("stop": …).
		var me *json.MarshalerError
		if errors.As(err, &me) {
			return badField("body", "%v", err)
		}
		msg := err.Error()
		if i := strings.Index(msg, "Go struct field "); i >= 0 {
			f := msg[i+len("Go struct field "):]
			if j := strings.IndexAny(f, " "); j >= 0 {
				f = f[:j]
			}
			if k := strings.Index(f, "."); k >= 0 {
				f = f[k+1:]
			}
			return badField(strings.ToLower(f), "%s", msg)
		}
		return &apiError{status: 400, typ: "invalid_request_error", msg: "the body: " + msg}
	}
	if d.More() {
		return &apiError{status: 400, typ: "invalid_request_error", msg: "the body has data after the JSON object"}
	}
	return nil
}

// limits are what a request is checked against.
type limits struct {
	vocab, context, defaultMaxTokens int
}

// params are a request's checked generation settings.
type params struct {
	req          sched.Request
	stops        []string
	stream       bool
	includeUsage bool
	logprobs     bool
	topLogprobs  int
	// chat: the request's tools (nil: none), the reasoning parser and
	// whether the prompt opened a reasoning block.
	tools            *toolcall.Spec
	reasoningFormat  string
	promptOpensThink bool
	skipSpecial      bool // leave special tokens' text out (skip_special_tokens)
}

// finiteIn reports whether v is a number in [lo, hi].
func finiteIn(v, lo, hi float64) bool { return !math.IsNaN(v) && v >= lo && v <= hi }

// processing checks the logits processors' fields (vLLM's ranges) and
// builds them: repetition_penalty in (0, 100] (1 is off),
// presence_penalty and frequency_penalty in [−2, 2], logit_bias token ids
// of the vocabulary with biases in [−100, 100] (a bias of 0 changes
// nothing and is left out).
func (c *common) processing(lim limits) (sample.Processing, *apiError) {
	var pr sample.Processing
	if c.RepetitionPenalty != nil {
		v := *c.RepetitionPenalty
		if !(v > 0) || !finiteIn(v, 0, 100) {
			return pr, badField("repetition_penalty", "must be in (0, 100] (1 is off), got %v", v)
		}
		pr.RepetitionPenalty = v
	}
	if c.PresencePenalty != nil {
		if !finiteIn(*c.PresencePenalty, -2, 2) {
			return pr, badField("presence_penalty", "must be in [-2, 2], got %v", *c.PresencePenalty)
		}
		pr.PresencePenalty = *c.PresencePenalty
	}
	if c.FrequencyPenalty != nil {
		if !finiteIn(*c.FrequencyPenalty, -2, 2) {
			return pr, badField("frequency_penalty", "must be in [-2, 2], got %v", *c.FrequencyPenalty)
		}
		pr.FrequencyPenalty = *c.FrequencyPenalty
	}
	if len(c.LogitBias) > sample.MaxLogitBias {
		return pr, badField("logit_bias", "at most %d entries, got %d", sample.MaxLogitBias, len(c.LogitBias))
	}
	for k, b := range c.LogitBias {
		f := fmt.Sprintf("logit_bias[%q]", k)
		id, err := strconv.ParseInt(k, 10, 32)
		if err != nil || strconv.FormatInt(id, 10) != k {
			return pr, badField(f, "the key must be a token id (a decimal integer), got %q", k)
		}
		if id < 0 || id >= int64(lim.vocab) {
			return pr, badField(f, "token id %d is outside the vocabulary [0, %d)", id, lim.vocab)
		}
		if !finiteIn(b, -100, 100) {
			return pr, badField(f, "the bias must be in [-100, 100], got %v", b)
		}
		if b == 0 {
			continue
		}
		if pr.LogitBias == nil {
			pr.LogitBias = map[int32]float64{}
		}
		pr.LogitBias[int32(id)] = b
	}
	return pr, nil
}

// stopTokenIDs checks stop_token_ids: ids of the vocabulary that end
// generation with finish_reason "stop" (their text is not output).
func (c *common) stopTokenIDs(lim limits) ([]int32, *apiError) {
	if len(c.StopTokenIDs) > sched.MaxStopIDs {
		return nil, badField("stop_token_ids", "at most %d ids, got %d", sched.MaxStopIDs, len(c.StopTokenIDs))
	}
	var ids []int32
	for i, id := range c.StopTokenIDs {
		if id < 0 || id >= int64(lim.vocab) {
			return nil, badField(fmt.Sprintf("stop_token_ids[%d]", i), "token id %d is outside the vocabulary [0, %d)", id, lim.vocab)
		}
		if !slices.Contains(ids, int32(id)) {
			ids = append(ids, int32(id))
		}
	}
	return ids, nil
}

func isTierName(s string) bool {
	if s == "" || len(s) > maxServiceTier {
		return false
	}
	for i := 0; i < len(s); i++ {
		if (s[i] < 'a' || s[i] > 'z') && s[i] != '_' {
			return false
		}
	}
	return true
}

// checkIgnored checks the fields that are accepted and ignored against
// OpenAI's bounds, so that what OpenAI would refuse is refused here too.
func (c *common) checkIgnored() *apiError {
	if len(c.User) > maxUser {
		return badField("user", "longer than %d bytes", maxUser)
	}
	if len(c.Metadata) > maxMetadataPairs {
		return badField("metadata", "at most %d pairs, got %d", maxMetadataPairs, len(c.Metadata))
	}
	for k, v := range c.Metadata {
		switch {
		case len(k) > maxMetadataKey:
			return badField("metadata", "key %.16q… is longer than %d bytes", k, maxMetadataKey)
		case len(v) > maxMetadataValue:
			return badField(fmt.Sprintf("metadata[%q]", k), "longer than %d bytes", maxMetadataValue)
		}
	}
	if c.ServiceTier != nil && !isTierName(*c.ServiceTier) {
		return badField("service_tier", "must be a tier name (auto, default, flex, …: 1 to %d lower-case letters and _), got %.40q", maxServiceTier, *c.ServiceTier)
	}
	return nil
}

// check validates the common fields and builds the runtime request around
// the prompt ids; maxTok is max_tokens or max_completion_tokens.
func (c *common) check(prompt []int32, maxTok *int64, maxTokField string, lim limits) (params, *apiError) {
	var p params
	choices := 1
	if c.N != nil {
		// The bound (runtime.max_choices, max_running) is the runtime's:
		// Submit names it. Here only what no configuration allows.
		if *c.N < 1 || *c.N > maxChoices {
			return p, badField("n", "must be in [1, %d], got %d", maxChoices, *c.N)
		}
		choices = int(*c.N)
	}
	if e := c.checkIgnored(); e != nil {
		return p, e
	}
	if len(prompt) > lim.context {
		return p, badField("prompt", "the prompt has %d tokens, more than the context limit %d", len(prompt), lim.context)
	}
	n := 0
	if maxTok != nil {
		if *maxTok < 1 {
			return p, badField(maxTokField, "must be ≥ 1, got %d", *maxTok)
		}
		if *maxTok > int64(lim.context-len(prompt)) { // not prompt + max_tokens: that wraps for 2⁶³−1
			return p, badField(maxTokField, "prompt (%d tokens) + %s (%d) exceed the context limit %d", len(prompt), maxTokField, *maxTok, lim.context)
		}
		n = int(*maxTok)
	} else {
		n = min(lim.defaultMaxTokens, lim.context-len(prompt))
		if n < 1 {
			return p, badField("prompt", "the prompt (%d tokens) fills the context limit %d: no room to generate", len(prompt), lim.context)
		}
	}
	sp := sample.Params{Temperature: 1, TopP: 1}
	if c.Temperature != nil {
		sp.Temperature = *c.Temperature
		if !(sp.Temperature >= 0 && sp.Temperature <= 2) {
			return p, badField("temperature", "must be in [0, 2] (0 is greedy), got %v", sp.Temperature)
		}
	}
	if c.TopP != nil {
		sp.TopP = *c.TopP
		if !(sp.TopP > 0 && sp.TopP <= 1) {
			return p, badField("top_p", "must be in (0, 1], got %v", sp.TopP)
		}
	}
	if c.Seed != nil {
		sp.Seed = uint64(*c.Seed)
	} else {
		sp.Seed = rand.Uint64()
	}
	if len(c.Stop) > text.MaxStops {
		return p, badField("stop", "at most %d stop strings, got %d", text.MaxStops, len(c.Stop))
	}
	for i, s := range c.Stop {
		if s == "" {
			return p, badField(fmt.Sprintf("stop[%d]", i), "empty")
		}
		if len(s) > text.MaxStopLength {
			return p, badField(fmt.Sprintf("stop[%d]", i), "longer than %d bytes", text.MaxStopLength)
		}
	}
	if c.StreamOptions != nil && !c.Stream {
		return p, badField("stream_options", "only allowed with stream: true")
	}
	if c.TopK != nil {
		// vLLM's spelling of "off" is −1 (0 too, in newer versions); a
		// top_k beyond the vocabulary keeps every token, as the vocabulary
		// does.
		if *c.TopK < -1 {
			return p, badField("top_k", "must be -1 or 0 (off) or ≥ 1, got %d", *c.TopK)
		}
		sp.TopK = int(min(max(0, *c.TopK), int64(lim.vocab)))
	}
	if c.MinP != nil {
		sp.MinP = *c.MinP
		if !(sp.MinP >= 0 && sp.MinP < 1) {
			return p, badField("min_p", "must be in [0, 1) (0 is off), got %v", sp.MinP)
		}
	}
	proc, e := c.processing(lim)
	if e != nil {
		return p, e
	}
	stopIDs, e := c.stopTokenIDs(lim)
	if e != nil {
		return p, e
	}
	minTok := 0
	if c.MinTokens != nil {
		if *c.MinTokens < 0 || *c.MinTokens > int64(n) {
			return p, badField("min_tokens", "must be in [0, %d] (at most %s, %d), got %d", n, maxTokField, n, *c.MinTokens)
		}
		minTok = int(*c.MinTokens)
	}
	p.req = sched.Request{Prompt: prompt, MaxTokens: n, Sampling: sp, IgnoreEOS: c.IgnoreEOS, N: choices,
		Processing: proc, MinTokens: minTok, StopIDs: stopIDs}
	p.skipSpecial = c.SkipSpecialTokens == nil || *c.SkipSpecialTokens
	p.stops = c.Stop
	p.stream = c.Stream
	p.includeUsage = c.StreamOptions != nil && c.StreamOptions.IncludeUsage
	return p, nil
}

// completionPrompt reads "prompt": a string, a list of token ids, or a
// list of one of either (n = 1 and one prompt per request).
func completionPrompt(ctx context.Context, raw json.RawMessage, tm *text.Model, lim limits) ([]int32, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badField("prompt", "required")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		if s == "" {
			return nil, badField("prompt", "empty")
		}
		ids, err := tm.EncodePrompt(ctx, s, lim.context)
		if err != nil {
			return nil, badField("prompt", "%v", err)
		}
		return ids, checkEncoded("prompt", ids, lim)
	}
	var ids []int64
	if err := json.Unmarshal(raw, &ids); err == nil {
		return checkIDs(ids, "prompt", lim)
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err == nil && len(list) == 1 {
		return completionPrompt(ctx, list[0], tm, lim)
	} else if err == nil {
		return nil, badField("prompt", "one prompt per request (got a list of %d)", len(list))
	}
	return nil, badField("prompt", "want a string, a list of token ids, or a list of one of either")
}

// checkEncoded checks the ids the tokenizer made of a text field (prompt,
// messages): an id outside the model's vocabulary (a tokenizer larger than
// the model) is that field's error, not one of an id list the client did
// not send.
func checkEncoded(field string, ids []int32, lim limits) *apiError {
	for i, t := range ids {
		if t < 0 || int(t) >= lim.vocab {
			return badField(field, "the tokenizer gave token id %d (at position %d), outside the model's vocabulary [0, %d)", t, i, lim.vocab)
		}
	}
	return nil
}

func checkIDs(ids []int64, field string, lim limits) ([]int32, *apiError) {
	if len(ids) == 0 {
		return nil, badField(field, "empty")
	}
	out := make([]int32, len(ids))
	for i, id := range ids {
		if id < 0 || id >= int64(lim.vocab) {
			return nil, badField(fmt.Sprintf("%s[%d]", field, i), "token id %d is outside the vocabulary [0, %d)", id, lim.vocab)
		}
		out[i] = int32(id)
	}
	return out, nil
}

// chatMessages reads "messages": roles system, user, assistant, tool;
// content a string or a list of {"type": "text", "text": …} parts.
func chatMessages(ms []chatMessage) ([]chat.Message, *apiError) {
	if len(ms) == 0 {
		return nil, badField("messages", "empty")
	}
	if len(ms) > maxMessages {
		return nil, badField("messages", "more than %d messages", maxMessages)
	}
	out := make([]chat.Message, len(ms))
	for i, m := range ms {
		f := fmt.Sprintf("messages[%d]", i)
		role, ok := chat.TemplateRole(m.Role)
		switch {
		case m.Role == "":
			return nil, badField(f+".role", "required")
		case !ok:
			return nil, badField(f+".role", "unknown role %q (have %s)", m.Role, strings.Join(chat.Roles, ", "))
		}
		out[i].Role = role
		if e := messageTools(f, m, &out[i]); e != nil {
			return nil, e
		}
		if len(m.Content) == 0 || string(m.Content) == "null" {
			if m.Role != "assistant" {
				return nil, badField(f+".content", "required")
			}
			continue
		}
		var s string
		if err := json.Unmarshal(m.Content, &s); err == nil {
			out[i].Content = s
			continue
		}
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(m.Content, &parts); err != nil {
			return nil, badField(f+".content", "want a string or a list of text parts")
		}
		var sb strings.Builder
		for j, p := range parts {
			if p.Type != "text" {
				return nil, badField(fmt.Sprintf("%s.content[%d].type", f, j), "only text parts are supported, got %q", p.Type)
			}
			sb.WriteString(p.Text)
		}
		out[i].Content = sb.String()
	}
	return out, nil
}

// checkCompletion validates a completion request completely.
func checkCompletion(ctx context.Context, req *completionRequest, tm *text.Model, lim limits, lv *Live) (params, *apiError) {
	if req.Echo {
		return params{}, badField("echo", "not supported")
	}
	ids, e := completionPrompt(ctx, req.Prompt, tm, lim)
	if e != nil {
		return params{}, e
	}
	p, e := req.check(ids, req.MaxTokens, "max_tokens", lim)
	if e != nil {
		return p, e
	}
	if req.Logprobs != nil {
		if *req.Logprobs < 0 || *req.Logprobs > sched.MaxTopLogprobs {
			return p, badField("logprobs", "must be in [0, %d], got %d", sched.MaxTopLogprobs, *req.Logprobs)
		}
		p.logprobs, p.topLogprobs = true, int(*req.Logprobs)
		p.req.TopLogprobs = p.topLogprobs
	}
	if e := req.constrain(&p, lv, "max_tokens", "", ""); e != nil {
		return p, e
	}
	return p, nil
}

// checkChat validates a chat request completely and renders its prompt.
func checkChat(ctx context.Context, req *chatRequest, tm *text.Model, lim limits, lv *Live) (params, *apiError) {
	msgs, e := chatMessages(req.Messages)
	if e != nil {
		return params{}, e
	}
	if tm == nil || tm.Tok == nil || tm.Chat == nil { // no chat: say why before looking at tools
		_, _, err := tm.EncodeChat(ctx, msgs, lim.context)
		return params{}, badField("messages", "%v", err)
	}
	toolFormat, thinkFormat := tm.ToolCallParser, tm.ReasoningParser
	spec, tools, e := checkTools(req, toolFormat)
	if e != nil {
		return params{}, e
	}
	kwargs, e := checkKwargs(req.ChatTemplateKwargs)
	if e != nil {
		return params{}, e
	}
	prompt, ids, err := tm.EncodeChatWith(ctx, msgs, chat.Options{AddGenerationPrompt: true, Tools: tools, Kwargs: kwargs}, lim.context)
	if err != nil {
		return params{}, badField("messages", "%v", err)
	}
	if len(ids) == 0 {
		return params{}, badField("messages", "the chat template rendered an empty prompt")
	}
	if e := checkEncoded("messages", ids, lim); e != nil {
		return params{}, e
	}
	maxTok, field := req.MaxTokens, "max_tokens"
	if req.MaxCompletionTokens != nil {
		if req.MaxTokens != nil {
			return params{}, badField("max_completion_tokens", "give max_tokens or max_completion_tokens, not both")
		}
		maxTok, field = req.MaxCompletionTokens, "max_completion_tokens"
	}
	p, e := req.check(ids, maxTok, field, lim)
	if e != nil {
		return p, e
	}
	if req.TopLogprobs != nil {
		if !req.Logprobs {
			return p, badField("top_logprobs", "needs logprobs: true")
		}
		if *req.TopLogprobs < 0 || *req.TopLogprobs > sched.MaxTopLogprobs {
			return p, badField("top_logprobs", "must be in [0, %d], got %d", sched.MaxTopLogprobs, *req.TopLogprobs)
		}
		p.topLogprobs = int(*req.TopLogprobs)
	}
	p.logprobs = req.Logprobs
	p.req.TopLogprobs = p.topLogprobs
	p.tools, p.reasoningFormat = spec, thinkFormat
	p.promptOpensThink = thinkFormat != "" && thinkFormat != reasoning.FormatNone && reasoning.PromptOpens(prompt)
	after, open := reasoningBefore(prompt, thinkFormat)
	if spec.Constrained() {
		if e := constrainTools(spec, &p, lv, field, after, open, &req.structured); e != nil {
			return p, e
		}
		return p, nil
	}
	if e := req.constrain(&p, lv, field, after, open); e != nil {
		return p, e
	}
	return p, nil
}

// reasoningBefore says where a chat reply's reasoning may come before its
// constrained output, with the reasoning parser on: after the prompt
// opened <think>, free text up to </think> (after = "</think>"); where the
// prompt left the reply open, an optional "<think>…</think>" block first
// (open = "<think>" too); nothing where the prompt closed it (thinking
// off: the prompt ends "<think></think>") or without a parser.
func reasoningBefore(prompt, format string) (after, open string) {
	switch {
	case format == "" || format == reasoning.FormatNone:
		return "", ""
	case reasoning.PromptOpens(prompt):
		return reasoning.Close, ""
	case strings.HasSuffix(strings.TrimRight(prompt, " \t\r\n"), reasoning.Close):
		return "", ""
	}
	return reasoning.Close, reasoning.Open
}

// finite reports whether v is a usable number (for logprobs in JSON).
func finite(v float32) float64 {
	f := float64(v)
	if math.IsInf(f, -1) || math.IsNaN(f) {
		return -9999
	}
	return f
}
