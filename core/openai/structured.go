package openai

import (
	"bytes"
	"encoding/json"
	"regexp"

	"github.com/glmflash/glmflash/core/grammar"
)

// responseFormat is OpenAI's response_format.
type responseFormat struct {
	Type       string      `json:"type"`
	JSONSchema *jsonSchema `json:"json_schema"`
}

type jsonSchema struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Schema      json.RawMessage `json:"schema"`
	Strict      *bool           `json:"strict"` // accepted: the schema is always enforced
}

// structuredOutputs is newer vLLM's structured_outputs.
type structuredOutputs struct {
	JSON   json.RawMessage `json:"json"`
	Regex  *string         `json:"regex"`
	Choice []string        `json:"choice"`
}

// structured are the fields that constrain the output (one at most).
type structured struct {
	ResponseFormat    *responseFormat    `json:"response_format"`
	GuidedJSON        json.RawMessage    `json:"guided_json"`
	GuidedRegex       *string            `json:"guided_regex"`
	GuidedChoice      []string           `json:"guided_choice"`
	StructuredOutputs *structuredOutputs `json:"structured_outputs"`
}

var schemaName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// schemaText is a JSON Schema given as an object or as a string holding
// one (vLLM takes both for guided_json).
func schemaText(raw json.RawMessage, field string) (string, *apiError) {
	t := bytes.TrimSpace(raw)
	if len(t) > 0 && t[0] == '"' {
		var s string
		if err := json.Unmarshal(t, &s); err != nil {
			return "", badField(field, "%v", err)
		}
		t = bytes.TrimSpace([]byte(s))
	}
	if len(t) == 0 || (t[0] != '{' && string(t) != "true") || !json.Valid(t) {
		return "", badField(field, "must be a JSON Schema object")
	}
	return string(t), nil
}

// spec is the grammar the request asks for (ok false: none) and the field
// that asked, for errors.
func (st *structured) spec() (spec grammar.Spec, field string, ok bool, e *apiError) {
	type ask struct {
		field string
		spec  grammar.Spec
		err   *apiError
	}
	var asks []ask
	choice := func(field string, cs []string) ask {
		if len(cs) == 0 {
			return ask{field: field, err: badField(field, "must be a non-empty list of strings")}
		}
		b, _ := json.Marshal(cs) // strings always encode
		return ask{field: field, spec: grammar.Spec{Kind: grammar.Choice, Text: string(b)}}
	}
	schema := func(field string, raw json.RawMessage) ask {
		s, e := schemaText(raw, field)
		return ask{field: field, spec: grammar.Spec{Kind: grammar.JSONSchema, Text: s}, err: e}
	}
	if rf := st.ResponseFormat; rf != nil {
		switch rf.Type {
		case "text":
			if rf.JSONSchema != nil {
				return spec, "", false, badField("response_format.json_schema", "only with type json_schema")
			}
		case "json_object":
			if rf.JSONSchema != nil {
				return spec, "", false, badField("response_format.json_schema", "only with type json_schema")
			}
			asks = append(asks, ask{field: "response_format", spec: grammar.Spec{Kind: grammar.JSONObject}})
		case "json_schema":
			js := rf.JSONSchema
			switch {
			case js == nil:
				return spec, "", false, badField("response_format.json_schema", "required with type json_schema")
			case !schemaName.MatchString(js.Name):
				return spec, "", false, badField("response_format.json_schema.name", "must be 1 to 64 letters, digits, '_' or '-', got %q", js.Name)
			case len(js.Schema) == 0 || string(js.Schema) == "null":
				asks = append(asks, ask{field: "response_format.json_schema.schema", spec: grammar.Spec{Kind: grammar.JSONSchema, Text: "{}"}})
			default:
				asks = append(asks, schema("response_format.json_schema.schema", js.Schema))
			}
		case "":
			return spec, "", false, badField("response_format.type", "required (text, json_object or json_schema)")
		default:
			return spec, "", false, badField("response_format.type", "unknown type %q (text, json_object or json_schema)", rf.Type)
		}
	}
	if len(st.GuidedJSON) > 0 && string(st.GuidedJSON) != "null" {
		asks = append(asks, schema("guided_json", st.GuidedJSON))
	}
	if st.GuidedRegex != nil {
		asks = append(asks, ask{field: "guided_regex", spec: grammar.Spec{Kind: grammar.Regex, Text: *st.GuidedRegex}})
	}
	if st.GuidedChoice != nil {
		asks = append(asks, choice("guided_choice", st.GuidedChoice))
	}
	if so := st.StructuredOutputs; so != nil {
		n := len(asks)
		if len(so.JSON) > 0 && string(so.JSON) != "null" {
			asks = append(asks, schema("structured_outputs.json", so.JSON))
		}
		if so.Regex != nil {
			asks = append(asks, ask{field: "structured_outputs.regex", spec: grammar.Spec{Kind: grammar.Regex, Text: *so.Regex}})
		}
		if so.Choice != nil {
			asks = append(asks, choice("structured_outputs.choice", so.Choice))
		}
		if len(asks) == n {
			return spec, "", false, badField("structured_outputs", "give one of json, regex or choice")
		}
	}
	switch len(asks) {
	case 0:
		return spec, "", false, nil
	case 1:
		a := asks[0]
		return a.spec, a.field, a.err == nil, a.err
	}
	return spec, "", false, badField(asks[1].field, "only one structured output constraint per request (%s is given too)", asks[0].field)
}

// constrain compiles the request's structured output, if any, into p's
// constraint; reasoning may come first (grammar.Spec's After and
// AfterOpen: "" for none).
func (st *structured) constrain(p *params, lv *Live, maxTokField string, after, open string) *apiError {
	spec, field, ok, e := st.spec()
	if e != nil || !ok {
		return e
	}
	spec.After, spec.AfterOpen = after, open
	return compileInto(p, lv, spec, field, maxTokField)
}

// compileInto compiles spec (asked for by field) into p's constraint.
func compileInto(p *params, lv *Live, spec grammar.Spec, field, maxTokField string) *apiError {
	if lv == nil || lv.Grammar == nil {
		why := "the model has no tokenizer"
		if lv != nil && lv.GrammarErr != nil {
			why = lv.GrammarErr.Error()
		}
		return badField(field, "structured output is not available: %s", why)
	}
	g, err := lv.Grammar.Compile(spec)
	if err != nil {
		return badField(field, "%v", err)
	}
	if p.req.MaxTokens < g.MinTokens() {
		return badField(maxTokField, "the %s output needs at least %d tokens (its shortest text is %d bytes, each a token at worst), got %d", field, g.MinTokens(), g.MinTokens(), p.req.MaxTokens)
	}
	p.req.Constraint = g.Matcher()
	return nil
}
