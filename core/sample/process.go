package sample

import (
	"fmt"
	"math"
	"math/bits"
)

// Banned is the value a processed logit takes when its token is not
// allowed (a constraint's mask, a ban): the most negative finite float32,
// so that a banned token has probability exactly 0 and is never picked,
// while a row's raw non-finite values (an overflow, which is an error)
// stay distinguishable from bans.
const Banned = -math.MaxFloat32

// Edit changes one token's logit before the row is sampled (penalties,
// logit_bias, min_tokens' bans). Applied to a finite raw logit l:
//
//	l' = min(penalize(l, Penalty), MaxFloat32) + Add, at least Banned
//
// where penalize divides a positive l by Penalty and multiplies a negative
// one (the repetition penalty of CTRL and transformers; 1 is none). A
// raw non-finite logit is left as it is. Add = −Inf bans the token.
type Edit struct {
	Token   int32
	Penalty float32
	Add     float32
}

// Processing are a request's logits processors, applied in the order
// repetition penalty, frequency and presence penalties, logit bias (as in
// vLLM): all off in the zero value but RepetitionPenalty, whose off value
// is 1 (0 is taken as 1).
type Processing struct {
	// RepetitionPenalty (> 0; 1 = off) penalizes every token of the prompt
	// and of the output so far.
	RepetitionPenalty float64
	// PresencePenalty and FrequencyPenalty ([−2, 2]) subtract, from each
	// token the output holds, the presence penalty once and the frequency
	// penalty per occurrence.
	PresencePenalty  float64
	FrequencyPenalty float64
	// LogitBias adds a bias in [−100, 100] to a token's logit.
	LogitBias map[int32]float64
}

// Active reports whether any processor is on.
func (p Processing) Active() bool {
	return (p.RepetitionPenalty != 0 && p.RepetitionPenalty != 1) || p.PresencePenalty != 0 || p.FrequencyPenalty != 0 || len(p.LogitBias) > 0
}

// MaxLogitBias bounds Processing.LogitBias's entries (OpenAI's limit).
const MaxLogitBias = 300

// Validate checks ranges against a vocabulary of vocab ids and names the
// bad field.
func (p Processing) Validate(vocab int) error {
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case !finite(p.RepetitionPenalty) || p.RepetitionPenalty < 0 || p.RepetitionPenalty > 100:
		return fmt.Errorf("repetition_penalty must be in (0, 100] (1 is off), got %v", p.RepetitionPenalty)
	case !finite(p.PresencePenalty) || p.PresencePenalty < -2 || p.PresencePenalty > 2:
		return fmt.Errorf("presence_penalty must be in [-2, 2], got %v", p.PresencePenalty)
	case !finite(p.FrequencyPenalty) || p.FrequencyPenalty < -2 || p.FrequencyPenalty > 2:
		return fmt.Errorf("frequency_penalty must be in [-2, 2], got %v", p.FrequencyPenalty)
	case len(p.LogitBias) > MaxLogitBias:
		return fmt.Errorf("logit_bias: at most %d entries, got %d", MaxLogitBias, len(p.LogitBias))
	}
	for t, b := range p.LogitBias {
		if t < 0 || int(t) >= vocab {
			return fmt.Errorf("logit_bias: token id %d is outside the vocabulary [0, %d)", t, vocab)
		}
		if !finite(b) || b < -100 || b > 100 {
			return fmt.Errorf("logit_bias[%d] must be in [-100, 100], got %v", t, b)
		}
	}
	return nil
}

// AllowWords is the length of an allow mask over a vocabulary of vocab
// ids: one bit per id, 32 per word (bit i%32 of word i/32).
func AllowWords(vocab int) int { return (vocab + 31) / 32 }

// Allowed reports whether allow (nil: everything) allows token t.
func Allowed(allow []uint32, t int32) bool {
	return allow == nil || allow[t>>5]&(1<<(uint32(t)&31)) != 0
}

// Apply processes a raw logits row in place: edits (sorted by token,
// unique) first, then the allow mask (nil: no mask), which sets every
// token whose bit is clear to Banned. Raw non-finite values are left as
// they are (CheckFinite reports them). Device samplers implement the same
// rule.
func Apply(row []float32, edits []Edit, allow []uint32) {
	for _, e := range edits {
		l := row[e.Token]
		if !isFinite(l) {
			continue
		}
		if e.Penalty != 0 && e.Penalty != 1 {
			if l > 0 {
				l /= e.Penalty
			} else {
				l *= e.Penalty
			}
			l = min(l, math.MaxFloat32) // a penalty near 0 divides past the finite range
		}
		l += e.Add
		if !(l >= Banned) { // −Inf (a ban) or below the finite range
			l = Banned
		}
		row[e.Token] = l
	}
	if allow == nil {
		return
	}
	for w, word := range allow {
		for clear := ^word; clear != 0; clear &= clear - 1 { // the clear bits, ascending
			i := w*32 + bits.TrailingZeros32(clear)
			if i >= len(row) {
				break
			}
			if isFinite(row[i]) {
				row[i] = Banned
			}
		}
	}
}

func isFinite(v float32) bool { return v == v && v <= math.MaxFloat32 && v >= -math.MaxFloat32 }

// Constraint restricts a request's generated tokens (a grammar compiled
// over the vocabulary: structured output, tool calls).
type Constraint interface {
	// Allow returns the mask of the tokens allowed next (one bit per token
	// id, AllowWords(vocab) words; bit t%32 of word t/32), given the tokens
	// the request may still generate (remaining ≥ 1): a constraint that
	// must end within them allows only tokens that leave it able to. The
	// mask allows at least one token; it is only read until the next call
	// (a constraint may return a cached, shared mask).
	Allow(remaining int) []uint32
	// Accept advances past tok, a token the last mask allowed. done says
	// the output is complete and nothing may follow it: the request then
	// ends with its finish "stop". An error (tok was not allowed) ends the
	// request with an error.
	Accept(tok int32) (done bool, err error)
}

// Restarter is a Constraint that can start afresh: Restart returns a new
// constraint of the same rule at its start, independent of this one (one
// per choice of an n > 1 request).
type Restarter interface {
	Constraint
	Restart() Constraint
}
