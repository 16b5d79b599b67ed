package grammar

import (
	"math/rand/v2"
	"testing"

	"github.com/glmflash/glmflash/core/sample"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/glmflash/glmflash/model/tokenizer"
)

// benchVocab is the bench preset's vocabulary (32,000 ids: byte-level BPE
// from model/randckpt).
func benchVocab(b testing.TB) *Vocab {
	b.Helper()
	cfg, err := randckpt.Preset("bench")
	if err != nil {
		b.Fatal(err)
	}
	tj, _, err := randckpt.TokenizerFiles(cfg.VocabSize)
	if err != nil {
		b.Fatal(err)
	}
	tk, err := tokenizer.Parse(tj)
	if err != nil {
		b.Fatal(err)
	}
	eos := []int32{int32(cfg.VocabSize - 1)}
	v, err := NewVocab(tk, cfg.VocabSize, eos)
	if err != nil {
		b.Fatal(err)
	}
	return v
}

const benchSchema = `{"type":"object","properties":{"name":{"type":"string","maxLength":24},"age":{"type":"integer"},"email":{"type":"string","format":"email"},"tags":{"type":"array","items":{"type":"string"},"maxItems":4},"address":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"string","pattern":"[0-9]{5}"}},"required":["city","zip"]}},"required":["name","age","email","address"]}`

// script is a random output of g: the tokens a random walk over the masks
// picked (uniform among the allowed, EOS when allowed with probability ½).
func script(b testing.TB, g *Grammar, seed uint64, budget int) []int32 {
	r := rand.New(rand.NewPCG(seed, 1))
	m := g.Matcher()
	var toks []int32
	for len(toks) < budget {
		mask := m.Allow(budget - len(toks))
		var allowed []int32
		eos := false
		for id := range int32(g.v.size) {
			if sample.Allowed(mask, id) {
				if g.v.bytes[id] == nil {
					eos = true
				} else {
					allowed = append(allowed, id)
				}
			}
		}
		var tok int32
		if eos && (len(allowed) == 0 || r.IntN(2) == 0) {
			tok = g.v.eos[0]
		} else {
			tok = allowed[r.IntN(len(allowed))]
		}
		toks = append(toks, tok)
		done, err := m.Accept(tok)
		if err != nil {
			b.Fatal(err)
		}
		if done {
			break
		}
	}
	return toks
}

// replay runs one output's Allow + Accept per token.
func replay(b *testing.B, g *Grammar, toks []int32, budget int) {
	m := g.Matcher()
	for i, t := range toks {
		m.Allow(budget - i)
		if _, err := m.Accept(t); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllowAccept is the host cost of a constrained row per token on
// the bench preset's vocabulary: cached (the masks of the states the
// output visits computed before) and cold (a fresh grammar: every state
// determinized and its mask walked over the trie on first visit). ns/op is
// per token.
func BenchmarkAllowAccept(b *testing.B) {
	v := benchVocab(b)
	spec := Spec{Kind: JSONSchema, Text: benchSchema}
	const budget = 400
	g, err := NewCompiler(v).Compile(spec)
	if err != nil {
		b.Fatal(err)
	}
	var outs [][]int32
	total := 0
	for s := range 16 {
		toks := script(b, g, uint64(s), budget)
		outs = append(outs, toks)
		total += len(toks)
	}
	b.Run("cached", func(b *testing.B) {
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			toks := outs[n%len(outs)]
			replay(b, g, toks, budget)
			n++
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n*total/len(outs)), "ns/token")
	})
	b.Run("cold", func(b *testing.B) {
		n, toks := 0, 0
		for b.Loop() {
			b.StopTimer()
			nf, start, err := build(spec)
			if err != nil {
				b.Fatal(err)
			}
			fresh, err := newGrammar(nf, start, v)
			if err != nil {
				b.Fatal(err)
			}
			out := outs[n%len(outs)]
			b.StartTimer()
			replay(b, fresh, out, budget)
			n++
			toks += len(out)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(toks), "ns/token")
	})
}

// BenchmarkCompile is a schema's compile (NFA and the DFA's start).
func BenchmarkCompile(b *testing.B) {
	v := benchVocab(b)
	for b.Loop() {
		nf, start, err := build(Spec{Kind: JSONSchema, Text: benchSchema})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := newGrammar(nf, start, v); err != nil {
			b.Fatal(err)
		}
	}
}
