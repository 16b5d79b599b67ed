// Package text is the text layer between the runtime's token stream and
// the servers: it turns prompts and chat conversations into token ids, and
// a request's generated tokens into text deltas, decoding incrementally
// (a character split across tokens is emitted once whole) and matching
// stop strings across token boundaries (the stop string and everything
// after it are never emitted; the request ends at once).
package text

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/model/chat"
	"github.com/glmflash/glmflash/model/tokenizer"
)

// Limits on stop strings.
const (
	MaxStops       = 16
	MaxStopLength  = 256
	maxStopsLength = MaxStops * MaxStopLength
)

// ErrNoTokenizer means the checkpoint has no tokenizer.json.
var ErrNoTokenizer = errors.New("the model has no tokenizer.json: send token ids")

// ErrNoChatTemplate means the checkpoint has no chat template.
var ErrNoChatTemplate = errors.New("the model has no chat template: use a prompt")

// Model is a checkpoint's text side; either part may be nil.
type Model struct {
	Tok  *tokenizer.Tokenizer
	Chat *chat.Template
	// ChatError, when Chat is nil, is why the checkpoint's chat template
	// is not served (it failed to load): chat requests are refused with
	// it, completions are served.
	ChatError error
	// SpecialTokensInContent lets the special-token text in the content of
	// user and tool messages become special tokens (configuration
	// model.special_tokens_in_content); by default it is encoded as text,
	// so a user cannot forge the template's turns; the special tokens the
	// template writes are tokens either way.
	SpecialTokensInContent bool
	// ToolCallParser and ReasoningParser are the chat output's parsers
	// (configuration model.tool_call_parser and model.reasoning_parser:
	// toolcall.Formats, reasoning.Formats; "" is none).
	ToolCallParser, ReasoningParser string
}

// tooLong is the error of a prompt with more tokens than maxTokens.
func tooLong(err error, what string, maxTokens int) error {
	if errors.Is(err, tokenizer.ErrTooManyTokens) {
		return fmt.Errorf("%s has more than %d tokens, the context limit", what, maxTokens)
	}
	return err
}

// EncodePrompt returns the ids of a prompt, with the tokenizer's
// post-processor tokens (a BOS, say), as OpenAI-compatible servers do. It
// stops when ctx is done, and as soon as the prompt has more than
// maxTokens tokens (the context limit; 0: no limit), so that a prompt far
// beyond it is refused cheaply.
func (m *Model) EncodePrompt(ctx context.Context, prompt string, maxTokens int) ([]int32, error) {
	if m == nil || m.Tok == nil {
		return nil, ErrNoTokenizer
	}
	ids, err := m.Tok.EncodeContext(ctx, prompt, tokenizer.Options{AddSpecial: true, MaxTokens: maxTokens})
	return ids, tooLong(err, "the prompt", maxTokens)
}

// EncodeText returns the ids of a text, with the tokenizer's
// post-processor tokens when addSpecial, within ctx and maxTokens as
// EncodePrompt (vLLM's /tokenize with add_special_tokens).
func (m *Model) EncodeText(ctx context.Context, s string, addSpecial bool, maxTokens int) ([]int32, error) {
	if m == nil || m.Tok == nil {
		return nil, ErrNoTokenizer
	}
	ids, err := m.Tok.EncodeContext(ctx, s, tokenizer.Options{AddSpecial: addSpecial, MaxTokens: maxTokens})
	return ids, tooLong(err, "the prompt", maxTokens)
}

// EncodeChat renders a conversation with the chat template (ending with
// the assistant's turn) and returns the prompt text and its ids, within
// ctx and maxTokens as EncodePrompt. The special-token text of user and
// tool contents is text unless SpecialTokensInContent.
func (m *Model) EncodeChat(ctx context.Context, msgs []chat.Message, maxTokens int) (string, []int32, error) {
	return m.EncodeChatWith(ctx, msgs, chat.Options{AddGenerationPrompt: true}, maxTokens)
}

// EncodeChatWith is EncodeChat with the rendering's options (tools,
// chat_template_kwargs; AddGenerationPrompt as given).
func (m *Model) EncodeChatWith(ctx context.Context, msgs []chat.Message, opts chat.Options, maxTokens int) (string, []int32, error) {
	return m.EncodeChatSpecial(ctx, msgs, opts, maxTokens, false)
}

