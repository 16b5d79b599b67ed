package speculative

import (
	"fmt"
	"time"

	"github.com/glmflash/glmflash/core/backend"
)

// DrafterTime is what a drafter's own work cost over the calls a Timed
// drafter saw. A verify step is one Propose call that drafted for at least
// one sequence (one scheduler step, batched over its sequences); its cost
// is that Propose and the Observe call that follows it (the one holding
// verify observations: a step's prompt chunks, observed in the same call,
// are in it too). Observe calls holding prompt chunks only (the drafter's
// prefill) are counted apart.
type DrafterTime struct {
	// Steps are the verify steps.
	Steps int
	// Propose and Observe are the host wall time of the verify steps'
	// Propose and Observe calls; Prefill that of the other Observe calls.
	Propose, Observe, Prefill time.Duration
	// Device is the inner drafter's program counters over the verify
	// steps' calls (zero without a counter reader; DeviceNs zero on a
	// backend that does not time its device work).
	Device backend.DeviceStats
	// Spans are the verify spans observed (one per sequence and verify
	// step); Accepted their accepted drafts and Rejected the spans that
	// ended at a rejected draft (not after their last draft). Every draft
	// decided is accepted or ends its span, so Accepted/(Accepted+Rejected)
	// is the per-draft acceptance rate of a chain (ChainRate), unbiased by
	// spans that held fewer drafts.
	Spans, Accepted, Rejected int
}

// ChainRate is the per-draft acceptance rate measured as a chain:
// Accepted/(Accepted+Rejected) (0 without decisions).
func (t DrafterTime) ChainRate() float64 {
	if n := t.Accepted + t.Rejected; n > 0 {
		return float64(t.Accepted) / float64(n)
	}
	return 0
}

// WallPerStep is the host wall time of a verify step's drafter calls (0
// without steps).
func (t DrafterTime) WallPerStep() time.Duration {
	if t.Steps == 0 {
		return 0
	}
	return (t.Propose + t.Observe) / time.Duration(t.Steps)
}

// DeviceMsPerStep is the device time (ms) of the drafter's programs per
// verify step (0 without steps or where the backend does not time them).
func (t DrafterTime) DeviceMsPerStep() float64 {
	if t.Steps == 0 {
		return 0
	}
	return float64(t.Device.DeviceNs) / 1e6 / float64(t.Steps)
}

// RunsPerStep is the drafter's program runs per verify step.
func (t DrafterTime) RunsPerStep() float64 {
	if t.Steps == 0 {
		return 0
	}
	return float64(t.Device.Runs) / float64(t.Steps)
}

// Add sums two DrafterTimes.
func (t DrafterTime) Add(o DrafterTime) DrafterTime {
	t.Steps += o.Steps
	t.Propose += o.Propose
	t.Observe += o.Observe
	t.Prefill += o.Prefill
	t.Spans += o.Spans
	t.Accepted += o.Accepted
	t.Rejected += o.Rejected
	t.Device = addStats(t.Device, o.Device, 1)
	return t
}

// addStats returns a + sign·b, counter by counter.
func addStats(a, b backend.DeviceStats, sign int64) backend.DeviceStats {
	a.Runs += sign * b.Runs
	a.DeviceLengthReads += sign * b.DeviceLengthReads
	a.FusedMHCRuns += sign * b.FusedMHCRuns
	a.HostSyncs += sign * b.HostSyncs
	a.LengthSyncs += sign * b.LengthSyncs
	a.Launches += sign * b.Launches
	a.GraphReplays += sign * b.GraphReplays
	a.GraphCaptures += sign * b.GraphCaptures
	a.Kernels += sign * b.Kernels
	a.DeviceNs += sign * b.DeviceNs
	a.PrepNs += sign * b.PrepNs
	return a
}

// Timed is a drafter that measures another: every call goes to the inner
// drafter unchanged, and Time says what its verify steps cost. Counters,
// when set, reads the inner drafter's cumulative program counters (the sum
// of backend.DeviceStatsOf over its programs); the programs run
// synchronously inside the calls, so a call's counters are the difference
// of two readings around it.
type Timed struct {
	inner    Drafter
	counters func() backend.DeviceStats
	t        DrafterTime
	// open: a Propose drafted and its step's Observe has not come yet.
	open bool
}

