package model

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// WithSet over a checkpoint's config.json: fewer layers keep the schedule's
// first ones, more derive it again; other fields, the quantization and the
// end ids are kept; unknown fields and bad values are refused.
func TestWithSet(t *testing.T) {
	base, err := ReadConfig("../testdata/glm5next-tiny-a/checkpoint")
	require.NoError(t, err)
	base.Quant = &QuantConfig{Method: "fp8", Fmt: "e4m3", ActivationScheme: "dynamic", WeightBlockSize: [2]int{128, 128}, ModulesToNotConvert: []string{"lm_head"}}
	set := func(kv map[string]string) map[string]json.RawMessage {
		out := map[string]json.RawMessage{}
		for k, v := range kv {
			out[k] = json.RawMessage(v)
		}
		return out
	}
	short, err := base.WithSet(set(map[string]string{"num_hidden_layers": "4"}), "short")
	require.NoError(t, err)
	assert.Equal(t, 4, short.NumHiddenLayers)
	assert.Equal(t, base.LayerTypes[:4], short.LayerTypes)
	assert.Equal(t, base.MLPLayerTypes[:4], short.MLPLayerTypes)
	assert.Equal(t, base.IndexerTypes[:4], short.IndexerTypes)
	assert.Equal(t, base.Quant, short.Quant)
	assert.Equal(t, base.EOSTokenIDs, short.EOSTokenIDs)
	assert.Equal(t, base.HiddenSize, short.HiddenSize)

	long, err := base.WithSet(set(map[string]string{"num_hidden_layers": "20"}), "long")
	require.NoError(t, err)
	assert.Equal(t, 20, long.NumHiddenLayers)
	require.Len(t, long.LayerTypes, 20)
	assert.Equal(t, base.LayerTypes, long.LayerTypes[:base.NumHiddenLayers], "the derived schedule extends the fixture's")
	for i := range 20 {
		assert.Equal(t, i%4 == 3, long.IsDSA(i), "layer %d", i)
	}

	experts, err := base.WithSet(set(map[string]string{"n_routed_experts": "4", "num_experts_per_tok": "1"}), "experts")
	require.NoError(t, err)
	assert.Equal(t, 4, experts.NRoutedExperts)
	assert.Equal(t, base.LayerTypes, experts.LayerTypes)

	for kv, want := range map[string]string{
		`{"no_such_field": 1}`:       "set no_such_field: not a text_config field",
		`{"model_type": "x"}`:        "set model_type: not a text_config field",
		`{"num_hidden_layers": 0}`:   "set num_hidden_layers: 0 is not a positive integer",
		`{"num_hidden_layers": 2.5}`: "set num_hidden_layers: 2.5 is not a positive integer",
	} {
		var m map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(kv), &m))
		_, err := base.WithSet(m, "x")
		assert.ErrorContains(t, err, want, kv)
	}
	_, err = base.WithSet(map[string]json.RawMessage{"hidden_size": json.RawMessage("{")}, "x")
	assert.ErrorContains(t, err, "set hidden_size: the value is not JSON")
}