// EncodeChatSpecial is EncodeChatWith that also adds the tokenizer's
// post-processor tokens (a BOS, say) when addSpecial, which a chat template
// usually writes itself (vLLM's /tokenize of messages with
// add_special_tokens).
func (m *Model) EncodeChatSpecial(ctx context.Context, msgs []chat.Message, opts chat.Options, maxTokens int, addSpecial bool) (string, []int32, error) {
	if m == nil || m.Tok == nil {
		return "", nil, ErrNoTokenizer
	}
	if m.Chat == nil {
		if m.ChatError != nil {
			return "", nil, fmt.Errorf("%w: %v", ErrNoChatTemplate, m.ChatError)
		}
		return "", nil, ErrNoChatTemplate
	}
	var mark func(string) bool
	if !m.SpecialTokensInContent {
		mark = m.Tok.HasSpecialText
	}
	p, spans, err := m.Chat.RenderWith(ctx, msgs, opts, mark)
	if err != nil {
		return "", nil, err
	}
	o := tokenizer.Options{MaxTokens: maxTokens, AddSpecial: addSpecial} // the template writes the special tokens itself
	for _, sp := range spans {
		o.TextSpans = append(o.TextSpans, [2]int{sp.Start, sp.End})
	}
	ids, err := m.Tok.EncodeContext(ctx, p, o)
	if err != nil {
		return "", nil, tooLong(err, "the rendered conversation", maxTokens)
	}
	return p, ids, nil
}

// TokenText is how a token reads on its own (U+FFFD for a part of a
// character), and its bytes.
func (m *Model) TokenText(id int32) (string, []byte) {
	if m == nil || m.Tok == nil {
		return "", nil
	}
	b := m.Tok.Bytes(id)
	return tokenizer.Lossy(b), b
}

// Chunk is what Stream.Recv returns: the tokens received since the last
// chunk and the text they released (text can lag its tokens while a
// character or a possible stop string is incomplete).
type Chunk struct {
	Tokens []sched.Token
	Text   string
}

// Final is a request's outcome as the text layer sees it.
type Final struct {
	*sched.Final
	// StopString is the stop string that ended the request ("" if none);
	// Reason is then FinishStop and CompletionTokens counts the tokens up
	// to the one that completed it.
	StopString string
}

// Stream reads a request's tokens as text. It is used by one goroutine.
type Stream struct {
	h      *sched.Handle
	stop   func(tokens int) // ends the request in the runtime as stopped
	tok    *tokenizer.Tokenizer
	dec    *tokenizer.Stream
	stops  []string
	endIDs []int32 // stop ids and EOS: no text
	held   string  // text not yet released: a possible start of a stop string
	n      int     // tokens delivered
	after  int     // stop strings are matched in the text of tokens after the first after
	final  *Final
}

// NewStream reads h's tokens. stops are stop strings; endIDs are the ids
// that end the request (Runtime.EndIDs: its stop ids and the model's EOS
// ids), whose text is not emitted; stop must end the request as stopped
// (the runtime's Stop), and is called when a stop string matches, with the
// number of tokens up to the one that completed it. m may be nil (or
// without a tokenizer): chunks then carry no text. Special tokens' text is
// left out (KeepSpecial keeps it).
func NewStream(m *Model, h *sched.Handle, stops []string, endIDs []int32, stop func(tokens int)) *Stream {
	s := &Stream{h: h, stop: stop, endIDs: endIDs}
	for _, st := range stops {
		if st != "" {
			s.stops = append(s.stops, st)
		}
	}
	if m != nil && m.Tok != nil {
		s.tok, s.dec = m.Tok, m.Tok.NewStream(true)
	}
	return s
}

// KeepSpecial writes the text of special tokens too (skip_special_tokens
// false); by default it is left out. Stop ids and EOS still add no text.
// Call it before the first Recv.
func (s *Stream) KeepSpecial() {
	if s.tok != nil {
		s.dec = s.tok.NewStream(false)
	}
}

// StopsAfter matches stop strings only in the text of the tokens after the
// first n (min_tokens, as vLLM does: a stop string cannot end the output
// before the end ids may); the text of the first n is released as it
// comes. Call it before the first Recv.
func (s *Stream) StopsAfter(n int) { s.after = max(n, 0) }