// NewTimed returns a Timed drafter around inner (counters may be nil).
func NewTimed(inner Drafter, counters func() backend.DeviceStats) *Timed {
	return &Timed{inner: inner, counters: counters}
}

// Inner is the measured drafter.
func (d *Timed) Inner() Drafter { return d.inner }

// Time is what the inner drafter cost so far.
func (d *Timed) Time() DrafterTime { return d.t }

// Name is the inner drafter's.
func (d *Timed) Name() string { return d.inner.Name() }

// Needs is the inner drafter's.
func (d *Timed) Needs() Needs { return d.inner.Needs() }

// MaxDrafts is the inner drafter's.
func (d *Timed) MaxDrafts() int { return d.inner.MaxDrafts() }

// Start starts the sequence on the inner drafter.
func (d *Timed) Start(seq SeqID, prompt []int32) error { return d.inner.Start(seq, prompt) }

// Stop stops the sequence on the inner drafter.
func (d *Timed) Stop(seq SeqID) { d.inner.Stop(seq) }

// Close closes the inner drafter.
func (d *Timed) Close() error { return d.inner.Close() }

// read is the inner drafter's counters now.
func (d *Timed) read() backend.DeviceStats {
	if d.counters == nil {
		return backend.DeviceStats{}
	}
	return d.counters()
}

// Observe passes the observations to the inner drafter, timed as its
// verify step's when one holds a verify span, as its prefill's otherwise.
func (d *Timed) Observe(obs []Observation) error {
	verify := false
	for _, o := range obs {
		if o.Verify {
			verify = true
			d.t.Spans++
			d.t.Accepted += o.Accepted
			if o.Accepted < o.Drafted {
				d.t.Rejected++
			}
		}
	}
	c0, t0 := d.read(), time.Now()
	err := d.inner.Observe(obs)
	took := time.Since(t0)
	if verify || d.open {
		d.t.Observe += took
		d.t.Device = addStats(d.t.Device, addStats(d.read(), c0, -1), 1)
		d.open = false
	} else {
		d.t.Prefill += took
	}
	return err
}

// Propose asks the inner drafter, timed; a call that drafted for any
// sequence is a verify step.
func (d *Timed) Propose(props []Proposal) error {
	c0, t0 := d.read(), time.Now()
	err := d.inner.Propose(props)
	took := time.Since(t0)
	drafted := false
	for _, p := range props {
		drafted = drafted || len(p.Drafts) > 0
	}
	if drafted {
		d.t.Steps++
		d.t.Propose += took
		d.t.Device = addStats(d.t.Device, addStats(d.read(), c0, -1), 1)
		d.open = true
	}
	return err
}

// PinnedOptions configure a Pinned drafter.
type PinnedOptions struct {
	// Truth is the target's greedy continuation of a prompt (from a plain
	// run; nil for a prompt: no drafts for it).
	Truth func(prompt []int32) []int32
	// Rate is the per-draft acceptance rate in [0, 1]: each draft is the
	// truth's token with probability Rate, else a wrong one (WrongRate,
	// seeded by Seed).
	Rate float64
	Seed uint64
	// Vocab is the vocabulary size (a wrong draft is (truth+1) mod Vocab).
	Vocab int
	// Counters reads the inner drafter's program counters (see Timed).
	Counters func() backend.DeviceStats
}

// Pinned runs a real drafter and replaces its drafts: the inner drafter
// proposes (its time and device work are real, measured as Timed's) and
// observes every commit (its state follows what the target committed), but
// each sequence's drafts are replaced by as many tokens of the target's
// true greedy continuation, each spoiled with probability 1−Rate (Oracle
// with WrongRate). A greedy request's tokens are therefore plain
// decoding's, its acceptance pinned at Rate per draft (the expected tokens
// per verify step of k drafts ExpectedLength(Rate, k)) and the verify spans
// the inner drafter's shapes. The drafts are deterministic (no Q): pin
// greedy requests only, sampled ones accept by p(draft) (a true token is
// no more likely than the target says).
type Pinned struct {
	*Timed
	script *Scripted
	rate   float64
}

