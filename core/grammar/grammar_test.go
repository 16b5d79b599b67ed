package grammar

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/glmflash/glmflash/core/sample"
)

// matches runs text through g's DFA from its start.
func matches(g *Grammar, text []byte) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.d.start
	for _, c := range text {
		if s = g.d.next(s, c); s == dead {
			return false
		}
	}
	return g.d.states[s].accept
}

func TestUTF8Sequences(t *testing.T) {
	v := fakeVocab(t)
	for _, r := range [][2]rune{{0, 0x10FFFF}, {0x41, 0x5A}, {0x7F, 0x800}, {0xD000, 0xE100}, {0x10000, 0x10FFFF}, {0x3B1, 0x3C9}, {0xFFFF, 0x10000}} {
		n := newNFA()
		start := n.runes([][2]rune{r}, acceptState)
		g, err := newGrammar(n, start, v)
		if err != nil {
			t.Fatal(err)
		}
		for c := rune(0); c <= 0x10FFFF; c++ {
			if c&0xFF > 3 && c&0xFF < 0xFC && c-r[0] > 3 && r[1]-c > 3 && c%97 != 0 {
				continue // boundaries and a sample
			}
			want := c >= r[0] && c <= r[1] && (c < 0xD800 || c > 0xDFFF)
			if got := matches(g, utf8.AppendRune(nil, c)) && utf8.ValidRune(c); got != want {
				t.Fatalf("range %x-%x, rune %x: match %v, want %v", r[0], r[1], c, got, want)
			}
		}
		// Invalid UTF-8 never matches.
		for _, bad := range []string{"\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\x80", "\xe0\x80\x80"} {
			if matches(g, []byte(bad)) {
				t.Fatalf("range %x-%x matches invalid %q", r[0], r[1], bad)
			}
		}
	}
}

var regexes = []string{
	`[a-z]+`, `abc|abd|x*`, `(ab)*c?`, `\d{3}-\d{4}`, `[^a-z]{2,5}`, `(?i)hello`, `é+|日本`, `.{0,3}x`,
	`^(yes|no)$`, `[\p{Greek}]{1,3}`, `a(b|c){2}d`, `(0|[1-9][0-9]*)(\.[0-9]+)?`, `\w+@\w+\.com`, `(?s).z`,
}

// TestRegexAgreesWithGo checks the compiled automaton against Go's regexp
// on random strings and on the grammar's own random outputs (which must
// all match).
func TestRegexAgreesWithGo(t *testing.T) {
	v := fakeVocab(t)
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "b", "c", "d", "x", "z", "é", "日", "本", "1", "0", "-", ".", "@", "α", "\n", "H", "e", "l", "o", "y", "n", "s", "\xc3"}
	for _, expr := range regexes {
		g := compile(t, v, Spec{Kind: Regex, Text: expr})
		re := regexp.MustCompile(`^(?:` + expr + `)$`)
		for range 300 {
			var sb strings.Builder
			for range r.IntN(8) {
				sb.WriteString(alphabet[r.IntN(len(alphabet))])
			}
			s := sb.String()
			if got, want := matches(g, []byte(s)), re.MatchString(s) && utf8.ValidString(s); got != want {
				t.Fatalf("%s on %q: automaton %v, regexp %v", expr, s, got, want)
			}
		}
		for range 100 {
			out, _ := walk(t, g, r, g.MinTokens()+r.IntN(30), 0.3)
			if !re.Match(out) || !utf8.Valid(out) {
				t.Fatalf("%s: random output %q does not match", expr, out)
			}
		}
	}
}

func TestRegexRefusals(t *testing.T) {
	v := fakeVocab(t)
	for expr, want := range map[string]string{
		`a\bb`:               "word boundary",
		`(?m)^a$`:            "line anchor",
		`a{1001}`:            "repeat count",
		`[`:                  "invalid regular expression",
		`a^b`:                "anchor",
		`[^\x00-\x{10FFFF}]`: "accepts no text",
	} {
		_, err := NewCompiler(v).Compile(Spec{Kind: Regex, Text: expr})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want it to say %q", expr, err, want)
		}
	}
}

