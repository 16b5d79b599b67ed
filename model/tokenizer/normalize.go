package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites text before pre-tokenization (tokenizer.json
// "normalizer").
type normalizer func(*encoder, string) string

func parseNormalizer(raw json.RawMessage, where string) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	typ, err := typeOf(raw, where)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "NFC", "NFD", "NFKC", "NFKD", "Lowercase":
		var v typed
		if err := strict(raw, &v, where); err != nil {
			return nil, err
		}
		switch typ {
		case "NFC":
			return wrap(norm.NFC.String), nil
		case "NFD":
			return wrap(norm.NFD.String), nil
		case "NFKC":
			return wrap(norm.NFKC.String), nil
		case "NFKD":
			return wrap(norm.NFKD.String), nil
		}
		return wrap(strings.ToLower), nil
	case "Sequence":
		var v struct {
			Type        string            `json:"type"`
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := strict(raw, &v, where); err != nil {
			return nil, err
		}
		var steps []normalizer
		for i, n := range v.Normalizers {
			s, err := parseNormalizer(n, fmt.Sprintf("%s.normalizers[%d]", where, i))
			if err != nil {
				return nil, err
			}
			if s != nil {
				steps = append(steps, s)
			}
		}
		if len(steps) == 0 {
			return nil, nil
		}
		return func(e *encoder, s string) string {
			for _, f := range steps {
				s = f(e, s)
			}
			return s
		}, nil
	case "Prepend":
		var v struct {
			Type    string `json:"type"`
			Prepend string `json:"prepend"`
		}
		if err := strict(raw, &v, where); err != nil {
			return nil, err
		}
		return func(_ *encoder, s string) string {
			if s == "" {
				return s
			}
			return v.Prepend + s
		}, nil
	case "Replace":
		var v struct {
			Type    string      `json:"type"`
			Pattern patternJSON `json:"pattern"`
			Content string      `json:"content"`
		}
		if err := strict(raw, &v, where); err != nil {
			return nil, err
		}
		re, err := compilePattern(v.Pattern, where+".pattern")
		if err != nil {
			return nil, err
		}
		return func(e *encoder, s string) string { return re.replaceAll(e, s, v.Content) }, nil
	case "Strip":
		var v struct {
			Type       string `json:"type"`
			StripLeft  bool   `json:"strip_left"`
			StripRight bool   `json:"strip_right"`
		}
		if err := strict(raw, &v, where); err != nil {
			return nil, err
		}
		return func(_ *encoder, s string) string {
			if v.StripLeft {
				s = strings.TrimLeftFunc(s, isWhiteSpace)
			}
			if v.StripRight {
				s = strings.TrimRightFunc(s, isWhiteSpace)
			}
			return s
		}, nil
	}
	return nil, fmt.Errorf("%s.type: unsupported normalizer %q (have NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip, Sequence)", where, typ)
}

// wrap makes a normalizer of a function that cannot fail.
func wrap(f func(string) string) normalizer {
	return func(_ *encoder, s string) string { return f(s) }
}
