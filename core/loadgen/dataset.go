package loadgen

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
)

// Bounds of a JSONL dataset.
const (
	// MaxLineBytes bounds one line (a 128k-token prompt as ids or text
	// takes about a megabyte).
	MaxLineBytes = 32 << 20
	// MaxDatasetPrompts bounds the prompts of a file.
	MaxDatasetPrompts = 1 << 20
	// MaxOutputLen bounds a request's output_len (and --output-len).
	MaxOutputLen = 1 << 24
)

// datasetLine is one line of a JSONL dataset: "prompt" (a string, or a
// list of token ids) or "messages" (chat), and an optional output_len.
type datasetLine struct {
	Prompt    json.RawMessage `json:"prompt"`
	Messages  json.RawMessage `json:"messages"`
	OutputLen *int64          `json:"output_len"`
}

// ParseJSONL reads a dataset: one JSON object per line, each
//
//	{"prompt": "text" | [token ids], "output_len": N}   or
//	{"messages": [{"role": "user", "content": "text"}, ...], "output_len": N}
//
// (output_len optional: defaultOutput then). Blank lines are skipped; any
// other line that is not such an object is an error naming the file (name)
// and the line number. Unknown keys are errors.
func ParseJSONL(r io.Reader, name string, defaultOutput int) ([]Request, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var out []Request
	for lineNo := 1; ; lineNo++ {
		line, err := readLine(br)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s:%d: %w", name, lineNo, err)
		}
		if len(bytes.TrimSpace(line)) > 0 {
			if len(out) == MaxDatasetPrompts {
				return nil, fmt.Errorf("%s:%d: more than %d prompts", name, lineNo, MaxDatasetPrompts)
			}
			req, perr := parseLine(line, defaultOutput)
			if perr != nil {
				return nil, fmt.Errorf("%s:%d: %w", name, lineNo, perr)
			}
			out = append(out, req)
		}
		if errors.Is(err, io.EOF) {
			break
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no prompts (every line blank)", name)
	}
	return out, nil
}

var errLineTooLong = fmt.Errorf("line longer than %d bytes", MaxLineBytes)

// readLine reads one line (without its end), at most MaxLineBytes; io.EOF
// with the last line's bytes.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > MaxLineBytes+1 {
			return nil, errLineTooLong
		}
		line = append(line, chunk...)
		switch {
		case err == nil:
			return bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r")), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return line, err
		}
	}
}

func parseLine(line []byte, defaultOutput int) (Request, error) {
	var l datasetLine
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		var syn *json.SyntaxError
		var ute *json.UnmarshalTypeError
		switch {
		case errors.As(err, &ute) && ute.Field == "":
			return Request{}, fmt.Errorf("want a JSON object, got JSON %s", ute.Value)
		case errors.As(err, &ute):
			return Request{}, fmt.Errorf("%s: want %s, got JSON %s", ute.Field, kindOf(ute.Field), ute.Value)
		case errors.As(err, &syn):
			return Request{}, fmt.Errorf("invalid JSON at byte %d: %v", syn.Offset, err)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			return Request{}, fmt.Errorf("unknown key %s (want prompt or messages, and output_len)", strings.TrimPrefix(err.Error(), "json: unknown field "))
		}
		return Request{}, fmt.Errorf("invalid JSON: %v", err)
	}
	if dec.More() {
		return Request{}, errors.New("more than one JSON value on the line")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Request{}, errors.New("trailing data after the JSON object")
	}
	req := Request{OutputLen: defaultOutput}
	if l.OutputLen != nil {
		if *l.OutputLen < 1 || *l.OutputLen > MaxOutputLen {
			return Request{}, fmt.Errorf("output_len: must be in [1, %d], got %d", MaxOutputLen, *l.OutputLen)
		}
		req.OutputLen = int(*l.OutputLen)
	}
	hasPrompt, hasMessages := present(l.Prompt), present(l.Messages)
	switch {
	case hasPrompt && hasMessages:
		return Request{}, errors.New("prompt and messages: give one of them, not both")
	case hasPrompt:
		switch bytes.TrimSpace(l.Prompt)[0] {
		case '"':
			var s string
			if err := json.Unmarshal(l.Prompt, &s); err != nil {
				return Request{}, fmt.Errorf("prompt: %v", err)
			}
			if s == "" {
				return Request{}, errors.New("prompt: empty")
			}
			req.PromptText = s
		case '[':
			var ids []float64
			if err := json.Unmarshal(l.Prompt, &ids); err != nil {
				return Request{}, errors.New("prompt: want a string or a list of token ids (non-negative integers)")
			}
			if len(ids) == 0 {
				return Request{}, errors.New("prompt: empty list of token ids")
			}
			req.PromptIDs = make([]int32, len(ids))
			for i, v := range ids {
				if v != math.Trunc(v) || v < 0 || v > math.MaxInt32 {
					return Request{}, fmt.Errorf("prompt[%d]: want a token id (an integer in [0, %d]), got %v", i, math.MaxInt32, v)
				}
				req.PromptIDs[i] = int32(v)
			}
			req.PromptLen = len(ids)
		default:
			return Request{}, fmt.Errorf("prompt: want a string or a list of token ids, got JSON %s", jsonKind(l.Prompt))
		}
	case hasMessages:
		var raw []json.RawMessage
		if err := json.Unmarshal(l.Messages, &raw); err != nil {
			return Request{}, fmt.Errorf("messages: want a list of {role, content} objects, got JSON %s", jsonKind(l.Messages))
		}
		if len(raw) == 0 {
			return Request{}, errors.New("messages: empty list")
		}
		for i, m := range raw {
			var msg Message
			dec := json.NewDecoder(bytes.NewReader(m))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&msg); err != nil {
				return Request{}, fmt.Errorf("messages[%d]: want {\"role\": string, \"content\": string} (%v)", i, err)
			}
			if msg.Role == "" {
				return Request{}, fmt.Errorf("messages[%d].role: required (a non-empty string)", i)
			}
			req.Messages = append(req.Messages, msg)
		}
	default:
		return Request{}, errors.New("prompt or messages: required")
	}
	return req, nil
}

func present(r json.RawMessage) bool { return len(r) > 0 && string(r) != "null" }

func kindOf(field string) string {
	if field == "output_len" {
		return "an integer"
	}
	return "a value of another type"
}

// jsonKind names the kind of a JSON value (for messages).
func jsonKind(r json.RawMessage) string {
	t := bytes.TrimSpace(r)
	if len(t) == 0 {
		return "nothing"
	}
	switch t[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}