// NewPinned returns inner pinned at opts.Rate.
func NewPinned(inner Drafter, opts PinnedOptions) (*Pinned, error) {
	switch {
	case !(opts.Rate >= 0 && opts.Rate <= 1):
		return nil, fmt.Errorf("spec: a pinned acceptance rate must be in [0, 1], got %v", opts.Rate)
	case opts.Truth == nil || opts.Vocab < 2:
		return nil, fmt.Errorf("spec: a pinned drafter needs the target's greedy continuations and a vocabulary of ≥ 2 ids (got %d)", opts.Vocab)
	}
	sc, err := NewScripted("pinned", inner.MaxDrafts(), Oracle(opts.Truth, WrongRate(opts.Rate, opts.Seed), opts.Vocab))
	if err != nil {
		return nil, err
	}
	return &Pinned{Timed: NewTimed(inner, opts.Counters), script: sc, rate: opts.Rate}, nil
}

// Name is "<inner> pinned".
func (d *Pinned) Name() string { return d.inner.Name() + " pinned" }

// Rate is the per-draft acceptance rate.
func (d *Pinned) Rate() float64 { return d.rate }

// Start starts the sequence on both the inner drafter and the script.
func (d *Pinned) Start(seq SeqID, prompt []int32) error {
	if err := d.inner.Start(seq, prompt); err != nil {
		return err
	}
	if err := d.script.Start(seq, prompt); err != nil {
		d.inner.Stop(seq)
		return err
	}
	return nil
}

// Observe tells both what the target committed.
func (d *Pinned) Observe(obs []Observation) error {
	if err := d.Timed.Observe(obs); err != nil {
		return err
	}
	return d.script.Observe(obs)
}

// Propose runs the inner drafter, then replaces each sequence's drafts by
// as many pinned ones (fewer where the truth ends; none where the
// sequence left it).
func (d *Pinned) Propose(props []Proposal) error {
	if err := d.Timed.Propose(props); err != nil {
		return err
	}
	mx := make([]int, len(props))
	for i := range props {
		mx[i], props[i].Max = props[i].Max, len(props[i].Drafts)
	}
	err := d.script.Propose(props)
	for i := range props {
		props[i].Max = mx[i]
	}
	return err
}

// Stop stops the sequence on both.
func (d *Pinned) Stop(seq SeqID) {
	d.inner.Stop(seq)
	d.script.Stop(seq)
}

// Close closes both.
func (d *Pinned) Close() error {
	d.script.Close()
	return d.inner.Close()
}

// ExpectedLength is the mean tokens a verify step of k drafts produces
// when each draft is accepted with probability r until the first
// rejection: E[len] = 1 + Σ_{i=1..k} r^i (the accepted drafts and the
// target's own token).
func ExpectedLength(r float64, k int) float64 {
	s, p := 1.0, 1.0
	for i := 1; i <= k; i++ {
		p *= r
		s += p
	}
	return s
}

// RateForLength is the per-draft acceptance rate r in [0, 1] whose
// ExpectedLength(r, k) is length: the root of 1 + Σ_{i=1..k} r^i = length
// (increasing in r), for a length in [1, k+1].
func RateForLength(length float64, k int) (float64, error) {
	if k < 1 {
		return 0, fmt.Errorf("spec: an acceptance length needs ≥ 1 draft per step, got %d", k)
	}
	if !(length >= 1 && length <= float64(k+1)) {
		return 0, fmt.Errorf("spec: an acceptance length with %d drafts per step must be in [1, %d], got %v", k, k+1, length)
	}
	switch length {
	case 1:
		return 0, nil
	case float64(k + 1):
		return 1, nil
	}
	lo, hi := 0.0, 1.0
	for range 100 { // bisection to double precision
		mid := (lo + hi) / 2
		if ExpectedLength(mid, k) < length {
			lo = mid
		} else {
			hi = mid
		}
		if hi-lo < 1e-15 {
			break
		}
	}
	return (lo + hi) / 2, nil
}
