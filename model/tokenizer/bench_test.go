package tokenizer

import (
	"os"
	"strings"
	"testing"
)

// BenchmarkEncode measures encoding throughput (MB/s) on the test corpus
// (English, code, CJK, emoji, …), joined into one text per tokenizer:
//
//	go test ./model/tokenizer -run '^$' -bench Encode
func BenchmarkEncode(b *testing.B) {
	text := strings.Join(corpus(b), "\n")
	for _, name := range testTokenizers {
		tk := load(b, name)
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				tk.Encode(text, Options{})
			}
		})
		b.Run(name+"/cold", func(b *testing.B) { // no piece cache: every word merged afresh
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				for i := range tk.model.cache {
					tk.model.cache[i].m = nil
				}
				tk.Encode(text, Options{})
			}
		})
	}
}

// BenchmarkEncodeProse measures encoding of English prose with code and
// tables (this repository's README).
func BenchmarkEncodeProse(b *testing.B) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		b.Fatal(err)
	}
	text := string(raw)
	for _, name := range testTokenizers {
		tk := load(b, name)
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				tk.Encode(text, Options{})
			}
		})
	}
}

// BenchmarkDecode measures incremental decoding, token by token.
func BenchmarkDecode(b *testing.B) {
	text := strings.Join(corpus(b), "\n")
	tk := load(b, "qwen3")
	ids := tk.Encode(text, Options{})
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		st := tk.NewStream(false)
		for _, id := range ids {
			st.Next(id)
		}
		st.Flush()
	}
}
