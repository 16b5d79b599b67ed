package loadgen

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// Error kinds of a failed request (Result.Errors is keyed by them).
const (
	// KindHTTP prefixes a refused request's kind with its status: http_500.
	KindHTTP = "http_"
	// KindConnect: the connection could not be made or broke before a
	// response.
	KindConnect = "connect"
	// KindTimeout: the request ran past --timeout.
	KindTimeout = "timeout"
	// KindBrokenStream: the stream ended (EOF, or the connection broke)
	// before its end ([DONE], or a finish_reason).
	KindBrokenStream = "stream_broken"
	// KindStreamError: the server sent an error event in the stream.
	KindStreamError = "stream_error"
	// KindBadChunk: an event that is not a completion chunk (not JSON, or a
	// line over MaxLineBytes).
	KindBadChunk = "bad_chunk"
	// KindNotStreaming: a 200 answer that is not an event stream.
	KindNotStreaming = "not_streaming"
	// KindNoOutput: the stream ended without generating anything (no time
	// to first token exists).
	KindNoOutput = "no_output"
)

// reqError is why a request failed: a kind (the constants above) and the
// message.
type reqError struct {
	Kind, Msg string
}

func (e *reqError) Error() string { return e.Kind + ": " + e.Msg }

// streamResult is what a request's SSE stream said, with the times
// (relative to the request's send) at which its events arrived.
type streamResult struct {
	// Chunks are the arrival times of the events that carried generated
	// output (text, content, reasoning or tool calls), in order.
	Chunks []time.Duration
	// End is when the stream ended ([DONE], or EOF after a finish).
	End time.Duration
	// Usage is the final chunk's usage (stream_options.include_usage),
	// nil when the server sent none.
	Usage        *usage
	FinishReason string
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// chunk is the part of a completion or chat chunk the measurement reads.
type chunk struct {
	Choices []struct {
		Text  *string `json:"text"`
		Delta *struct {
			Content          *string         `json:"content"`
			ReasoningContent *string         `json:"reasoning_content"`
			Reasoning        *string         `json:"reasoning"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage          `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// generated reports whether a chunk carries output.
func (c *chunk) generated() bool {
	for _, ch := range c.Choices {
		if ch.Text != nil && *ch.Text != "" {
			return true
		}
		if d := ch.Delta; d != nil {
			if (d.Content != nil && *d.Content != "") || (d.ReasoningContent != nil && *d.ReasoningContent != "") ||
				(d.Reasoning != nil && *d.Reasoning != "") || (len(d.ToolCalls) > 0 && string(d.ToolCalls) != "null" && string(d.ToolCalls) != "[]") {
				return true
			}
		}
	}
	return false
}

// readStream consumes an SSE stream of completion (or chat) chunks and
// stamps each event with now() as it is dispatched (a blank line, or the
// end of the stream). It returns what it saw so far with a *reqError when
// the stream failed.
func readStream(r io.Reader, now func() time.Duration) (streamResult, *reqError) {
	var res streamResult
	br := bufio.NewReaderSize(r, 64<<10)
	var data []byte
	hasData := false
	// dispatch handles one event's data; done reports the stream's end.
	dispatch := func() (done bool, e *reqError) {
		if !hasData {
			return false, nil
		}
		d := data
		data, hasData = data[:0], false
		at := now()
		if string(bytes.TrimSpace(d)) == "[DONE]" {
			res.End = at
			return true, nil
		}
		var c chunk
		if err := json.Unmarshal(d, &c); err != nil {
			return false, &reqError{KindBadChunk, fmt.Sprintf("event %q is not a JSON chunk: %v", clip(string(d), 120), err)}
		}
		if present(c.Error) {
			return false, &reqError{KindStreamError, errorMessage(c.Error)}
		}
		if c.generated() {
			res.Chunks = append(res.Chunks, at)
		}
		for _, ch := range c.Choices {
			if ch.FinishReason != nil && *ch.FinishReason != "" {
				res.FinishReason = *ch.FinishReason
			}
		}
		if c.Usage != nil {
			if c.Usage.PromptTokens < 0 || c.Usage.CompletionTokens < 0 {
				return false, &reqError{KindBadChunk, fmt.Sprintf("usage with negative token counts: %s", clip(string(d), 120))}
			}
			u := *c.Usage
			res.Usage = &u
		}
		return false, nil
	}
	for {
		line, err := readLine(br)
		if err != nil && !errors.Is(err, io.EOF) {
			if errors.Is(err, errLineTooLong) {
				return res, &reqError{KindBadChunk, err.Error()}
			}
			return res, &reqError{KindBrokenStream, err.Error()}
		}
		eof := errors.Is(err, io.EOF)
		switch {
		case len(line) == 0 && !eof:
			if done, e := dispatch(); e != nil || done {
				return res, e
			}
		case len(line) > 0 && line[0] == ':': // a comment (keep-alive)
		case len(line) > 0:
			field, value, _ := bytes.Cut(line, []byte(":"))
			value = bytes.TrimPrefix(value, []byte(" "))
			if string(field) == "data" {
				if hasData {
					data = append(data, '\n')
				}
				data = append(data, value...)
				hasData = true
			} // event, id, retry: not used
		}
		if eof {
			// the last event may lack its blank line
			if done, e := dispatch(); e != nil || done {
				return res, e
			}
			if res.FinishReason != "" { // every chunk came; only [DONE] is missing
				res.End = now()
				return res, nil
			}
			return res, &reqError{KindBrokenStream, "the stream ended before its last chunk (no finish_reason, no [DONE])"}
		}
	}
}

// errorMessage is an OpenAI error object's message ({"message": ...}, or
// the JSON itself).
func errorMessage(raw json.RawMessage) string {
	var e struct {
		Message string `json:"message"`
		Type    string `json:"type"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Message != "" {
		if e.Type != "" {
			return e.Type + ": " + e.Message
		}
		return e.Message
	}
	var s string
	if json.Unmarshal(raw, &s) == nil && s != "" {
		return s
	}
	return clip(string(raw), 200)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