var schemas = []string{
	`{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"],"additionalProperties":false}`,
	`{"type":"object","properties":{"a":{"type":"string","maxLength":3},"b":{"type":"number"},"c":{"type":"boolean"},"d":{"type":"null"}},"required":["c"]}`,
	`{"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":4}`,
	`{"type":"array","items":{"enum":["x","y",3,null,{"k":[1,2]}]},"minItems":2}`,
	`{"anyOf":[{"type":"string","minLength":2,"maxLength":4},{"type":"integer"}]}`,
	`{"oneOf":[{"type":"string"},{"type":"boolean"}]}`,
	`{"oneOf":[{"type":"object","properties":{"k":{"const":"a"}}},{"type":"array","items":{"type":"integer"}},{"enum":["x","y"]},{"const":"z"},{"type":"null"}]}`,
	`{"type":["string","integer"],"enum":["a",1,1.5,null]}`, `{"type":"string","const":"fixed"}`,
	`{"type":["string","null"]}`,
	`{"const":{"a":1,"b":[true]}}`,
	`{"$defs":{"pt":{"type":"object","properties":{"x":{"type":"number"},"y":{"type":"number"}},"required":["x","y"]}},"type":"object","properties":{"from":{"$ref":"#/$defs/pt"},"to":{"$ref":"#/$defs/pt"}},"required":["from"]}`,
	`{"definitions":{"s":{"type":"string","pattern":"[a-c]{2,3}"}},"type":"array","items":{"$ref":"#/definitions/s"},"maxItems":2}`,
	`{"type":"string","format":"date"}`, `{"type":"string","format":"time"}`, `{"type":"string","format":"date-time"}`,
	`{"type":"string","format":"uuid"}`, `{"type":"string","format":"email"}`,
	`{"type":"string","pattern":"^[A-Z][a-z]+( [A-Z][a-z]+)*$"}`,
	`{"type":"object"}`, `{}`, `{"type":"array"}`,
	`{"type":"object","properties":{"o":{"type":"object","properties":{"p":{"type":"array","items":{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}}}}},"required":["o"],"title":"nested","description":"annotations are ignored"}`,
	`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"},"c":{"type":"string"}}}`,
}

// TestSchemaRandomWalksValidate generates random outputs of every schema
// over the masks and validates each against the schema with a real JSON
// Schema validator (formats asserted).
func TestSchemaRandomWalksValidate(t *testing.T) {
	v := fakeVocab(t)
	r := rand.New(rand.NewPCG(3, 4))
	for i, text := range schemas {
		g := compile(t, v, Spec{Kind: JSONSchema, Text: text})
		sch := validator(t, text)
		for range 200 {
			budget := g.MinTokens() + r.IntN(60)
			out, n := walk(t, g, r, budget, 0.5)
			if n > budget {
				t.Fatalf("schema %d: %d tokens for a budget of %d", i, n, budget)
			}
			checkValid(t, sch, text, out)
		}
	}
}

