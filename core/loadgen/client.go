package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"
	"time"
)

// Endpoint is the API a run speaks.
type Endpoint string

// The endpoints.
const (
	Completions Endpoint = "completions" // POST /v1/completions
	Chat        Endpoint = "chat"        // POST /v1/chat/completions
)

// Path is the endpoint's URL path.
func (e Endpoint) Path() string {
	if e == Chat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// Client speaks the OpenAI HTTP API of one server.
type Client struct {
	// BaseURL is the server's root (http://host:port, no /v1).
	BaseURL string
	// APIKey, when set, is sent as a bearer token.
	APIKey string
	HTTP   *http.Client
}

// NewClient makes a client whose transport keeps up to conns connections
// to the server and never compresses (an SSE stream must arrive as sent).
func NewClient(baseURL, apiKey string, conns int) *Client {
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        max(conns, 16),
		MaxIdleConnsPerHost: max(conns, 16),
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), APIKey: apiKey, HTTP: &http.Client{Transport: tr}}
}

// CloseIdle closes the client's idle connections.
func (c *Client) CloseIdle() { c.HTTP.CloseIdleConnections() }

func (c *Client) newRequest(ctx context.Context, method, url string, body []byte) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	return req, nil
}

// getJSON GETs or POSTs a JSON document and decodes the answer into out; a
// non-200 answer is an error with its status and message.
func (c *Client) doJSON(ctx context.Context, method, path string, in, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	req, err := c.newRequest(ctx, method, c.BaseURL+path, body)
	if err != nil {
		return err
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, bodyMessage(b))
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: the answer is not the JSON expected: %v", method, path, err)
	}
	return nil
}

// ModelInfo is what GET /v1/models says of the first (or named) model.
type ModelInfo struct {
	ID string `json:"id"`
	// MaxModelLen is vLLM's (and glmflash's) context length; 0 unknown.
	MaxModelLen int `json:"max_model_len"`
	// VocabSize is glmflash's vocabulary size; 0 unknown.
	VocabSize int `json:"vocab_size"`
}

// Model asks GET /v1/models for the model named name, or the first one when
// name is "".
func (c *Client) Model(ctx context.Context, name string) (ModelInfo, error) {
	var list struct {
		Data []ModelInfo `json:"data"`
	}
	if err := c.doJSON(ctx, http.MethodGet, "/v1/models", nil, &list); err != nil {
		return ModelInfo{}, err
	}
	if len(list.Data) == 0 {
		return ModelInfo{}, errors.New("GET /v1/models: the server lists no model")
	}
	if name == "" {
		return list.Data[0], nil
	}
	var ids []string
	for _, m := range list.Data {
		if m.ID == name {
			return m, nil
		}
		ids = append(ids, m.ID)
	}
	return ModelInfo{}, fmt.Errorf("GET /v1/models: the server does not serve %q (it serves %s)", name, strings.Join(ids, ", "))
}

// Detokenize asks POST /detokenize (vLLM's and glmflash's) for the text of
// token ids.
func (c *Client) Detokenize(ctx context.Context, model string, ids []int32) (string, error) {
	var out struct {
		Prompt *string `json:"prompt"`
	}
	if err := c.doJSON(ctx, http.MethodPost, "/detokenize", map[string]any{"model": model, "tokens": ids}, &out); err != nil {
		return "", err
	}
	if out.Prompt == nil {
		return "", errors.New("POST /detokenize: the answer has no \"prompt\"")
	}
	return *out.Prompt, nil
}

// Health GETs /health and reports whether it answered 200.
func (c *Client) Health(ctx context.Context) error {
	req, err := c.newRequest(ctx, http.MethodGet, c.BaseURL+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /health: HTTP %d: %s", resp.StatusCode, bodyMessage(b))
	}
	return nil
}

