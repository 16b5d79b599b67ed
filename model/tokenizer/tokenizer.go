// Package tokenizer reads Hugging Face tokenizer.json files of byte-level
// BPE models (GPT-2 style: Qwen, DeepSeek, Llama 3, GLM) and turns text into
// token ids and back, as the Rust tokenizers library does: added and
// special tokens first (never split), then the normalizer, the
// pre-tokenizer (Split with look-ahead regexes, Digits, ByteLevel), BPE
// merges by rank, and the post-processor's special tokens on request.
// Decoding maps tokens back to bytes (the ByteLevel decoder) and to text,
// and Stream does so incrementally, emitting a character only once all of
// its bytes have arrived.
//
// A Tokenizer is safe for concurrent use.
package tokenizer

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/glmflash/glmflash/internal/regular"
)

// MaxFileBytes bounds a tokenizer.json (real ones are 2–20 MB).
const MaxFileBytes = 256 << 20

// Tokenizer encodes and decodes text.
type Tokenizer struct {
	norm     normalizer
	pre      []preStep
	model    *bpe
	added    []*addedToken
	raw      *addedMatcher // added tokens matched on the text as given
	normed   *addedMatcher // added tokens matched on normalized text
	post     []int32       // post-processor: ids before the sequence
	postTail []int32       // and after it
	tokens   [][]byte      // id → the bytes it decodes to (nil: no such id)
	strs     []string      // id → its spelling in tokenizer.json
	special  []bool        // id → is a special added token
	ids      map[string]int32
}

