package sched

import (
	"cmp"
	"math"
	"slices"
	"strings"

	"github.com/glmflash/glmflash/core/sample"
)

// procs is one request's logits processing (Request.Processing and
// Request.MinTokens) as the sampling edits of its next row, kept up to date
// token by token rather than rebuilt each step: one entry per token that
// any processor touches (a prompt token under a repetition penalty, an
// output token under a penalty, a logit_bias entry, an id min_tokens
// bans), sorted by token. Emitting a token updates its entry (a binary
// search; a new token is inserted, a memmove), and the ban of the end ids
// is lifted once, when MinTokens tokens were generated. The edits are
// handed to the row's SampleSpec as they are (no copy): the scheduler
// changes them only while collecting, after the step that read them ran.
type procs struct {
	rep       float32 // repetition penalty; 1: off
	presence  float64
	frequency float64
	outputs   bool // the output's tokens are tracked (a penalty is on)
	min       int  // MinTokens
	banning   bool // the ban of the end ids is in force

	edits []sample.Edit // sorted by token, unique: the next row's edits
	meta  []procEntry   // beside edits: what each edit is made of
}

// procEntry is what one token's edit is made of.
type procEntry struct {
	count  int32   // occurrences in the output
	bias   float64 // its logit_bias
	prompt bool    // it occurs in the prompt (repetition penalty)
	ban    bool    // an end id: banned while fewer than MinTokens were generated
}

// newProcs builds the processing state of a validated request whose end
// ids (Scheduler.EndIDs, within the vocabulary) are ends; it returns nil when nothing is to be
// done (the request's rows then carry no edits).
func newProcs(req *Request, ends []int32) *procs {
	p := req.Processing
	if !p.Active() && req.MinTokens == 0 {
		return nil
	}
	pr := &procs{rep: 1, presence: p.PresencePenalty, frequency: p.FrequencyPenalty, min: req.MinTokens}
	if r := p.RepetitionPenalty; r != 0 && r != 1 {
		// A penalty below float32's normal range would round to 0 (no
		// penalty): the smallest normal float32 divides as hard as any.
		pr.rep = max(float32(r), 0x1p-126)
	}
	pr.outputs = pr.rep != 1 || pr.presence != 0 || pr.frequency != 0
	tokens := map[int32]procEntry{}
	if pr.rep != 1 {
		for _, t := range req.Prompt {
			tokens[t] = procEntry{prompt: true}
		}
	}
	for t, b := range p.LogitBias {
		if b != 0 {
			e := tokens[t]
			e.bias = b
			tokens[t] = e
		}
	}
	if req.MinTokens > 0 {
		pr.banning = true
		for _, t := range ends {
			e := tokens[t]
			e.ban = true
			tokens[t] = e
		}
	}
	order := make([]int32, 0, len(tokens))
	for t := range tokens {
		order = append(order, t)
	}
	slices.Sort(order)
	pr.edits = make([]sample.Edit, len(order))
	pr.meta = make([]procEntry, len(order))
	for i, t := range order {
		pr.meta[i] = tokens[t]
		pr.edits[i] = pr.edit(t, pr.meta[i])
	}
	return pr
}

// edit is token t's edit from what it is made of: l' = penalize(l) −
// presence·[count > 0] − frequency·count + bias, or a ban.
func (pr *procs) edit(t int32, e procEntry) sample.Edit {
	ed := sample.Edit{Token: t, Penalty: 1}
	if pr.rep != 1 && (e.prompt || e.count > 0) {
		ed.Penalty = pr.rep
	}
	add := e.bias - pr.frequency*float64(e.count)
	if e.count > 0 {
		add -= pr.presence
	}
	ed.Add = float32(add)
	if e.ban && pr.banning {
		ed.Add = float32(math.Inf(-1))
	}
	return ed
}

// Edits are the next row's edits (nil when none), valid until the next
// observe.
func (pr *procs) Edits() []sample.Edit {
	if pr == nil || len(pr.edits) == 0 {
		return nil
	}
	return pr.edits
}

// observe updates the edits after tok was generated, the generated-th
// token of the output.
func (pr *procs) observe(tok int32, generated int) {
	if pr.outputs {
		i, found := slices.BinarySearchFunc(pr.edits, tok, func(e sample.Edit, t int32) int { return cmp.Compare(e.Token, t) })
		if !found {
			pr.edits = slices.Insert(pr.edits, i, sample.Edit{})
			pr.meta = slices.Insert(pr.meta, i, procEntry{})
		}
		pr.meta[i].count++
		pr.edits[i] = pr.edit(tok, pr.meta[i])
	}
	if pr.banning && generated >= pr.min {
		pr.lift()
	}
}

// lift ends min_tokens' ban: the banned ids get back their other edits,
// and those with none are dropped.
func (pr *procs) lift() {
	pr.banning = false
	k := 0
	for i, e := range pr.meta {
		if e.ban {
			e.ban = false
			if e.count == 0 && e.bias == 0 && (!e.prompt || pr.rep == 1) {
				continue // nothing else edits this token
			}
		}
		pr.meta[k] = e
		pr.edits[k] = pr.edit(pr.edits[i].Token, e)
		k++
	}
	pr.edits, pr.meta = pr.edits[:k], pr.meta[:k]
}

// processed reports whether the request's logits are processed (it then
// decodes plainly: verifying drafts would need every span row processed as
// if the drafts were already generated).
func (r *Request) processed() bool { return r.Processing.Active() || r.MinTokens != 0 }

// validateProcessing checks a generation request's logits processing:
// the ranges of sample.Processing.Validate and 0 ≤ MinTokens ≤ MaxTokens,
// the error naming the field as the OpenAI API spells it.
func (rt *Scheduler) validateProcessing(req *Request) error {
	if err := req.Processing.Validate(rt.vocab); err != nil {
		return processingError(err)
	}
	switch {
	case req.MinTokens < 0:
		return invalid("min_tokens", "must be ≥ 0, got %d", req.MinTokens)
	case req.MinTokens > req.MaxTokens:
		return invalid("min_tokens", "must be ≤ max_tokens (%d), got %d", req.MaxTokens, req.MinTokens)
	case req.MinTokens > 0:
		// With every id of the vocabulary an end id, the ban would leave
		// nothing to draw from.
		if len(rt.endIDsIn(req)) >= rt.vocab {
			return invalid("min_tokens", "every token of the vocabulary is a stop id or an end-of-sequence id: nothing can be generated before min_tokens (%d)", req.MinTokens)
		}
	}
	return nil
}

// endIDsIn are req's end ids (EndIDs) within the vocabulary, each once.
func (rt *Scheduler) endIDsIn(req *Request) []int32 {
	ids := rt.EndIDs(*req)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	return slices.DeleteFunc(ids, func(t int32) bool { return t < 0 || int(t) >= rt.vocab })
}

// processingError turns sample.Processing.Validate's error, whose message
// starts with the field's name ("presence_penalty must be …", "logit_bias:
// …", "logit_bias[7] must be …"), into an InvalidError naming that field.
func processingError(err error) error {
	msg := err.Error()
	for _, f := range []string{"repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias"} {
		rest, ok := strings.CutPrefix(msg, f)
		if !ok {
			continue
		}
		field := f
		if strings.HasPrefix(rest, "[") {
			if j := strings.IndexByte(rest, ']'); j > 0 {
				field, rest = f+rest[:j+1], rest[j+1:]
			}
		}
		return invalid(field, "%s", strings.TrimLeft(rest, ": "))
	}
	return &InvalidError{Field: "sampling", Msg: msg}
}