func validator(t testing.TB, text string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func checkValid(t testing.TB, sch *jsonschema.Schema, text string, out []byte) {
	t.Helper()
	if bytes.ContainsAny(out, " \t\r\n") && !json.Valid(out) {
		t.Fatalf("%s: output %q is not JSON", text, out)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(out))
	if err != nil {
		t.Fatalf("%s: output %q does not parse: %v", text, out, err)
	}
	if err := sch.Validate(inst); err != nil {
		t.Fatalf("%s: output %q does not validate: %v", text, out, err)
	}
}

func TestSchemaRefusals(t *testing.T) {
	v := fakeVocab(t)
	for text, want := range map[string]string{
		`{"oneOf":[{"type":"object","properties":{"k":{"const":"a"}}},{"type":"object","properties":{"k":{"const":"b"}}}]}`: "branches 0 and 1 may both accept a value of type object",
		`{"type":"array","enum":[""]}`:                                                                    "schema.enum: no value of type array",
		`{"oneOf":[{"enum":["a","b"]},{"const":"b"}]}`:                                                    "type string",
		`{"type":"integer","minimum":3}`:                                                                  `schema.minimum: the keyword "minimum" is not supported`,
		`{"type":"object","patternProperties":{}}`:                                                        `"patternProperties"`,
		`{"type":"object","properties":{"a":{"type":"string","maxLength":2000}}}`:                         "schema.properties.a.maxLength: at most 1000",
		`{"$defs":{"n":{"type":"object","properties":{"next":{"$ref":"#/$defs/n"}}}},"$ref":"#/$defs/n"}`: "recursive",
		`{"$ref":"http://example.com/s.json"}`:                                                            "only references to #/$defs/NAME",
		`{"$ref":"#/$defs/missing","$defs":{}}`:                                                           "no such definition",
		`{"type":"object","additionalProperties":{"type":"string"}}`:                                      "schema.additionalProperties",
		`{"type":"object","properties":{"a":{}},"required":["b"]}`:                                        `schema.required: names "b"`,
		`{"type":"string","format":"ipv4"}`:                                                               `schema.format: "ipv4" is not supported`,
		`{"type":"thing"}`:                                                                                `schema.type: unknown type "thing"`,
		`{"type":"string","minItems":1}`:                                                                  "schema.minItems: does not apply to type string",
		`{"enum":[]}`:                                                                                     "schema.enum: must be a non-empty array",
		`{"type":"string","pattern":"\""}`:                                                                "schema.pattern",
		`[1]`:                                                                                             "a schema must be an object",
		`{"type":"string","minLength":3,"maxLength":2}`:                                                   "exceeds maxLength",
		`{"oneOf":[{},{}]}`:                                                                               "schema.oneOf: branches 0 and 1 may both accept a value of type string/number/boolean/null/object/array",
		`{"oneOf":[{"type":"integer"},{"type":"number"}]}`:                                                "branches 0 and 1 may both accept a value of type number",
	} {
		_, err := NewCompiler(v).Compile(Spec{Kind: JSONSchema, Text: text})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want it to say %q", text, err, want)
		}
	}
}

func TestJSONObjectAndChoice(t *testing.T) {
	v := fakeVocab(t)
	r := rand.New(rand.NewPCG(5, 6))
	g := compile(t, v, Spec{Kind: JSONObject})
	for range 200 {
		out, _ := walk(t, g, r, g.MinTokens()+r.IntN(80), 0.4)
		var m map[string]any
		if err := json.Unmarshal(out, &m); err != nil {
			t.Fatalf("json_object output %q: %v", out, err)
		}
		if bytes.ContainsAny(out, " \n") && !bytes.Contains(out, []byte(`"`)) {
			t.Fatalf("free whitespace in %q", out)
		}
	}
	if g.MinTokens() != 2 {
		t.Fatalf("json_object needs %d tokens, want 2 ({})", g.MinTokens())
	}
	choices := []string{"yes", "no", "maybe so", "日本"}
	b, _ := json.Marshal(choices)
	g = compile(t, v, Spec{Kind: Choice, Text: string(b)})
	seen := map[string]bool{}
	for range 200 {
		out, _ := walk(t, g, r, 10, 0.5)
		seen[string(out)] = true
	}
	for s := range seen {
		if !strings.Contains(string(b), `"`+s+`"`) {
			t.Fatalf("choice output %q is not a choice", s)
		}
	}
	if len(seen) != len(choices) {
		t.Fatalf("saw %v of %v", seen, choices)
	}
	if g.MinTokens() != 2 {
		t.Fatalf("choice needs %d tokens, want 2 (no)", g.MinTokens())
	}
	for _, bad := range []string{`[]`, `"x"`, `[1]`} {
		if _, err := NewCompiler(v).Compile(Spec{Kind: Choice, Text: bad}); err == nil {
			t.Errorf("choice %s accepted", bad)
		}
	}
}

