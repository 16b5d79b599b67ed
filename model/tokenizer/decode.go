package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
)

// parseDecoder checks that the decoder is the byte-level one (possibly in
// a Sequence): decoding is then the byte mapping Bytes and Decode do.
func parseDecoder(raw json.RawMessage, where string) error {
	if isNull(raw) {
		return fmt.Errorf("%s: missing (byte-level BPE needs the ByteLevel decoder)", where)
	}
	typ, err := typeOf(raw, where)
	if err != nil {
		return err
	}
	switch typ {
	case "ByteLevel":
		var v struct {
			Type           string `json:"type"`
			AddPrefixSpace bool   `json:"add_prefix_space"`
			TrimOffsets    bool   `json:"trim_offsets"`
			UseRegex       bool   `json:"use_regex"`
		}
		return strict(raw, &v, where)
	case "Sequence":
		var v struct {
			Type     string            `json:"type"`
			Decoders []json.RawMessage `json:"decoders"`
		}
		if err := strict(raw, &v, where); err != nil {
			return err
		}
		if len(v.Decoders) != 1 {
			return fmt.Errorf("%s.decoders: want exactly one ByteLevel decoder, got %d decoders", where, len(v.Decoders))
		}
		return parseDecoder(v.Decoders[0], where+".decoders[0]")
	}
	return fmt.Errorf("%s.type: unsupported decoder %q (only ByteLevel)", where, typ)
}

// parsePostProcessor returns the ids a post-processor adds around a single
// sequence: ByteLevel adds none, TemplateProcessing its special tokens.
func parsePostProcessor(raw json.RawMessage, where string, vocab int) (head, tail []int32, err error) {
	if isNull(raw) {
		return nil, nil, nil
	}
	typ, err := typeOf(raw, where)
	if err != nil {
		return nil, nil, err
	}
	switch typ {
	case "ByteLevel":
		var v struct {
			Type           string `json:"type"`
			AddPrefixSpace bool   `json:"add_prefix_space"`
			TrimOffsets    bool   `json:"trim_offsets"`
			UseRegex       bool   `json:"use_regex"`
		}
		return nil, nil, strict(raw, &v, where)
	case "Sequence":
		var v struct {
			Type       string            `json:"type"`
			Processors []json.RawMessage `json:"processors"`
		}
		if err := strict(raw, &v, where); err != nil {
			return nil, nil, err
		}
		for i, p := range v.Processors {
			h, t, err := parsePostProcessor(p, fmt.Sprintf("%s.processors[%d]", where, i), vocab)
			if err != nil {
				return nil, nil, err
			}
			head = append(head, h...)
			tail = append(t, tail...)
		}
		return head, tail, nil
	case "TemplateProcessing":
		type item struct {
			SpecialToken *struct {
				ID     string `json:"id"`
				TypeID int    `json:"type_id"`
			} `json:"SpecialToken"`
			Sequence *struct {
				ID     string `json:"id"`
				TypeID int    `json:"type_id"`
			} `json:"Sequence"`
		}
		var v struct {
			Type          string `json:"type"`
			Single        []item `json:"single"`
			Pair          []item `json:"pair"`
			SpecialTokens map[string]struct {
				ID     string   `json:"id"`
				IDs    []int    `json:"ids"`
				Tokens []string `json:"tokens"`
			} `json:"special_tokens"`
		}
		if err := strict(raw, &v, where); err != nil {
			return nil, nil, err
		}
		seen := false
		for i, it := range v.Single {
			w := fmt.Sprintf("%s.single[%d]", where, i)
			switch {
			case it.Sequence != nil:
				if seen {
					return nil, nil, fmt.Errorf("%s: the sequence appears twice", w)
				}
				seen = true
			case it.SpecialToken != nil:
				st, ok := v.SpecialTokens[it.SpecialToken.ID]
				if !ok {
					return nil, nil, fmt.Errorf("%s: special token %q is not in special_tokens", w, it.SpecialToken.ID)
				}
				for _, id := range st.IDs {
					if id < 0 || id >= vocab {
						return nil, nil, fmt.Errorf("%s.special_tokens[%q].ids: %d is outside the vocabulary [0, %d)", where, it.SpecialToken.ID, id, vocab)
					}
					if seen {
						tail = append(tail, int32(id))
					} else {
						head = append(head, int32(id))
					}
				}
			default:
				return nil, nil, fmt.Errorf("%s: want SpecialToken or Sequence", w)
			}
		}
		return head, tail, nil
	}
	return nil, nil, fmt.Errorf("%s.type: unsupported post-processor %q (have ByteLevel, TemplateProcessing, Sequence)", where, typ)
}

// Stream decodes tokens one at a time: Next returns the text that the
// token completes, holding back the bytes of a character that is not yet
// whole. Concatenating every Next and the final Flush gives Decode of all
// the tokens. A Stream is used by one goroutine.
type Stream struct {
	t           *Tokenizer
	skipSpecial bool
	pending     []byte
}

// NewStream starts an incremental decoding.
func (t *Tokenizer) NewStream(skipSpecial bool) *Stream {
	return &Stream{t: t, skipSpecial: skipSpecial}
}

// Next adds a token and returns the text now complete ("" if none).
func (s *Stream) Next(id int32) string {
	if s.skipSpecial && s.t.IsSpecial(id) {
		return ""
	}
	s.pending = append(s.pending, s.t.Bytes(id)...)
	keep := incompleteTail(s.pending)
	n := len(s.pending) - keep
	if n == 0 {
		return ""
	}
	var sb strings.Builder
	appendLossy(&sb, s.pending[:n])
	s.pending = append(s.pending[:0], s.pending[n:]...)
	return sb.String()
}

// Pending reports whether bytes of an unfinished character are held back.
func (s *Stream) Pending() bool { return len(s.pending) > 0 }

// Flush returns what is held back (an unfinished character becomes
// U+FFFD) and empties the stream.
func (s *Stream) Flush() string {
	out := Lossy(s.pending)
	s.pending = s.pending[:0]
	return out
}
