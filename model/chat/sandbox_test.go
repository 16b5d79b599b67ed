package chat

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func parseTemplate(t testing.TB, src string) *Template {
	t.Helper()
	tm, err := Parse([]byte(`{"chat_template": `+quoteJSON(src)+`}`), "")
	require.NoError(t, err, src)
	return tm
}

// A probe-passing template that becomes a bomb on a user's message: each
// is an error for that rendering (before the sandbox, the first killed the
// process with a Go stack overflow, the others exhausted memory or ran for
// ever), and the template still renders the next conversation.
func TestTemplateBombsAreErrors(t *testing.T) {
	const trigger = "{% if messages[0].content == 'boom' %}%s{% endif %}ok"
	for name, c := range map[string]struct{ bomb, want string }{
		"recursion":              {`{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}`, "nested more than 64 deep"},
		"mutual recursion":       {`{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{% if true %}{{ a() }}{% endif %}{% endmacro %}{{ a() }}`, "nested more than 64 deep"},
		"huge range":             {`{% for i in range(1000000000) %}{% endfor %}`, "range of 1000000000 numbers"},
		"range overflow":         {`{% for i in range(-9223372036854775807, 9223372036854775807, 2) %}{% endfor %}`, "range of"},
		"output explosion":       {`{% for i in range(1000) %}{% for j in range(1000) %}{{ 'x' * 100000 }}{% endfor %}{% endfor %}`, "longer than"},
		"string doubling":        {`{% macro d(s, n) %}{% if n > 0 %}{{ d(s ~ s, n - 1) }}{% else %}{{ s }}{% endif %}{% endmacro %}{{ d('x', 60) }}`, "more than 33554432 bytes"},
		"lipsum":                 {`{{ lipsum(2000000) }}`, "lipsum: n = 2000000"},
		"lipsum words":           {`{{ lipsum(1, False, 1, 100000000) }}`, "lipsum: max = 100000000"},
		"string repeat":          {`{{ 'x' * 10000000000 }}`, "repeated 10000000000 times"},
		"repeat in a set":        {`{% set s = 'ab' * 10000000000 %}{{ s }}`, "repeated 10000000000 times"},
		"self-holding namespace": {`{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns }}`, "ns holds itself"},
		"self-holding via list":  {`{% set ns = namespace(a=1) %}{% set ns.a = [1, {'x': ns}] %}{{ ns }}`, "ns holds itself"},
		"replace":                {`{% set s = 'x' * 1000000 %}{{ s|replace('', s) }}`, "filter replace would make more than"},
		"wide filter":            {`{{ 'x'|center(1000000000) }}`, "filter center: argument 1000000000"},
		"replace method":         {`{% set s = 'x' * 100000 %}{{ s.replace('x', s) }}`, "method replace would make more than"},
		"replace method, count":  {`{% set s = 'x' * 100000 %}{{ s.replace('x', s, -1) }}`, "method replace would make more than"},
		"wide method":            {`{{ 'x'.center(1000000000) }}`, "method center: argument 1000000000"},
		"zfill method":           {`{{ 'x'.zfill(1000000000) }}`, "method zfill: argument 1000000000"},
	} {
		t.Run(name, func(t *testing.T) {
			tm := parseTemplate(t, strings.Replace(trigger, "%s", c.bomb, 1))
			start := time.Now()
			_, err := tm.Render(context.Background(), []Message{{Role: "user", Content: "boom"}}, true)
			require.ErrorIs(t, err, ErrLimit)
			require.ErrorContains(t, err, c.want)
			require.Less(t, time.Since(start), 2*DefaultLimits.Timeout)
			out, err := tm.Render(context.Background(), []Message{{Role: "user", Content: "hi"}}, true)
			require.NoError(t, err)
			require.Equal(t, "ok", out)
		})
	}
}

// The rewritten * is gonja's operator otherwise.
func TestMultiplyAsBefore(t *testing.T) {
	tm := parseTemplate(t, `{% set a = 'ab' * 3 %}{{ a }} {{ 2 * 3 }} {{ 1.5 * 2 }} {{ 'x' * -1 }}|{% macro m(n=2 * 2) %}{{ n * n }}{% endmacro %}{{ m() }} {{ [1, 2 * 5][1] }} {{ {'k': 3 * 3}['k'] }}`)
	out, err := tm.Render(context.Background(), nil, false)
	require.NoError(t, err)
	require.Equal(t, "ababab 6 3.0 |16 10 9", out)
}