// TestBudgetTight: with exactly MinTokens tokens, every random output
// still completes (the masks steer it to the shortest completion).
func TestBudgetTight(t *testing.T) {
	v := fakeVocab(t)
	r := rand.New(rand.NewPCG(7, 8))
	for _, text := range schemas[:10] {
		g := compile(t, v, Spec{Kind: JSONSchema, Text: text})
		sch := validator(t, text)
		for range 50 {
			out, n := walk(t, g, r, g.MinTokens(), 0)
			if n > g.MinTokens() {
				t.Fatalf("%d tokens, budget %d", n, g.MinTokens())
			}
			checkValid(t, sch, text, out)
		}
	}
}

// TestBudgetChangesMask: a budget too short for long tokens leaves them out.
func TestBudgetChangesMask(t *testing.T) {
	v := fakeVocab(t)
	g := compile(t, v, Spec{Kind: Regex, Text: `(ab|cd)*`})
	m := g.Matcher()
	ab := tokenOf(t, "ab")
	a := tokenOf(t, "a")
	if !sample.Allowed(m.Allow(100), ab) || !sample.Allowed(m.Allow(100), a) {
		t.Fatal("ab and a must be allowed with a large budget")
	}
	if !sample.Allowed(m.Allow(100), fakeEOS) {
		t.Fatal("EOS must be allowed where the regex accepts")
	}
	// One token left: only a token that completes (ab, cd) or EOS.
	one := m.Allow(1)
	if !sample.Allowed(one, ab) || sample.Allowed(one, a) || !sample.Allowed(one, fakeEOS) {
		t.Fatalf("with one token left: ab %v, a %v, EOS %v", sample.Allowed(one, ab), sample.Allowed(one, a), sample.Allowed(one, fakeEOS))
	}
	if done, err := m.Accept(ab); err != nil || !done {
		t.Fatalf("ab as the last token: done %v, err %v (want done: no token may follow)", done, err)
	}
	// After an incomplete token EOS is refused.
	m = g.Matcher()
	m.Allow(10)
	if _, err := m.Accept(a); err != nil {
		t.Fatal(err)
	}
	if sample.Allowed(m.Allow(10), fakeEOS) {
		t.Fatal("EOS allowed after an incomplete pair")
	}
	if _, err := m.Accept(fakeEOS); err == nil {
		t.Fatal("EOS accepted before the output completes")
	}
	if _, err := m.Accept(fakeSpecial); err == nil {
		t.Fatal("a special token was accepted")
	}
	if _, err := m.Accept(tokenOf(t, "z")); err == nil {
		t.Fatal("a token the grammar refuses was accepted")
	}
}

func tokenOf(t *testing.T, s string) int32 {
	t.Helper()
	for id, b := range newFakeTokens().toks {
		if string(b) == s {
			return int32(id)
		}
	}
	t.Fatalf("no token %q", s)
	return 0
}

func TestFinalIsDone(t *testing.T) {
	v := fakeVocab(t)
	g := compile(t, v, Spec{Kind: Choice, Text: `["true"]`})
	m := g.Matcher()
	m.Allow(10)
	done, err := m.Accept(tokenOf(t, "true"))
	if err != nil || !done {
		t.Fatalf("the only choice: done %v, err %v", done, err)
	}
	if _, err := m.Accept(tokenOf(t, "a")); err == nil {
		t.Fatal("a token after the output completed was accepted")
	}
}

func TestMasksCachedPerState(t *testing.T) {
	v := fakeVocab(t)
	g := compile(t, v, Spec{Kind: JSONObject})
	r := rand.New(rand.NewPCG(9, 9))
	walk(t, g, r, 40, 0.2)
	m := g.Matcher()
	m.Allow(1000)
	w := g.Walks()
	m2 := g.Matcher()
	m2.Allow(1000)
	if g.Walks() != w {
		t.Fatalf("the start state's mask was walked again (%d → %d walks)", w, g.Walks())
	}
	c := NewCompiler(v)
	g1, _ := c.Compile(Spec{Kind: JSONObject})
	g2, _ := c.Compile(Spec{Kind: JSONObject})
	if g1 != g2 || c.Cached() != 1 {
		t.Fatal("the compiler did not reuse its compiled grammar")
	}
	for i := range MaxCached + 5 {
		if _, err := c.Compile(Spec{Kind: Regex, Text: strings.Repeat("a", i+1)}); err != nil {
			t.Fatal(err)
		}
	}
	if c.Cached() != MaxCached {
		t.Fatalf("%d grammars cached, bound %d", c.Cached(), MaxCached)
	}
}

