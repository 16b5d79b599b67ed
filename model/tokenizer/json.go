package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// The tokenizer.json schema (the subset byte-level BPE models use). Every
// component is decoded from raw JSON by its "type" so that an unknown type
// or field is an error naming it.

type fileJSON struct {
	Version       string           `json:"version"`
	Truncation    json.RawMessage  `json:"truncation"`
	Padding       json.RawMessage  `json:"padding"`
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
	Model         json.RawMessage  `json:"model"`
}

type addedTokenJSON struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type modelJSON struct {
	Type                    string          `json:"type"`
	Dropout                 *float64        `json:"dropout"`
	UnkToken                *string         `json:"unk_token"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
	FuseUnk                 bool            `json:"fuse_unk"`
	ByteFallback            bool            `json:"byte_fallback"`
	IgnoreMerges            bool            `json:"ignore_merges"`
	Vocab                   map[string]int  `json:"vocab"`
	Merges                  json.RawMessage `json:"merges"`
}

// typed is the "type" field every component has.
type typed struct {
	Type string `json:"type"`
}

// strict decodes data into v, refusing unknown fields; where names the
// component in errors.
func strict(data []byte, v any, where string) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("%s: %v", where, err)
	}
	return nil
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

func typeOf(raw json.RawMessage, where string) (string, error) {
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return "", fmt.Errorf("%s: %v", where, err)
	}
	if t.Type == "" {
		return "", fmt.Errorf("%s.type: missing", where)
	}
	return t.Type, nil
}

// patternJSON is a Split or Replace pattern: {"String": s} or {"Regex": r}.
type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

// parseMerges accepts both merge spellings: "a b" strings (older files) and
// ["a", "b"] pairs (newer files, which allow spaces inside tokens).
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("model.merges: %v", err)
	}
	out := make([][2]string, len(items))
	for i, it := range items {
		var s string
		if err := json.Unmarshal(it, &s); err == nil {
			a, b, ok := strings.Cut(s, " ")
			if !ok || a == "" || b == "" || strings.Contains(b, " ") {
				return nil, fmt.Errorf("model.merges[%d]: %q is not two tokens separated by one space", i, s)
			}
			out[i] = [2]string{a, b}
			continue
		}
		var pair []string
		if err := json.Unmarshal(it, &pair); err != nil || len(pair) != 2 {
			return nil, fmt.Errorf("model.merges[%d]: want \"a b\" or [\"a\", \"b\"]", i)
		}
		if pair[0] == "" || pair[1] == "" {
			return nil, fmt.Errorf("model.merges[%d]: empty token", i)
		}
		out[i] = [2]string{pair[0], pair[1]}
	}
	return out, nil
}