// Recv returns the next chunk, or (once every token was returned) the
// final; after the final it keeps returning it. ctx's error is returned if
// ctx ends first.
func (s *Stream) Recv(ctx context.Context) (*Chunk, *Final, error) {
	if s.final != nil {
		return nil, s.final, nil
	}
	toks, f, err := s.h.Recv(ctx)
	if err != nil {
		return nil, nil, err
	}
	if f != nil {
		text := ""
		if s.dec != nil {
			text = s.held + s.dec.Flush()
			s.held = ""
		}
		s.final = &Final{Final: f}
		if text != "" {
			if i, stop := s.firstStop(text); stop != "" && s.n > s.after {
				text = text[:i]
				s.final.StopString = stop
				s.final.Reason = sched.FinishStop
			}
			return &Chunk{Text: text}, nil, nil
		}
		return nil, s.final, nil
	}
	c := &Chunk{}
	var sb strings.Builder
	var pre strings.Builder // the text of the first s.after tokens: released unmatched
	for _, t := range toks {
		c.Tokens = append(c.Tokens, t)
		s.n++
		if s.dec == nil || slices.Contains(s.endIDs, t.ID) {
			continue
		}
		if s.n <= s.after { // nothing is held back before: s.held and sb are empty
			pre.WriteString(s.dec.Next(t.ID))
			continue
		}
		sb.WriteString(s.dec.Next(t.ID))
		if len(s.stops) == 0 {
			continue
		}
		buf := s.held + sb.String()
		if i, stop := s.firstStop(buf); stop != "" {
			c.Text = pre.String() + buf[:i]
			s.held = ""
			s.stop(s.n)
			// Wait for the runtime's final (Stop delivers it at once).
			_, rf, err := s.h.Wait(ctx)
			if err != nil {
				return nil, nil, err
			}
			cp := *rf
			cp.Reason, cp.Message, cp.CompletionTokens = sched.FinishStop, "", s.n
			s.final = &Final{Final: &cp, StopString: stop}
			return c, nil, nil
		}
	}
	if s.dec != nil {
		buf := s.held + sb.String()
		k := s.holdBack(buf)
		c.Text, s.held = pre.String()+buf[:len(buf)-k], buf[len(buf)-k:]
	}
	return c, nil, nil
}

// firstStop finds the earliest stop string in buf.
func (s *Stream) firstStop(buf string) (int, string) {
	best, which := -1, ""
	for _, st := range s.stops {
		if i := strings.Index(buf, st); i >= 0 && (best < 0 || i < best) {
			best, which = i, st
		}
	}
	return best, which
}

// holdBack is the length of the longest suffix of buf that is a proper
// prefix of a stop string: text that a later token could turn into a stop.
func (s *Stream) holdBack(buf string) int {
	k := 0
	for _, st := range s.stops {
		for n := min(len(st)-1, len(buf)); n > k; n-- {
			if strings.HasSuffix(buf, st[:n]) {
				k = n
				break
			}
		}
	}
	return k
}

// StopWatch makes the scheduler-side watcher of stop strings
// (sched.Request.Stops): it decodes each choice's tokens as its Stream does
// (special tokens' text left out unless keepSpecial; endIDs add no text;
// the text of the first after tokens is never matched) and reports the
// token that completes one of stops. Nil when there is nothing to watch
// (no stop string or no tokenizer). The request then ends in the
// scheduler's loop, at that token, as stopped: no later token is
// generated, and its final says stop even when the Stream reading it lags.
func (m *Model) StopWatch(stops []string, endIDs []int32, after int, keepSpecial bool) func() sched.StopWatcher {
	if m == nil || m.Tok == nil {
		return nil
	}
	var live []string
	longest := 0
	for _, st := range stops {
		if st != "" {
			live = append(live, st)
			longest = max(longest, len(st))
		}
	}
	if len(live) == 0 {
		return nil
	}
	return func() sched.StopWatcher {
		return &stopWatcher{dec: m.Tok.NewStream(!keepSpecial), stops: live, endIDs: endIDs, after: max(after, 0), keep: longest - 1}
	}
}

// stopWatcher is StopWatch's watcher: it keeps only the text a stop string
// could still end in (the last keep bytes).
type stopWatcher struct {
	dec    *tokenizer.Stream
	stops  []string
	endIDs []int32
	after  int
	keep   int
	n      int
	tail   string
}

// Feed implements sched.StopWatcher.
func (w *stopWatcher) Feed(id int32) bool {
	w.n++
	if slices.Contains(w.endIDs, id) {
		return false
	}
	t := w.dec.Next(id)
	if w.n <= w.after || t == "" {
		return false
	}
	buf := w.tail + t
	for _, st := range w.stops {
		if strings.Contains(buf, st) {
			return true
		}
	}
	if len(buf) > w.keep {
		buf = buf[len(buf)-w.keep:]
	}
	w.tail = buf
	return false
}