func TestAfter(t *testing.T) {
	v := fakeVocab(t)
	r := rand.New(rand.NewPCG(11, 12))
	text := schemas[0]
	g := compile(t, v, Spec{Kind: JSONSchema, Text: text, After: "</think>"})
	sch := validator(t, text)
	if min := compile(t, v, Spec{Kind: JSONSchema, Text: text}).MinTokens(); g.MinTokens() != min+len("</think>") {
		t.Fatalf("min %d, want %d + 8", g.MinTokens(), min)
	}
	for range 200 {
		out, _ := walk(t, g, r, g.MinTokens()+r.IntN(40), 0.5)
		i := bytes.Index(out, []byte("</think>"))
		if i < 0 {
			t.Fatalf("no </think> in %q", out)
		}
		checkValid(t, sch, text, out[i+len("</think>"):])
	}
	// The free text ends at the first </think>: "</thi" "nk>" is the end too.
	m := g.Matcher()
	for _, p := range []string{"abc", "</", "think", ">"} {
		m.Allow(100)
		if _, err := m.Accept(tokenOf(t, p)); err != nil {
			t.Fatal(err)
		}
	}
	m.Allow(100)
	if _, err := m.Accept(tokenOf(t, "abc")); err == nil {
		t.Fatal("free text accepted after </think>")
	}
}

