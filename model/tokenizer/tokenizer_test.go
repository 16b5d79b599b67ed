package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// tiny is a minimal byte-level BPE tokenizer.json: the 256 bytes, merges
// "h e" → "he", "he l" → "hel", "Ġ w" → "Ġw", and two added tokens.
func tiny(extra string) string {
	var vocab []string
	for b := 0; b < 256; b++ {
		vocab = append(vocab, quote(ByteLevelEncode([]byte{byte(b)}))+":"+itoa(b))
	}
	vocab = append(vocab, `"he":256`, `"hel":257`, `"Ġw":258`)
	return `{"version":"1.0","truncation":null,"padding":null,
"added_tokens":[{"id":259,"content":"<|end|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
{"id":260,"content":"<tool>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":false}],
"normalizer":null,
"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":" ?[^\\s]+|\\s+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false}]},
"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<|end|>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],"pair":[],"special_tokens":{"<|end|>":{"id":"<|end|>","ids":[259],"tokens":["<|end|>"]}}},
"decoder":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false},
"model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":"","end_of_word_suffix":"","fuse_unk":false,"byte_fallback":false,"ignore_merges":false,
"vocab":{` + strings.Join(vocab, ",") + `},"merges":[["h","e"],"he l",["Ġ","w"]` + extra + `]}}`
}

