package openai

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/glmflash/glmflash/core/text"
	"github.com/glmflash/glmflash/model/chat"
)

// tokenizeRequest is POST /tokenize in vLLM's two shapes: a prompt
// (add_special_tokens default true) or chat messages rendered by the chat
// template as a chat request's are, with its tools and
// chat_template_kwargs (add_generation_prompt default true,
// add_special_tokens default false: the template writes its own).
type tokenizeRequest struct {
	Model  string          `json:"model"`
	Prompt json.RawMessage `json:"prompt"`

	Messages             []chatMessage   `json:"messages"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage *bool           `json:"continue_final_message"`
	Tools                []toolParam     `json:"tools"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`

	AddSpecialTokens *bool `json:"add_special_tokens"`
	ReturnTokenStrs  bool  `json:"return_token_strs"`
}

// detokenizeRequest is POST /detokenize (vLLM's).
type detokenizeRequest struct {
	Model  string  `json:"model"`
	Tokens []int64 `json:"tokens"`
}

// bodyOf reads a JSON POST body strictly into v, or writes the error.
func (s *server) bodyOf(w http.ResponseWriter, r *http.Request, v any) bool {
	if e := jsonBody(r); e != nil {
		s.fail(w, e)
		return false
	}
	if e := decode(http.MaxBytesReader(w, r.Body, int64(s.o.MaxBodyBytes)+1), v, s.o.MaxBodyBytes); e != nil {
		s.fail(w, e)
		return false
	}
	return true
}

// tokenize answers {count, max_model_len, tokens, token_strs}: the ids a
// completion or chat request with that prompt or those messages would run
// (not bounded by the context limit: the count is what a client asks to
// know; the body's bound bounds the work).
func (s *server) tokenize(w http.ResponseWriter, r *http.Request) {
	lv, _, e := s.live()
	if e != nil {
		s.fail(w, e)
		return
	}
	var req tokenizeRequest
	if !s.bodyOf(w, r, &req) {
		return
	}
	if e := s.checkModel(req.Model); e != nil {
		s.fail(w, e)
		return
	}
	hasPrompt := len(req.Prompt) > 0 && string(req.Prompt) != "null"
	var ids []int32
	switch {
	case hasPrompt && req.Messages != nil:
		s.fail(w, badField("messages", "give prompt or messages, not both"))
		return
	case hasPrompt:
		for _, f := range []struct {
			name string
			set  bool
		}{
			{"add_generation_prompt", req.AddGenerationPrompt != nil}, {"continue_final_message", req.ContinueFinalMessage != nil},
			{"tools", req.Tools != nil}, {"chat_template_kwargs", len(req.ChatTemplateKwargs) > 0 && string(req.ChatTemplateKwargs) != "null"},
		} {
			if f.set {
				s.fail(w, badField(f.name, "only with messages"))
				return
			}
		}
		var p string
		if err := json.Unmarshal(req.Prompt, &p); err != nil {
			s.fail(w, badField("prompt", "want a string, got JSON %s", jsonKind(req.Prompt)))
			return
		}
		addSpecial := req.AddSpecialTokens == nil || *req.AddSpecialTokens
		var err error
		if ids, err = lv.Text.EncodeText(r.Context(), p, addSpecial, 0); err != nil {
			s.fail(w, badField("prompt", "%v", err))
			return
		}
	case req.Messages != nil:
		if req.ContinueFinalMessage != nil && *req.ContinueFinalMessage {
			s.fail(w, badField("continue_final_message", "not supported (only false)"))
			return
		}
		msgs, e := chatMessages(req.Messages)
		if e != nil {
			s.fail(w, e)
			return
		}
		// The tools as a chat request's are checked and rendered; no call is
		// read back here, so the tool-call parser does not matter (none).
		_, tools, e := checkTools(&chatRequest{Tools: req.Tools, ToolChoice: json.RawMessage(`"none"`)}, "")
		if e != nil {
			s.fail(w, e)
			return
		}
		kwargs, e := checkKwargs(req.ChatTemplateKwargs)
		if e != nil {
			s.fail(w, e)
			return
		}
		opts := chat.Options{AddGenerationPrompt: req.AddGenerationPrompt == nil || *req.AddGenerationPrompt, Tools: tools, Kwargs: kwargs}
		addSpecial := req.AddSpecialTokens != nil && *req.AddSpecialTokens
		var err error
		if _, ids, err = lv.Text.EncodeChatSpecial(r.Context(), msgs, opts, 0, addSpecial); err != nil {
			s.fail(w, badField("messages", "%v", err))
			return
		}
	default:
		s.fail(w, badField("prompt", "required (or messages)"))
		return
	}
	out := map[string]any{"count": len(ids), "max_model_len": lv.Context, "tokens": ids, "token_strs": nil}
	if ids == nil {
		out["tokens"] = []int32{}
	}
	if req.ReturnTokenStrs {
		strs := make([]string, len(ids))
		for i, id := range ids {
			strs[i] = lv.Text.Tok.Token(id)
		}
		out["token_strs"] = strs
	}
	writeJSON(w, 200, out)
}

// detokenize answers {prompt}: the text of the ids, special tokens
// included (vLLM's).
func (s *server) detokenize(w http.ResponseWriter, r *http.Request) {
	lv, lim, e := s.live()
	if e != nil {
		s.fail(w, e)
		return
	}
	var req detokenizeRequest
	if !s.bodyOf(w, r, &req) {
		return
	}
	if e := s.checkModel(req.Model); e != nil {
		s.fail(w, e)
		return
	}
	if req.Tokens == nil {
		s.fail(w, badField("tokens", "required"))
		return
	}
	if lv.Text == nil || lv.Text.Tok == nil {
		s.fail(w, badField("tokens", "%v", text.ErrNoTokenizer))
		return
	}
	ids := make([]int32, len(req.Tokens))
	for i, id := range req.Tokens {
		if id < 0 || id >= int64(lim.vocab) {
			s.fail(w, badField(fieldAt("tokens", i), "token id %d is outside the vocabulary [0, %d)", id, lim.vocab))
			return
		}
		ids[i] = int32(id)
	}
	writeJSON(w, 200, map[string]any{"prompt": lv.Text.Tok.Decode(ids, false)})
}

// fieldAt names an item of a list field: "tokens[3]".
func fieldAt(field string, i int) string { return field + "[" + strconv.Itoa(i) + "]" }