// bodyMessage is an error answer's message: OpenAI's error.message, or the
// body's start.
func bodyMessage(b []byte) string {
	var e struct {
		Error json.RawMessage `json:"error"`
		// some servers answer {"detail": ...} or {"message": ...}
		Detail  any    `json:"detail"`
		Message string `json:"message"`
	}
	if json.Unmarshal(b, &e) == nil {
		switch {
		case present(e.Error):
			return errorMessage(e.Error)
		case e.Message != "":
			return e.Message
		case e.Detail != nil:
			d, _ := json.Marshal(e.Detail)
			return clip(string(d), 200)
		}
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "(empty body)"
	}
	return clip(s, 200)
}

// Body builds a request's JSON body: the prompt (ids, text or messages),
// max_tokens, greedy or the given temperature, streaming with usage, and
// ignore_eos; extra keys last (they may not replace these).
func Body(ep Endpoint, model string, r *Request, temperature float64, ignoreEOS bool, extra map[string]json.RawMessage) ([]byte, error) {
	b := map[string]any{
		"model":          model,
		"max_tokens":     r.OutputLen,
		"temperature":    temperature,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
	}
	if ignoreEOS {
		b["ignore_eos"] = true
	}
	switch {
	case ep == Chat && len(r.Messages) > 0:
		b["messages"] = r.Messages
	case ep == Chat && r.PromptText != "":
		b["messages"] = []Message{{Role: "user", Content: r.PromptText}}
	case ep == Chat:
		return nil, errors.New("a chat request needs text or messages (token ids cannot be sent to /v1/chat/completions)")
	case len(r.Messages) > 0:
		return nil, errors.New("a request with messages needs --endpoint chat")
	case r.PromptText != "":
		b["prompt"] = r.PromptText
	default:
		b["prompt"] = r.PromptIDs
	}
	for k, v := range extra {
		if _, ok := b[k]; ok {
			return nil, &FieldError{Field: "extra-body", Msg: fmt.Sprintf("key %q is set by the benchmark itself", k)}
		}
		b[k] = v
	}
	return json.Marshal(b)
}

// stream sends one request and measures its stream; now gives the time
// since the benchmark's start. The record's Sent, TTFT, E2E, Chunks,
// tokens and error are filled in.
func (c *Client) stream(ctx context.Context, ep Endpoint, body []byte, timeout time.Duration, now func() time.Duration, rec *Record) {
	rctx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		rctx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	fail := func(kind, msg string) {
		switch {
		case ctx.Err() != nil: // the run stopped it
			rec.Cancelled = true
		case rctx.Err() != nil && errors.Is(rctx.Err(), context.DeadlineExceeded):
			rec.ErrKind, rec.ErrMsg = KindTimeout, fmt.Sprintf("no end within --timeout %s (%s)", timeout, msg)
		default:
			rec.ErrKind, rec.ErrMsg = kind, msg
		}
	}
	req, err := c.newRequest(rctx, http.MethodPost, c.BaseURL+ep.Path(), body)
	if err != nil {
		fail(KindConnect, err.Error())
		return
	}
	req.Header.Set("Accept", "text/event-stream")
	rec.Sent = now()
	since := func() time.Duration { return now() - rec.Sent }
	resp, err := c.HTTP.Do(req)
	if err != nil {
		fail(KindConnect, err.Error())
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		fail(fmt.Sprintf("%s%d", KindHTTP, resp.StatusCode), bodyMessage(b))
		return
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		fail(KindNotStreaming, fmt.Sprintf("the answer is %q, not text/event-stream: %s", resp.Header.Get("Content-Type"), clip(strings.TrimSpace(string(b)), 200)))
		return
	}
	res, e := readStream(resp.Body, since)
	rec.Chunks, rec.FinishReason = res.Chunks, res.FinishReason
	if e != nil {
		fail(e.Kind, e.Msg)
		return
	}
	if len(res.Chunks) == 0 {
		fail(KindNoOutput, fmt.Sprintf("the stream ended (finish_reason %q) without output", res.FinishReason))
		return
	}
	rec.TTFT, rec.E2E = res.Chunks[0], res.End
	if u := res.Usage; u != nil {
		rec.UsageReported = true
		rec.OutputTokens = u.CompletionTokens
		if u.PromptTokens > 0 {
			rec.PromptTokens = u.PromptTokens
		}
	} else {
		rec.OutputTokens = len(res.Chunks)
	}
}