// Load reads dir/tokenizer.json (or dir/tokenizer.json.gz).
func Load(dir string) (*Tokenizer, error) {
	p := filepath.Join(dir, "tokenizer.json")
	f, _, err := regular.Open(p) // never a FIFO or a device
	var r io.Reader = f
	if os.IsNotExist(err) {
		p += ".gz"
		if f, _, err = regular.Open(p); err == nil {
			zr, zerr := gzip.NewReader(f)
			if zerr != nil {
				f.Close()
				return nil, fmt.Errorf("%s: %w", p, zerr)
			}
			r = zr
		}
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(r, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", p, MaxFileBytes)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return t, nil
}

// Parse reads the contents of a tokenizer.json. Errors name the field.
func Parse(data []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := strict(data, &f, "tokenizer.json"); err != nil {
		return nil, err
	}
	if !isNull(f.Truncation) || !isNull(f.Padding) {
		// Truncation and padding are batch concerns the server handles.
		f.Truncation, f.Padding = nil, nil
	}
	t := &Tokenizer{ids: map[string]int32{}}
	var err error
	if t.norm, err = parseNormalizer(f.Normalizer, "normalizer"); err != nil {
		return nil, err
	}
	var byteLevel bool
	if t.pre, byteLevel, err = parsePreTokenizer(f.PreTokenizer, "pre_tokenizer"); err != nil {
		return nil, err
	}
	if !byteLevel {
		return nil, fmt.Errorf("pre_tokenizer: no ByteLevel step: only byte-level BPE tokenizers are supported")
	}
	if err := parseDecoder(f.Decoder, "decoder"); err != nil {
		return nil, err
	}
	if err := t.parseModel(f.Model); err != nil {
		return nil, err
	}
	if err := t.parseAdded(f.AddedTokens); err != nil {
		return nil, err
	}
	if t.post, t.postTail, err = parsePostProcessor(f.PostProcessor, "post_processor", t.vocabSize()); err != nil {
		return nil, err
	}
	return t, nil
}

// maxVocab bounds token ids (real vocabularies have at most a few hundred
// thousand entries).
const maxVocab = 1 << 22

func (t *Tokenizer) setToken(id int, s string, where string) error {
	if id < 0 || id >= maxVocab {
		return fmt.Errorf("%s: id %d is outside [0, %d)", where, id, maxVocab)
	}
	for len(t.tokens) <= id {
		t.tokens = append(t.tokens, nil)
		t.strs = append(t.strs, "")
		t.special = append(t.special, false)
	}
	t.tokens[id] = byteLevelDecode(s)
	t.strs[id] = s
	t.ids[s] = int32(id)
	return nil
}

func (t *Tokenizer) parseModel(raw json.RawMessage) error {
	if isNull(raw) {
		return fmt.Errorf("model: missing")
	}
	var v modelJSON
	if err := strict(raw, &v, "model"); err != nil {
		return err
	}
	if v.Type != "" && v.Type != "BPE" {
		return fmt.Errorf("model.type: %q is not supported (only BPE)", v.Type)
	}
	if v.Dropout != nil && *v.Dropout != 0 {
		return fmt.Errorf("model.dropout: %v: BPE dropout is for training only", *v.Dropout)
	}
	if v.ByteFallback {
		return fmt.Errorf("model.byte_fallback: not supported for byte-level BPE")
	}
	if v.ContinuingSubwordPrefix != nil && *v.ContinuingSubwordPrefix != "" {
		return fmt.Errorf("model.continuing_subword_prefix: %q is not supported", *v.ContinuingSubwordPrefix)
	}
	if v.EndOfWordSuffix != nil && *v.EndOfWordSuffix != "" {
		return fmt.Errorf("model.end_of_word_suffix: %q is not supported", *v.EndOfWordSuffix)
	}
	if len(v.Vocab) == 0 {
		return fmt.Errorf("model.vocab: empty")
	}
	m := &bpe{vocab: make(map[string]int32, len(v.Vocab)), merges: map[uint64]merge{}, ignoreMerges: v.IgnoreMerges, unk: -1, seed: maphash.MakeSeed()}
	for i := range m.byteIDs {
		m.byteIDs[i] = -1
	}
	for s, id := range v.Vocab {
		if err := t.setToken(id, s, fmt.Sprintf("model.vocab[%q]", s)); err != nil {
			return err
		}
		b := string(byteLevelDecode(s))
		m.vocab[b] = int32(id)
		if len(b) == 1 {
			m.byteIDs[b[0]] = int32(id)
		}
	}
	if v.UnkToken != nil {
		id, ok := v.Vocab[*v.UnkToken]
		if !ok {
			return fmt.Errorf("model.unk_token: %q is not in the vocabulary", *v.UnkToken)
		}
		m.unk = int32(id)
	}
	merges, err := parseMerges(v.Merges)
	if err != nil {
		return err
	}
	for rank, mg := range merges {
		a, oka := v.Vocab[mg[0]]
		b, okb := v.Vocab[mg[1]]
		c, okc := v.Vocab[mg[0]+mg[1]]
		if !oka || !okb || !okc {
			return fmt.Errorf("model.merges[%d]: %q + %q: a token (or their concatenation) is not in the vocabulary", rank, mg[0], mg[1])
		}
		k := pairKey(int32(a), int32(b))
		if _, dup := m.merges[k]; !dup {
			m.merges[k] = merge{rank: int32(rank), id: int32(c)}
		}
	}
	t.model = m
	return nil
}

// parseAdded reads added_tokens. Their ids are assigned as Hugging Face's
// AddedVocabulary::add_tokens does (the ids written in the file are what
// it computed when it wrote them, and it does not trust them when it
// reads): a token already in the vocabulary keeps that id; a new one gets
// the next id after the model's vocabulary and the added tokens so far.
func (t *Tokenizer) parseAdded(list []addedTokenJSON) error {
	var raw, normed []*addedToken
	modelSize := len(t.ids)
	maxAdded := -1
	added := map[string]int{}
	for i, a := range list {
		where := fmt.Sprintf("added_tokens[%d]", i)
		if a.Content == "" {
			return fmt.Errorf("%s.content: empty", where)
		}
		if !utf8.ValidString(a.Content) {
			return fmt.Errorf("%s.content: not valid UTF-8", where)
		}
		if id, ok := added[a.Content]; ok {
			a.ID = id
		} else if id, ok := t.ids[a.Content]; ok {
			a.ID = int(id)
		} else if maxAdded >= 0 && (maxAdded >= modelSize || modelSize == 0) {
			a.ID = maxAdded + 1
		} else {
			a.ID = modelSize
		}
		added[a.Content] = a.ID
		maxAdded = max(maxAdded, a.ID)
		if err := t.setToken(a.ID, a.Content, where+".id"); err != nil {
			return err
		}
		t.special[a.ID] = a.Special
		tok := &addedToken{id: int32(a.ID), content: a.Content, singleWord: a.SingleWord, lstrip: a.LStrip, rstrip: a.RStrip, normalized: a.Normalized, special: a.Special}
		t.added = append(t.added, tok)
		if a.Normalized && !a.Special {
			if t.norm != nil {
				e := &encoder{}
				tok.content = t.norm(e, a.Content)
				if e.err != nil {
					return fmt.Errorf("%s.content: normalizing it: %w", where, e.err)
				}
			}
			if tok.content != "" {
				normed = append(normed, tok)
			}
		} else {
			raw = append(raw, tok)
		}
	}
	t.raw, t.normed = newAddedMatcher(raw), newAddedMatcher(normed)
	return nil
}

func (t *Tokenizer) vocabSize() int { return len(t.tokens) }

// VocabSize is one more than the largest token id.
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// TokenID is the id of a token spelled as in tokenizer.json (an added
// token's content, or a vocabulary entry in the byte-level alphabet).
func (t *Tokenizer) TokenID(s string) (int32, bool) {
	id, ok := t.ids[s]
	return id, ok
}

// Token is the spelling of id in tokenizer.json ("" if there is none).
func (t *Tokenizer) Token(id int32) string {
	if id < 0 || int(id) >= len(t.strs) {
		return ""
	}
	return t.strs[id]
}

// Bytes is what id decodes to (nil for an id the tokenizer does not have).
func (t *Tokenizer) Bytes(id int32) []byte {
	if id < 0 || int(id) >= len(t.tokens) {
		return nil
	}
	return t.tokens[id]
}

// IsSpecial reports whether id is a special added token.
func (t *Tokenizer) IsSpecial(id int32) bool {
	return id >= 0 && int(id) < len(t.special) && t.special[id]
}

// Options control Encode.
type Options struct {
	// AddSpecial adds the post-processor's special tokens (a BOS, say).
	AddSpecial bool
	// SpecialAsText encodes the text of special tokens as ordinary text
	// instead of as the special tokens (Hugging Face's
	// encode_special_tokens): text from users cannot forge them.
	SpecialAsText bool
	// TextSpans are byte ranges [start, end) of the text in which special
	// tokens are encoded as text, as SpecialAsText does everywhere: the
	// user's part of a rendered chat prompt, whose special tokens the
	// template wrote itself. A special token that overlaps a span is text.
	TextSpans [][2]int
	// MaxTokens, when positive, stops EncodeContext with ErrTooManyTokens
	// as soon as the text has more tokens than that (the context length),
	// so that a prompt far beyond it is refused before it is all encoded.
	MaxTokens int
}

// Errors of EncodeContext.
var (
	// ErrTooManyTokens: the text has more than Options.MaxTokens tokens.
	ErrTooManyTokens = errors.New("tokenizer: more tokens than the limit")
	// ErrBudget: a pattern of the tokenizer did not find a match within
	// MatchTimeout.
	ErrBudget = errors.New("tokenizer: over the match budget")
)

// encoder is the state of one encoding: its context and first error; a
// nil *encoder is one without either.
type encoder struct {
	done <-chan struct{}
	ctx  context.Context
	err  error
}

func (e *encoder) fail(err error) {
	if e != nil && e.err == nil {
		e.err = err
	}
}

func (e *encoder) error() error {
	if e == nil {
		return nil
	}
	return e.err
}

func (e *encoder) failed() bool { return e != nil && e.err != nil }

// stopped reports whether the encoding must stop: an error, or the
// context done (a look at a channel: nanoseconds).
func (e *encoder) stopped() bool {
	if e == nil {
		return false
	}
	if e.err != nil {
		return true
	}
	if e.done != nil {
		select {
		case <-e.done:
			e.err = context.Cause(e.ctx)
			return true
		default:
		}
	}
	return false
}

// Encode returns the token ids of text. Invalid UTF-8 is first replaced
// with U+FFFD. It is EncodeContext without a context or a token limit,
// for trusted text: if a regex of the tokenizer exceeds its match budget,
// the text it did not reach is left unsplit. Requests use EncodeContext.
func (t *Tokenizer) Encode(text string, o Options) []int32 {
	o.MaxTokens = 0
	ids, _ := t.encode(nil, text, o)
	return ids
}

// EncodeContext returns the token ids of text, as Encode does, but stops
// with an error when ctx is done (context.Cause), when the text has more
// than o.MaxTokens tokens (ErrTooManyTokens), or when a regex of the
// tokenizer finds no match within MatchTimeout (ErrBudget). Added tokens
// are found in time linear in the text, whatever their number.
func (t *Tokenizer) EncodeContext(ctx context.Context, text string, o Options) ([]int32, error) {
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	e := &encoder{ctx: ctx, done: ctx.Done()}
	ids, err := t.encode(e, text, o)
	if err != nil {
		return nil, err
	}
	return ids, nil
}

func (t *Tokenizer) encode(e *encoder, text string, o Options) ([]int32, error) {
	if !utf8.ValidString(text) {
		text = Lossy([]byte(text))
	}
	var ids []int32
	if o.AddSpecial {
		ids = append(ids, t.post...)
	}
	over := func() bool {
		if o.MaxTokens > 0 && len(ids)+len(t.postTail) > o.MaxTokens {
			e.fail(fmt.Errorf("%w (%d)", ErrTooManyTokens, o.MaxTokens))
		}
		return e.stopped()
	}
	var parts, sub []piece
	var words []string
	asText := func(b, e int) bool { return o.SpecialAsText }
	if !o.SpecialAsText && len(o.TextSpans) > 0 {
		asText = func(b, e int) bool {
			// Spans are few (one per marked message) and sorted.
			i := sort.Search(len(o.TextSpans), func(i int) bool { return o.TextSpans[i][1] > b })
			return i < len(o.TextSpans) && o.TextSpans[i][0] < e
		}
	}
	parts = t.raw.split(parts, text, asText)
	for _, p := range parts {
		if p.id >= 0 {
			ids = append(ids, p.id)
			if over() {
				return ids, e.error()
			}
			continue
		}
		s := p.text
		if t.norm != nil {
			s = t.norm(e, s)
		}
		sub = t.normed.split(sub[:0], s, nil) // normalized added tokens are never special
		for _, q := range sub {
			if q.id >= 0 {
				ids = append(ids, q.id)
				if over() {
					return ids, e.error()
				}
				continue
			}
			words = append(words[:0], q.text)
			for _, step := range t.pre {
				next := make([]string, 0, len(words))
				for _, w := range words {
					next = step(e, next, w)
				}
				words = next
			}
			for _, w := range words {
				ids = t.model.encode(ids, w)
				if over() {
					return ids, e.error()
				}
			}
		}
		if e.failed() {
			return ids, e.error()
		}
	}
	if o.AddSpecial {
		ids = append(ids, t.postTail...)
	}
	return ids, e.error()
}

// Decode returns the text of ids; ids the tokenizer does not have are
// skipped, and so are special tokens when skipSpecial is set. Bytes that
// are not UTF-8 become U+FFFD.
func (t *Tokenizer) Decode(ids []int32, skipSpecial bool) string {
	var b []byte
	for _, id := range ids {
		if skipSpecial && t.IsSpecial(id) {
			continue
		}
		b = append(b, t.Bytes(id)...)
	}
	return Lossy(b)
}

// HasSpecialText reports whether s contains the text of a special token.
func (t *Tokenizer) HasSpecialText(s string) bool {
	if t.raw == nil {
		return false
	}
	ms, _ := t.raw.longest(s)
	for _, m := range ms {
		if m.tok.special {
			return true
		}
	}
	return false
}

// Describe summarizes the tokenizer for logs.
func (t *Tokenizer) Describe() string {
	var sp []string
	for _, a := range t.added {
		if a.special && len(sp) < 4 {
			sp = append(sp, a.content)
		}
	}
	return fmt.Sprintf("byte-level BPE, %d ids, %d merges, %d added tokens (%s…)", len(t.tokens), len(t.model.merges), len(t.added), strings.Join(sp, " "))
}
