package chat

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// tojson writes what transformers' tojson (Python's json.dumps) writes.
func TestToJSONAsPython(t *testing.T) {
	for tmpl, want := range map[string]string{
		`{{ x | tojson }}`:                              `{"a": [1, 2.5, "é<&>'"], "b": {"c": null, "d": true}}`,
		`{{ x | tojson(ensure_ascii=True) }}`:           `{"a": [1, 2.5, "\u00e9<&>'"], "b": {"c": null, "d": true}}`,
		`{{ {'z': 1, 'a': [ ]} | tojson }}`:             `{"z": 1, "a": []}`,
		`{{ '😀\n\u0001' | tojson(ensure_ascii=True) }}`: `"\ud83d\ude00\n\u0001"`,
		`{{ x.b | tojson(indent=2) }}`:                  "{\n  \"c\": null,\n  \"d\": true\n}",
		`{{ [] | tojson }}{{ {} | tojson }}`:            `[]{}`,
	} {
		tm, err := Parse([]byte(`{"chat_template": `+quoteJSON("{% if x is defined %}"+tmpl+"{% endif %}")+`}`), "")
		require.NoError(t, err, tmpl)
		out, _, err := tm.RenderWith(context.Background(), nil, Options{Kwargs: map[string]any{"x": map[string]any{"b": map[string]any{"d": true, "c": nil}, "a": []any{int64(1), 2.5, "é<&>'"}}}}, nil)
		require.NoError(t, err, tmpl)
		require.Equal(t, want, out, tmpl)
	}
	tm, err := Parse([]byte(`{"chat_template": "{% if x is defined %}{{ x | tojson(indent='a') }}{% endif %}"}`), "")
	require.NoError(t, err)
	_, _, err = tm.RenderWith(context.Background(), nil, Options{Kwargs: map[string]any{"x": 1}}, nil)
	require.ErrorContains(t, err, "indent")
	_, _, err = tm.RenderWith(context.Background(), nil, Options{Kwargs: map[string]any{"messages": 1}}, nil)
	require.ErrorContains(t, err, `"messages" is set by the server`)
}
