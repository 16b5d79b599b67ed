package grammar

import (
	"encoding/json"
	"math/rand/v2"
	"regexp"
	"testing"
	"time"
	"unicode/utf8"

	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// FuzzRegex: any expression either is refused with an error or compiles
// to an automaton whose random outputs Go's regexp matches in whole.
func FuzzRegex(f *testing.F) {
	for _, re := range regexes {
		f.Add(re, uint64(1))
	}
	f.Add(`(a|b)*c{2,3}[^x]?`, uint64(2))
	f.Add(`\pL+\d*`, uint64(3))
	v := fakeVocab(f)
	f.Fuzz(func(t *testing.T, expr string, seed uint64) {
		if len(expr) > 64 {
			return // counted repetitions of long expressions only cost time
		}
		n, start, err := build(Spec{Kind: Regex, Text: expr})
		if err != nil {
			return
		}
		g, err := newGrammar(n, start, v)
		if err != nil {
			return
		}
		re, err := regexp.Compile(expr)
		if err != nil {
			t.Fatalf("%q compiled here but not in Go: %v", expr, err)
		}
		re.Longest() // a whole match, if any, is the leftmost-longest
		r := rand.New(rand.NewPCG(seed, 0))
		for range 3 {
			out, _ := walk(t, g, r, g.MinTokens()+r.IntN(20), 0.3)
			if loc := re.FindIndex(out); loc == nil || loc[0] != 0 || loc[1] != len(out) || !utf8.Valid(out) {
				t.Fatalf("%q: output %q does not match", expr, out)
			}
		}
	})
}

// FuzzSchema: any schema text either is refused with an error or compiles
// to an automaton whose random outputs validate against it.
func FuzzSchema(f *testing.F) {
	for _, s := range schemas {
		f.Add(s, uint64(1))
	}
	v := fakeVocab(f)
	f.Fuzz(func(t *testing.T, text string, seed uint64) {
		if len(text) > 512 {
			return
		}
		t0 := time.Now()
		n, start, err := build(Spec{Kind: JSONSchema, Text: text})
		if err != nil {
			return
		}
		g, err := newGrammar(n, start, v)
		if d := time.Since(t0); d > 5*time.Second {
			t.Fatalf("%q took %v to compile", text, d)
		}
		if err != nil || g.MinTokens() > 500 {
			return // long outputs only cost the walk time
		}
		doc, err := jsonschema.UnmarshalJSON(jsonReader(text))
		if err != nil {
			t.Fatalf("%q compiled but is not JSON: %v", text, err)
		}
		c := jsonschema.NewCompiler()
		c.AssertFormat()
		if err := c.AddResource("s.json", doc); err != nil {
			return
		}
		sch, err := c.Compile("s.json")
		if err != nil {
			return // a schema the validator refuses (e.g. a bad regex dialect)
		}
		r := rand.New(rand.NewPCG(seed, 0))
		for range 3 {
			out, _ := walk(t, g, r, g.MinTokens()+r.IntN(30), 0.5)
			if !json.Valid(out) {
				t.Fatalf("%s: output %q is not JSON", text, out)
			}
			inst, err := jsonschema.UnmarshalJSON(jsonReader(string(out)))
			if err != nil {
				t.Fatalf("%s: output %q: %v", text, out, err)
			}
			if err := sch.Validate(inst); err != nil {
				t.Fatalf("%s: output %q does not validate: %v", text, out, err)
			}
		}
	})
}

func jsonReader(s string) *strings.Reader { return strings.NewReader(s) }
