package grammar

import (
	"math/rand/v2"
	"testing"

	"github.com/glmflash/glmflash/core/sample"
)

// fakeTokens is a byte-level vocabulary: the 256 single bytes, some
// multi-byte pieces, an EOS and a special token.
type fakeTokens struct {
	toks    [][]byte
	special map[int32]bool
}

func (f *fakeTokens) VocabSize() int { return len(f.toks) }
func (f *fakeTokens) Bytes(id int32) []byte {
	if id < 0 || int(id) >= len(f.toks) {
		return nil
	}
	return f.toks[id]
}
func (f *fakeTokens) IsSpecial(id int32) bool { return f.special[id] }

var pieces = []string{`{"`, `":`, `","`, `",`, `"}`, `}`, `},{`, `[`, `]`, `true`, `false`, `null`, `12`, `0.5`, `-3`, `e+`,
	`"name"`, `name`, `age`, `city`, `abc`, ` the`, `</think>`, `</`, `think`, `>`, `<tool_call>`, `</tool_call>`, `<arg_key>`,
	`</arg_key>`, `<arg_value>`, `</arg_value>`, "\n", "\n<", `é`, "\xc3", "\xa9", `日本`, `\n`, `\"`, `\u00e9`, `2024-`, `-01`, `T12:`, `Z`,
	`@`, `.com`, `ab`, `cd`, `ef`, `0123`, `4567`, `89ab`, `-`, `get_weather`, `Beijing`}

// EOS and special ids of the fake vocabulary (after the bytes and pieces).
var (
	fakeEOS     = int32(256 + len(pieces))
	fakeSpecial = fakeEOS + 1
)

func newFakeTokens() *fakeTokens {
	f := &fakeTokens{special: map[int32]bool{}}
	for b := range 256 {
		f.toks = append(f.toks, []byte{byte(b)})
	}
	for _, p := range pieces {
		f.toks = append(f.toks, []byte(p))
	}
	f.toks = append(f.toks, []byte("<|endoftext|>"))
	f.special[fakeEOS] = true
	f.toks = append(f.toks, []byte("<|user|>"))
	f.special[fakeSpecial] = true
	return f
}

func fakeVocab(t testing.TB) *Vocab {
	t.Helper()
	f := newFakeTokens()
	v, err := NewVocab(f, len(f.toks)+5, []int32{fakeEOS}) // rows wider than the tokenizer
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func compile(t testing.TB, v *Vocab, spec Spec) *Grammar {
	t.Helper()
	g, err := NewCompiler(v).Compile(spec)
	if err != nil {
		t.Fatalf("%s %q: %v", spec.Kind, spec.Text, err)
	}
	return g
}

// walk generates one output by picking uniformly among the allowed tokens
// (EOS with probability pEOS when allowed), within budget tokens. It fails
// the test when a mask is empty, when Accept refuses an allowed token, or
// when the budget ends before the grammar accepts.
func walk(t testing.TB, g *Grammar, r *rand.Rand, budget int, pEOS float64) (out []byte, ntok int) {
	t.Helper()
	m := g.Matcher()
	tf := newFakeTokens()
	for ntok < budget {
		mask := m.Allow(budget - ntok)
		var allowed []int32
		eos := false
		for id := range int32(g.v.size) {
			if sample.Allowed(mask, id) {
				if id == fakeEOS {
					eos = true
					continue
				}
				if id == fakeSpecial || int(id) >= len(tf.toks) {
					t.Fatalf("the mask allows token %d (special or outside the tokenizer)", id)
				}
				allowed = append(allowed, id)
			}
		}
		if eos != m.Accepting() {
			t.Fatalf("EOS allowed = %v but accepting = %v after %q", eos, m.Accepting(), out)
		}
		var tok int32
		switch {
		case eos && (len(allowed) == 0 || r.Float64() < pEOS):
			tok = fakeEOS
		case len(allowed) == 0:
			t.Fatalf("empty mask after %q with %d tokens left", out, budget-ntok)
		default:
			tok = allowed[r.IntN(len(allowed))]
		}
		done, err := m.Accept(tok)
		if err != nil {
			t.Fatalf("Accept(%d) after %q: %v", tok, out, err)
		}
		ntok++
		if tok != fakeEOS {
			out = append(out, tf.toks[tok]...)
		}
		if done {
			return out, ntok
		}
	}
	if !m.Accepting() {
		t.Fatalf("the budget of %d tokens ended before the output completed: %q", budget, out)
	}
	return out, ntok
}
