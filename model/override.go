package model

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
)

// perLayerFields are the text_config lists with one entry per layer.
var perLayerFields = []string{"layer_types", "mlp_layer_types", "indexer_types"}

// WithSet returns a copy of c with some text_config fields set to other
// values (JSON), e.g. {"num_hidden_layers": 20}: every key must be a
// text_config field (model_type excepted), and the result must validate.
// When num_hidden_layers changes and a per-layer list (layer_types,
// mlp_layer_types, indexer_types) is not set too, the list is cut to the
// new count (the schedule's first layers) when it gets shorter, and derived
// again by ParseConfig's rules when it gets longer. The quantization_config
// and the end-of-sequence ids are kept; source names the result (messages).
func (c *Config) WithSet(set map[string]json.RawMessage, source string) (*Config, error) {
	m := c.TextConfigMap()
	for _, k := range slices.Sorted(maps.Keys(set)) {
		if _, ok := m[k]; !ok || k == "model_type" {
			return nil, fmt.Errorf("set %s: not a text_config field", k)
		}
		var v any
		if err := json.Unmarshal(set[k], &v); err != nil {
			return nil, fmt.Errorf("set %s: the value is not JSON: %w", k, err)
		}
		m[k] = v
	}
	if raw, ok := set["num_hidden_layers"]; ok {
		var n int
		if err := json.Unmarshal(raw, &n); err != nil || n < 1 {
			return nil, fmt.Errorf("set num_hidden_layers: %s is not a positive integer", raw)
		}
		for _, f := range perLayerFields {
			if _, given := set[f]; given {
				continue
			}
			if n < c.NumHiddenLayers {
				m[f] = cutList(m[f], n)
			} else {
				delete(m, f) // derived again for the new count
			}
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	out, err := ParseConfig(b, source)
	if err != nil {
		return nil, err
	}
	if c.Quant != nil {
		q := *c.Quant
		q.ModulesToNotConvert = slices.Clone(c.Quant.ModulesToNotConvert)
		out.Quant = &q
	}
	if err := out.Validate(); err != nil {
		return nil, err
	}
	return out, nil
}

// cutList keeps the first n entries of a per-layer list (any slice type of
// TextConfigMap's).
func cutList(v any, n int) any {
	switch l := v.(type) {
	case []LayerType:
		return l[:min(n, len(l))]
	case []MLPType:
		return l[:min(n, len(l))]
	case []IndexerType:
		return l[:min(n, len(l))]
	}
	return v
}
