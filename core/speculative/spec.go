// Package speculative is speculative decoding's drafting side and its acceptance
// rule. A Drafter proposes draft tokens for the sequences of a batch and
// learns what the target model committed; the scheduler (core/sched) runs
// each speculating sequence's last token and its drafts as one verify span
// of the target's continuous batch, keeps the drafts the target agrees with
// (Accept: token equality for greedy requests, rejection sampling that
// preserves the target distribution otherwise), adds the target's bonus
// token and cuts the sequence's cache back to what it committed
// (backend.Store.Truncate).
//
// Built in: the MTP (NextN) drafter (NewMTP: chain drafting, top-1, any
// number of steps; the presets 5-1-6 and 1-1-2), the DFlash block drafter
// (NewDFlash: one non-causal forward proposes a block from the target's
// hidden rows at chosen layers), and Scripted, a drafter driven by a
// function of the sequence's tokens (tests and bench use it to propose the
// true greedy continuation with wrong tokens at chosen positions or at a
// fixed rate), and the wrappers Timed (a drafter's own time per verify
// step) and Pinned (a real drafter runs, its drafts replaced by the true
// continuation spoiled at a rate: bench's pinned acceptance). Simulated
// acceptance (SimulatedAccepts) pins a serving path's acceptance by a
// seeded chain instead. Each drafter declares the target outputs it needs
// (Needs) and drafts in Propose.
package speculative

// SeqID names a sequence for a drafter (the scheduler's request id).
type SeqID = string

// Needs says what the target's passes must return for a drafter's
// sequences.
type Needs struct {
	// FinalHidden: the target's final hidden row (after the stream mean and
	// the final norm) of every position it commits, in Observation.Hidden.
	FinalHidden bool
	// TargetHidden: the target's hidden rows after the drafter's target
	// layers (ir.OutputTargetHidden, a DFlash drafter's context rows) of
	// every position it commits, in Observation.Context, from the same
	// pass (the target's programs capture them: engine.Key.TargetHidden).
	TargetHidden bool
}

// Drafter proposes draft tokens and learns what the target committed. The
// scheduler calls it from one goroutine; calls are batched over the
// sequences of a step. A drafter keeps its own per-sequence state and rolls
// it back itself: Observe says what the target committed, which may be
// fewer tokens than were proposed.
type Drafter interface {
	// Name names the method ("mtp", "scripted").
	Name() string
	// Needs says what the drafter reads from the target.
	Needs() Needs
	// MaxDrafts is the most tokens one Propose gives a sequence (the
	// length of the longest verify span is MaxDrafts()+1).
	MaxDrafts() int
	// Start begins drafting for a sequence with its prompt; an error
	// leaves the sequence undrafted (it decodes plainly).
	Start(seq SeqID, prompt []int32) error
	// Observe reports what the target committed since the last call, for
	// some of the drafter's sequences: prefill chunks and the accepted part
	// of verify spans (with the bonus token as Next).
	Observe(obs []Observation) error
	// Propose fills each proposal's Drafts (at most its Max, possibly none)
	// continuing after the sequence's pending token (the last Observation's
	// Next).
	Propose(props []Proposal) error
	// Stop ends a sequence and releases what the drafter held for it.
	Stop(seq SeqID)
	// Close releases the drafter.
	Close() error
}

// Observation is a run of tokens the target committed for one sequence.
type Observation struct {
	Seq SeqID
	// Pos0 is the position of Tokens[0]; Tokens were run by the target at
	// Pos0, Pos0+1, …, and are now in its cache.
	Pos0   int
	Tokens []int32
	// Next is the token at Pos0+len(Tokens), known but not yet run by the
	// target: the next prompt token, the first sampled token, or a verify
	// step's bonus token.
	Next int32
	// Hidden holds the target's final hidden rows of Tokens' positions
	// ([len(Tokens)][hidden], Needs.FinalHidden).
	Hidden []float32
	// Context holds the target's target-layer hidden rows of Tokens'
	// positions ([len(Tokens)][width], Needs.TargetHidden).
	Context []float32
	// Drafted and Accepted count the last proposal's drafts and those the
	// target accepted (0 and 0 after a prefill chunk); Verify says the
	// tokens come from a verify step (their count came from acceptance).
	Drafted, Accepted int
	Verify            bool
}

// Proposal asks a drafter for drafts for one sequence.
type Proposal struct {
	Seq SeqID
	// Max bounds the drafts (the request's remaining tokens and the step's
	// token budget): at most Max, at least none.
	Max int
	// Drafts is filled by Propose.
	Drafts []int32
	// Q, when not nil, holds the drafter's distribution for each draft
	// (len(Drafts) entries): the rejection rule needs q(x). Nil means
	// deterministic drafts (q one-hot on the draft, as a top-1 chain).
	Q []Dist
}

// Dist is a sparse probability distribution over token ids (ids absent
// have probability 0).
type Dist struct {
	IDs   []int32
	Probs []float64
}

// P returns the probability of id.
func (d Dist) P(id int32) float64 {
	for i, x := range d.IDs {
		if x == id {
			return d.Probs[i]
		}
	}
	return 0
}

// Stats count one request's speculation.
type Stats struct {
	// Steps is the verify passes that held drafts for the request.
	Steps int
	// Drafted is the draft tokens proposed; Accepted those the target
	// accepted. Every verify step also yields one token of the target's
	// own (the bonus or the correction).
	Drafted, Accepted int
}

// AcceptanceLength is the mean number of tokens a verify step produced
// (accepted drafts + the target's token), 0 without steps.
func (s Stats) AcceptanceLength() float64 {
	if s.Steps == 0 {
		return 0
	}
	return float64(s.Accepted+s.Steps) / float64(s.Steps)
}

// Add sums two Stats.
func (s Stats) Add(o Stats) Stats {
	return Stats{Steps: s.Steps + o.Steps, Drafted: s.Drafted + o.Drafted, Accepted: s.Accepted + o.Accepted}
}

// MaxSteps bounds num_steps (device stores keep num_steps+1 positions of
// KDA state per slot); config.MaxSpecSteps is the same bound.
const MaxSteps = 32
