package backend

import (
	"fmt"
	"math"

	"github.com/glmflash/glmflash/core/sample"
)

// CheckProcessing checks a spec's logits processing against a vocabulary
// of vocab ids, naming what is wrong: edits sorted by token, unique and
// inside the vocabulary, each with a penalty of 0 or 1 (none) or a finite
// positive one and an addend that is a number below +Inf (−Inf bans); the
// allow mask nil or sample.AllowWords(vocab) words. A device backend reads
// them where they point, so nothing outside these ranges reaches it.
func (s *SampleSpec) CheckProcessing(vocab int) error {
	prev := int32(-1)
	for j, e := range s.Edits {
		switch {
		case e.Token < 0 || int(e.Token) >= vocab:
			return fmt.Errorf("edit %d: token %d is outside the vocabulary [0, %d)", j, e.Token, vocab)
		case e.Token <= prev:
			return fmt.Errorf("edit %d: token %d after token %d (edits are sorted by token, each token once)", j, e.Token, prev)
		case !(e.Penalty >= 0) || math.IsInf(float64(e.Penalty), 1):
			return fmt.Errorf("edit %d (token %d): penalty %v is not a finite value ≥ 0", j, e.Token, e.Penalty)
		case e.Add != e.Add || math.IsInf(float64(e.Add), 1):
			return fmt.Errorf("edit %d (token %d): addend %v is NaN or +Inf", j, e.Token, e.Add)
		}
		prev = e.Token
	}
	if s.Allow != nil && len(s.Allow) != sample.AllowWords(vocab) {
		return fmt.Errorf("allow mask of %d words for a vocabulary of %d ids (want %d)", len(s.Allow), vocab, sample.AllowWords(vocab))
	}
	return nil
}
