package speculative

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
)

// History is what a scripted drafter knows of a sequence: its prompt, the
// tokens the target generated so far (the last one pending: not yet run by
// the target) and the sequence's id.
type History struct {
	Seq       SeqID
	Prompt    []int32
	Generated []int32
}

// ScriptFunc returns up to max drafts continuing a sequence's history, and
// their distributions (nil: deterministic drafts).
type ScriptFunc func(h History, max int) ([]int32, []Dist)

// Scripted is a drafter whose drafts come from a function of the sequence's
// history: the test drafter. Oracle proposes the target's own greedy
// continuation, which makes rollback happen exactly where a test or a
// benchmark wants it (random weights accept almost no MTP draft).
type Scripted struct {
	name  string
	steps int
	fn    ScriptFunc
	seqs  map[SeqID]*History
}

// NewScripted returns a drafter proposing fn's drafts, at most steps per
// verify span.
func NewScripted(name string, steps int, fn ScriptFunc) (*Scripted, error) {
	if steps < 1 || steps > MaxSteps {
		return nil, fmt.Errorf("spec: num_steps must be in [1, %d], got %d", MaxSteps, steps)
	}
	return &Scripted{name: name, steps: steps, fn: fn, seqs: map[SeqID]*History{}}, nil
}

// Name names the drafter.
func (d *Scripted) Name() string { return d.name }

// Needs nothing from the target.
func (d *Scripted) Needs() Needs { return Needs{} }

// MaxDrafts is the drafter's steps.
func (d *Scripted) MaxDrafts() int { return d.steps }

// Start records the prompt.
func (d *Scripted) Start(seq SeqID, prompt []int32) error {
	d.seqs[seq] = &History{Seq: seq, Prompt: append([]int32(nil), prompt...)}
	return nil
}

// Observe records the generated tokens: the committed ones past the prompt
// and the pending one.
func (d *Scripted) Observe(obs []Observation) error {
	for _, o := range obs {
		h := d.seqs[o.Seq]
		if h == nil {
			return fmt.Errorf("spec: sequence %s is not drafted", o.Seq)
		}
		P, end := len(h.Prompt), o.Pos0+len(o.Tokens) // Next is at position end
		if end < P {
			continue // Next is still a prompt token
		}
		for p := max(o.Pos0, P); p < end; p++ {
			if i := p - P; i < len(h.Generated) {
				h.Generated[i] = o.Tokens[p-o.Pos0]
			} else {
				h.Generated = append(h.Generated, o.Tokens[p-o.Pos0])
			}
		}
		if len(h.Generated) < end-P {
			return fmt.Errorf("spec: sequence %s: position %d was committed before it was observed", o.Seq, P+len(h.Generated))
		}
		h.Generated = append(h.Generated[:end-P], o.Next)
	}
	return nil
}

// Propose asks the script.
func (d *Scripted) Propose(props []Proposal) error {
	for i := range props {
		p := &props[i]
		p.Drafts, p.Q = p.Drafts[:0], nil
		h := d.seqs[p.Seq]
		if h == nil || p.Max < 1 || len(h.Generated) == 0 {
			continue
		}
		drafts, q := d.fn(*h, min(p.Max, d.steps))
		if len(drafts) > min(p.Max, d.steps) || (q != nil && len(q) != len(drafts)) {
			return fmt.Errorf("spec: %s drafter: %d drafts (%d distributions) for at most %d", d.name, len(drafts), len(q), min(p.Max, d.steps))
		}
		p.Drafts, p.Q = append(p.Drafts, drafts...), q
	}
	return nil
}

// Stop forgets the sequence.
func (d *Scripted) Stop(seq SeqID) { delete(d.seqs, seq) }

// Close forgets every sequence.
func (d *Scripted) Close() error {
	clear(d.seqs)
	return nil
}

// Oracle is the test drafter's script: truth(prompt) is the target's
// greedy continuation of a prompt (from a plain run; nil: unknown, no
// drafts), and wrong(h, i) says whether the draft for generated token i
// (0-based, counted over the whole continuation) is replaced by a wrong
// token ((truth+1) mod vocab). While the generated tokens follow the truth
// it proposes the truth's next tokens; once they leave it, nothing.
func Oracle(truth func(prompt []int32) []int32, wrong func(h History, i int) bool, vocab int) ScriptFunc {
	return func(h History, max int) ([]int32, []Dist) {
		t := truth(h.Prompt)
		g := len(h.Generated)
		if g > len(t) {
			return nil, nil
		}
		for i, x := range h.Generated {
			if t[i] != x {
				return nil, nil
			}
		}
		var drafts []int32
		for i := g; i < len(t) && len(drafts) < max; i++ {
			x := t[i]
			if wrong != nil && wrong(h, i) {
				x = (x + 1) % int32(vocab)
			}
			drafts = append(drafts, x)
		}
		return drafts, nil
	}
}

// WrongAt is an Oracle's wrong function that spoils the drafts for the
// given generated-token indexes of every sequence.
func WrongAt(idx ...int) func(History, int) bool {
	set := map[int]bool{}
	for _, i := range idx {
		set[i] = true
	}
	return func(_ History, i int) bool { return set[i] }
}

// WrongRate is an Oracle's wrong function that spoils each draft with
// probability 1−rate, decided by a hash of (seed, prompt, index): the same
// drafts for the same sequence whatever the batching, and a per-draft
// acceptance rate of rate (so the expected tokens per verify step of k
// drafts is Σ_{i≤k} rate^i).
func WrongRate(rate float64, seed uint64) func(History, int) bool {
	return func(h History, i int) bool {
		f := fnv.New64a()
		var b [8]byte
		for _, t := range h.Prompt {
			binary.LittleEndian.PutUint32(b[:4], uint32(t))
			f.Write(b[:4])
		}
		x := f.Sum64() ^ seed*0x9e3779b97f4a7c15 ^ uint64(i)*0xbf58476d1ce4e5b9
		// splitmix64's finalizer: every bit of x reaches every bit of u
		x ^= x >> 30
		x *= 0xbf58476d1ce4e5b9
		x ^= x >> 27
		x *= 0x94d049bb133111eb
		x ^= x >> 31
		return float64(x>>11)/(1<<53) >= rate
	}
}