func TestToolCalls(t *testing.T) {
	v := fakeVocab(t)
	r := rand.New(rand.NewPCG(13, 14))
	weather := `{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"},"unit":{"type":"string","enum":["c","f"]}},"required":["city"]}`
	spec, err := ToolCallsSpec(ToolCallSpec{Tools: []ToolSpec{
		{Name: "get_weather", Parameters: json.RawMessage(weather)},
		{Name: "now"},
	}, Parallel: true})
	if err != nil {
		t.Fatal(err)
	}
	g := compile(t, v, spec)
	sch := validator(t, weather)
	call := regexp.MustCompile(`(?s)<tool_call>([a-z_]+)\n((?:<arg_key>[^<]*</arg_key>\n<arg_value>[^<]*</arg_value>\n)*)</tool_call>`)
	arg := regexp.MustCompile(`<arg_key>([^<]*)</arg_key>\n<arg_value>([^<]*)</arg_value>\n`)
	for range 200 {
		out, _ := walk(t, g, r, g.MinTokens()+r.IntN(80), 0.5)
		calls := call.FindAllSubmatchIndex(out, -1)
		if len(calls) == 0 {
			t.Fatalf("no tool call in %q", out)
		}
		// The calls cover the output, separated by newlines.
		pos := 0
		for i, c := range calls {
			if i > 0 {
				if string(out[pos:c[0]]) != "\n" {
					t.Fatalf("calls not separated by a newline in %q", out)
				}
			} else if c[0] != 0 && string(out[:c[0]]) != "\n" {
				t.Fatalf("text before the first call in %q", out)
			}
			pos = c[1]
			name := string(out[c[2]:c[3]])
			args := map[string]any{}
			for _, a := range arg.FindAllSubmatch(out[c[4]:c[5]], -1) {
				k, val := string(a[1]), string(a[2])
				if k == "days" {
					var n any
					if err := json.Unmarshal([]byte(val), &n); err != nil {
						t.Fatalf("days %q is not JSON", val)
					}
					args[k] = n
				} else {
					args[k] = val
				}
			}
			switch name {
			case "get_weather":
				b, _ := json.Marshal(args)
				checkValid(t, sch, weather, b)
			case "now":
				if len(args) != 0 {
					t.Fatalf("now got arguments %v", args)
				}
			default:
				t.Fatalf("unknown function %q", name)
			}
		}
		if pos != len(out) {
			t.Fatalf("text after the calls in %q", out)
		}
	}
	for _, bad := range []ToolCallSpec{{}, {Tools: []ToolSpec{{Name: "a<b"}}}, {Tools: []ToolSpec{{Name: "f", Parameters: json.RawMessage(`{"type":"array"}`)}}}} {
		spec, _ := ToolCallsSpec(bad)
		if _, err := NewCompiler(v).Compile(spec); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestVocabRefusals(t *testing.T) {
	f := newFakeTokens()
	f.toks[7] = []byte("\x07\x07") // no single-byte token for 0x07 now
	if _, err := NewVocab(f, len(f.toks), []int32{fakeEOS}); err == nil || !strings.Contains(err.Error(), "0x07") {
		t.Fatalf("a vocabulary without byte 0x07: %v", err)
	}
	f = newFakeTokens()
	if _, err := NewVocab(f, 10, []int32{fakeEOS}); err == nil {
		t.Fatal("a model vocabulary smaller than the tokenizer's accepted")
	}
}

// Without an EOS id the output ends where the grammar first accepts.
func TestNoEOSEndsAtAcceptance(t *testing.T) {
	f := newFakeTokens()
	v, err := NewVocab(f, len(f.toks), nil)
	if err != nil {
		t.Fatal(err)
	}
	g := compile(t, v, Spec{Kind: JSONObject})
	m := g.Matcher()
	for i, p := range []string{`{"`, "a", `":`, "12", "}"} {
		if sample.Allowed(m.Allow(50), fakeEOS) {
			t.Fatal("the EOS of the tokenizer is allowed though the model has none")
		}
		done, err := m.Accept(tokenOf(t, p))
		if err != nil || done != (i == 4) {
			t.Fatalf("after %q: done %v, err %v", p, done, err)
		}
	}
}

// With the state and mask caches bounded small, they are dropped and
// rebuilt as outputs go on: outputs stay valid and memory bounded.
func TestCachesDroppedAtTheirBounds(t *testing.T) {
	v := fakeVocab(t)
	r := rand.New(rand.NewPCG(15, 16))
	text := schemas[8]
	nf, start, err := build(Spec{Kind: JSONSchema, Text: text})
	if err != nil {
		t.Fatal(err)
	}
	g, err := newGrammar(nf, start, v)
	if err != nil {
		t.Fatal(err)
	}
	g.d.maxStates = 8
	g.maxMaskBytes = 3 * 4 * len(g.Matcher().Allow(1000))
	sch := validator(t, text)
	for range 50 {
		out, _ := walk(t, g, r, g.MinTokens()+r.IntN(40), 0.5)
		checkValid(t, sch, text, out)
		g.mu.Lock()
		states, bytes := len(g.d.states), g.maskBytes
		g.mu.Unlock()
		if bytes > g.maxMaskBytes {
			t.Fatalf("%d mask bytes cached, bound %d", bytes, g.maxMaskBytes)
		}
		if states > 8+200 { // a walk may overshoot by the states it visits
			t.Fatalf("%d DFA states kept, bound 8", states)
		}
	}
	if g.gen == 0 {
		t.Fatal("the DFA's cache was never dropped")
	}
}

// Requests share a grammar from many goroutines (the compiler's cache):
// run under -race.
func TestGrammarSharedConcurrently(t *testing.T) {
	v := fakeVocab(t)
	c := NewCompiler(v)
	text := schemas[0]
	sch := validator(t, text)
	done := make(chan []byte, 8)
	for i := range 8 {
		go func() {
			g, err := c.Compile(Spec{Kind: JSONSchema, Text: text})
			if err != nil {
				t.Error(err)
				done <- nil
				return
			}
			r := rand.New(rand.NewPCG(uint64(i), 17))
			out, _ := walk(t, g, r, g.MinTokens()+30, 0.5)
			done <- out
		}()
	}
	for range 8 {
		out := <-done
		checkValid(t, sch, text, out)
	}
	if c.Cached() != 1 {
		t.Fatalf("%d grammars cached for one spec", c.Cached())
	}
}