func quote(s string) string {
	var sb strings.Builder
	sb.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			sb.WriteString(`\` + string(r))
		case r < 0x20:
			sb.WriteString(`\u00` + string("0123456789abcdef"[r>>4]) + string("0123456789abcdef"[r&15]))
		default:
			sb.WriteRune(r)
		}
	}
	return sb.String() + `"`
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

func TestTinyTokenizer(t *testing.T) {
	tk, err := Parse([]byte(tiny("")))
	require.NoError(t, err)
	require.Equal(t, 261, tk.VocabSize())
	// "hel" merges in rank order; " w" → "Ġw"; the added tokens stay whole.
	ids := tk.Encode("hello world<|end|><tool>", Options{})
	require.Equal(t, []int32{257, 'l', 'o', 258, 'o', 'r', 'l', 'd', 259, 260}, ids)
	require.Equal(t, "hello world<|end|><tool>", tk.Decode(ids, false))
	require.Equal(t, "hello world<tool>", tk.Decode(ids, true), "skip_special drops special tokens only")
	// Special tokens as text: "<|end|>" is spelt out, "<tool>" (not special) stays.
	require.NotContains(t, tk.Encode("<|end|><tool>", Options{SpecialAsText: true}), int32(259))
	require.Contains(t, tk.Encode("<|end|><tool>", Options{SpecialAsText: true}), int32(260))
	// The post-processor's BOS.
	require.Equal(t, []int32{259, 'a'}, tk.Encode("a", Options{AddSpecial: true}))
	// Invalid UTF-8 in, U+FFFD out.
	require.Equal(t, "a\ufffdb", tk.Decode(tk.Encode("a\xffb", Options{}), false))
	id, ok := tk.TokenID("Ġw")
	require.True(t, ok)
	require.Equal(t, int32(258), id)
	require.Equal(t, " w", string(tk.Bytes(258)))
	require.True(t, tk.IsSpecial(259))
	require.False(t, tk.IsSpecial(260))
}

// A character split across tokens is emitted once complete, exactly once.
func TestStreamHoldsIncompleteCharacters(t *testing.T) {
	tk, err := Parse([]byte(tiny("")))
	require.NoError(t, err)
	st := tk.NewStream(false)
	euro := []byte("€") // e2 82 ac: three byte tokens
	require.Equal(t, "", st.Next(int32(euro[0])))
	require.True(t, st.Pending())
	require.Equal(t, "", st.Next(int32(euro[1])))
	require.Equal(t, "€", st.Next(int32(euro[2])))
	require.False(t, st.Pending())
	// A broken sequence: the held bytes become one U+FFFD, then the next text.
	require.Equal(t, "", st.Next(int32(euro[0])))
	require.Equal(t, "\ufffda", st.Next('a'))
	// An unfinished character at the end is flushed as U+FFFD.
	require.Equal(t, "", st.Next(0xF0))
	require.Equal(t, "\ufffd", st.Flush())
	require.Equal(t, "", st.Flush())
}

func TestLossyMaximalSubparts(t *testing.T) {
	for in, want := range map[string]string{
		"\xe2\x82A":      "\ufffdA",            // one U+FFFD for a truncated sequence
		"\xf0\x80\x80":   "\ufffd\ufffd\ufffd", // F0 80 is ill-formed at once
		"\xed\xa0\x80":   "\ufffd\ufffd\ufffd", // a surrogate
		"\xc0\xaf":       "\ufffd\ufffd",       // overlong
		"ok\xf4\x8f\xbf": "ok\ufffd",           // truncated U+10FFFF
		"\xf4\x90":       "\ufffd\ufffd",       // above U+10FFFF
	} {
		require.Equal(t, want, Lossy([]byte(in)), "%q", in)
	}
}

func TestParseErrorsNameTheField(t *testing.T) {
	good := tiny("")
	for _, c := range []struct{ edit, want string }{
		{`"type":"BPE"`, `model.type: "WordPiece" is not supported`},
		{`["h","e"]`, `model.merges[0]: "h" + "x"`},
		{`"Regex":" ?[^\\s]+|\\s+"`, `pre_tokenizer.pretokenizers[0].pattern.Regex`},
		{`"behavior":"Isolated"`, `pre_tokenizer.pretokenizers[0].behavior: unknown "Sideways"`},
		{`"ids":[259]`, `post_processor.special_tokens["<|end|>"].ids: 9999 is outside`},
		{`"content":"<tool>"`, `added_tokens[1].content: empty`},
		{`"decoder":{"type":"ByteLevel"`, `decoder.type: unsupported decoder "Metaspace"`},
		{`"normalizer":null`, `normalizer.type: unsupported normalizer "BertNormalizer"`},
		{`"version":"1.0"`, `unknown field "extra"`},
	} {
		var bad string
		switch c.edit {
		case `"type":"BPE"`:
			bad = strings.Replace(good, c.edit, `"type":"WordPiece"`, 1)
		case `["h","e"]`:
			bad = strings.Replace(good, c.edit, `["h","x"]`, 1)
		case `"Regex":" ?[^\\s]+|\\s+"`:
			bad = strings.Replace(good, c.edit, `"Regex":"(unclosed"`, 1)
		case `"behavior":"Isolated"`:
			bad = strings.Replace(good, c.edit, `"behavior":"Sideways"`, 1)
		case `"ids":[259]`:
			bad = strings.Replace(good, c.edit, `"ids":[9999]`, 1)
		case `"content":"<tool>"`:
			bad = strings.Replace(good, c.edit, `"content":""`, 1)
		case `"decoder":{"type":"ByteLevel"`:
			bad = strings.Replace(good, c.edit, `"decoder":{"type":"Metaspace"`, 1)
		case `"normalizer":null`:
			bad = strings.Replace(good, c.edit, `"normalizer":{"type":"BertNormalizer"}`, 1)
		case `"version":"1.0"`:
			bad = strings.Replace(good, c.edit, `"version":"1.0","extra":1`, 1)
		}
		require.NotEqual(t, good, bad, c.edit)
		_, err := Parse([]byte(bad))
		require.ErrorContains(t, err, c.want)
	}
	_, err := Parse([]byte(`{"model":{"type":"BPE","vocab":{"a":0}},"decoder":{"type":"ByteLevel"},"pre_tokenizer":{"type":"Split","pattern":{"String":" "},"behavior":"Removed"}}`))
	require.ErrorContains(t, err, "pre_tokenizer: no ByteLevel step")
	_, err = Parse([]byte(`not json`))
	require.Error(t, err)
}

// Round trip on valid UTF-8: DeepSeek-V3's tokenizer has no normalizer, so
// decoding gives the text back exactly, at once and token by token.
func FuzzEncodeDecode(f *testing.F) {
	for _, s := range []string{"", "hello world", "  x\n\n\ty", "你好😀e\u0301", "<｜User｜>hi", "\ufeff\u0085", "1234567"} {
		f.Add(s)
	}
	tk := load(f, "deepseek_v3")
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		ids := tk.Encode(s, Options{})
		require.Equal(t, s, tk.Decode(ids, false))
		st := tk.NewStream(false)
		var sb strings.Builder
		for _, id := range ids {
			sb.WriteString(st.Next(id))
		}
		sb.WriteString(st.Flush())
		require.Equal(t, s, sb.String())
	})
}

// Any bytes parse to a tokenizer or an error, never a panic.
func FuzzParse(f *testing.F) {
	f.Add([]byte(tiny("")))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tk, err := Parse(data)
		if err != nil {
			return
		}
		ids := tk.Encode("hello world", Options{AddSpecial: true})
		tk.Decode(ids, false)
	})
}