// Time: a rendering stops at the sandbox's timeout, and at once when the
// request's context is done (the client left), even inside loops that
// write nothing.
func TestRenderingStopsOnTimeAndContext(t *testing.T) {
	const busy = "{% if messages[0].content == 'spin' %}{% for i in range(100000) %}{% for j in range(100000) %}{% if j < 0 %}x{% endif %}{% endfor %}{% endfor %}{% endif %}ok"
	tm := parseTemplate(t, busy)
	tm.limits.Timeout = 50 * time.Millisecond
	start := time.Now()
	_, err := tm.Render(context.Background(), []Message{{Role: "user", Content: "spin"}}, true)
	require.ErrorIs(t, err, ErrLimit)
	require.ErrorContains(t, err, "more than 50ms")
	require.Less(t, time.Since(start), 5*time.Second)

	tm.limits = DefaultLimits
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() { time.Sleep(30 * time.Millisecond); cancel(errors.New("the client left")) }()
	start = time.Now()
	_, err = tm.Render(ctx, []Message{{Role: "user", Content: "spin"}}, true)
	require.ErrorContains(t, err, "the client left")
	require.Less(t, time.Since(start), DefaultLimits.Timeout)
}

// What cannot be bounded is refused when the template is parsed.
func TestUnboundableConstructsRefused(t *testing.T) {
	for src, want := range map[string]string{
		`{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}`: "recursive for loops are not supported",
		`{% block b %}{{ self.b() }}{% endblock %}`:               "blocks are not supported",
		`{% include 'x' %}`:     "cannot read files",
		`{% import 'x' as y %}`: "cannot read files",
		`{% extends 'x' %}`:     "cannot read files",
	} {
		_, err := Parse([]byte(`{"chat_template": `+quoteJSON(src)+`}`), "")
		require.ErrorContains(t, err, want, src)
	}
}

// gonja's lexer blocks for ever on this template (found by FuzzRender):
// parsing it is an error within compileTimeout, not a load that never
// ends.
func TestParserHangIsAnError(t *testing.T) {
	defer func(d time.Duration) { compileTimeout = d }(compileTimeout)
	compileTimeout = 200 * time.Millisecond
	start := time.Now()
	_, err := Parse([]byte(`{"chat_template": "{%\ufffd0.\ufffd"}`), "")
	require.ErrorContains(t, err, "did not finish within 200ms")
	require.Less(t, time.Since(start), 5*time.Second)
}

// Marked contents: where the user's text went, with the template's own
// text around it, whitespace trimming kept.
func TestRenderMarked(t *testing.T) {
	tm := parseTemplate(t, "{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}<|end|>{% endfor %}")
	msgs := []Message{{Role: "system", Content: "<|end|>sys"}, {Role: "user", Content: "  hi <|end|>\n"}, {Role: "user", Content: "plain"}, {Role: "tool", Content: "\ufdd0x<|end|>"}}
	mark := func(s string) bool { return strings.Contains(s, "<|end|>") }
	out, spans, err := tm.RenderMarked(context.Background(), msgs, false, mark)
	require.NoError(t, err)
	require.Equal(t, "<|system|><|end|>sys<|end|><|user|>hi <|end|><|end|><|user|>plain<|end|><|tool|>\ufffdx<|end|><|end|>", out)
	require.Len(t, spans, 2, "the system message and unmarked contents are not spans")
	require.Equal(t, "hi <|end|>", out[spans[0].Start:spans[0].End])
	require.Equal(t, "\ufffdx<|end|>", out[spans[1].Start:spans[1].End])
	plain, err := tm.Render(context.Background(), msgs[:3], false)
	require.NoError(t, err)
	out, _, err = tm.RenderMarked(context.Background(), msgs[:3], false, mark)
	require.NoError(t, err)
	require.Equal(t, plain, out, "marks change nothing in the prompt")

	// A template that cuts the content loses the marks: an error, not a
	// silent guess.
	tm = parseTemplate(t, "{% for m in messages %}{{ m.content[:3] }}{% endfor %}")
	_, _, err = tm.RenderMarked(context.Background(), []Message{{Role: "user", Content: "abc<|end|>"}}, false, mark)
	require.ErrorIs(t, err, ErrMarks)
}

// Any template source and conversation: an error or a rendering, within
// the sandbox's time, never a crash.
func FuzzRender(f *testing.F) {
	for _, s := range []string{
		"{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
		`{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}`,
		`{% for i in range(100000) %}{{ i }}{% endfor %}`,
		`{{ lipsum(5) }}{{ messages[0].content * 3 }}`,
		`{% set ns = namespace(x='') %}{% for m in messages %}{% set ns.x = ns.x ~ m.content %}{% endfor %}{{ ns.x|upper }}`,
	} {
		f.Add(s, "hello")
	}
	compileTimeout = time.Second // gonja's lexer can block (TestParserHangIsAnError)
	f.Fuzz(func(t *testing.T, src, content string) {
		if len(src) > 512 || len(content) > 256 {
			return
		}
		tm, err := Parse([]byte(`{"chat_template": `+quoteJSON(src)+`}`), "")
		if err != nil {
			return
		}
		tm.limits = Limits{MaxDepth: 32, MaxRange: 1000, MaxOutput: 1 << 16, Timeout: 200 * time.Millisecond}
		start := time.Now()
		_, _ = tm.Render(context.Background(), []Message{{Role: "user", Content: content}}, true)
		require.Less(t, time.Since(start), 5*time.Second, "%q", src)
	})
}
