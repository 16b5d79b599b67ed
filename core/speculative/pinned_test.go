package speculative

import (
	"math"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/stretchr/testify/require"
)

// RateForLength inverts ExpectedLength (1 + Σ_{i=1..k} r^i) over [1, k+1]
// and refuses lengths outside it.
func TestRateForLength(t *testing.T) {
	require.Equal(t, 1.0, ExpectedLength(0, 5))
	require.Equal(t, 6.0, ExpectedLength(1, 5))
	require.InDelta(t, 1+0.5+0.25+0.125, ExpectedLength(0.5, 3), 1e-15)
	for _, k := range []int{1, 3, 5, 7} {
		for _, l := range []float64{1, 1.5, 2, 3, 4, 6, 8} {
			if l > float64(k+1) {
				_, err := RateForLength(l, k)
				require.ErrorContains(t, err, "must be in [1,")
				continue
			}
			r, err := RateForLength(l, k)
			require.NoError(t, err)
			require.InDelta(t, l, ExpectedLength(r, k), 1e-12, "k %d length %v", k, l)
		}
	}
	r, err := RateForLength(1.5, 1) // one draft: 1 + r
	require.NoError(t, err)
	require.InDelta(t, 0.5, r, 1e-12)
	r, err = RateForLength(8, 7)
	require.NoError(t, err)
	require.Equal(t, 1.0, r)
	_, err = RateForLength(math.NaN(), 3)
	require.Error(t, err)
	_, err = RateForLength(2, 0)
	require.ErrorContains(t, err, "≥ 1 draft")
}

// recorder is an inner drafter that proposes fixed tokens and records its
// calls.
type recorder struct {
	steps    int
	started  []SeqID
	observed []Observation
	proposed int
}

func (d *recorder) Name() string   { return "rec" }
func (d *recorder) Needs() Needs   { return Needs{FinalHidden: true} }
func (d *recorder) MaxDrafts() int { return d.steps }
func (d *recorder) Start(seq SeqID, _ []int32) error {
	d.started = append(d.started, seq)
	return nil
}
func (d *recorder) Observe(obs []Observation) error {
	d.observed = append(d.observed, obs...)
	return nil
}
func (d *recorder) Propose(props []Proposal) error {
	d.proposed++
	for i := range props {
		props[i].Drafts = props[i].Drafts[:0]
		for range min(props[i].Max, d.steps) {
			props[i].Drafts = append(props[i].Drafts, 99)
		}
	}
	return nil
}
func (d *recorder) Stop(SeqID)   {}
func (d *recorder) Close() error { return nil }

// Pinned runs the inner drafter on every call and replaces its drafts by as
// many pinned ones (the truth at rate 1, spoiled ones at rate 0); Observe
// reaches the inner drafter unchanged; Timed counts the verify steps, the
// spans' chain decisions and the counters read around the calls.
func TestPinnedWrapsInner(t *testing.T) {
	truth := []int32{5, 6, 7, 8, 9, 10}
	runs := int64(0)
	for _, rate := range []float64{1, 0} {
		in := &recorder{steps: 3}
		d, err := NewPinned(in, PinnedOptions{Truth: func([]int32) []int32 { return truth }, Rate: rate, Seed: 1, Vocab: 32,
			Counters: func() backend.DeviceStats { runs++; return backend.DeviceStats{Stats: backend.Stats{Runs: runs}} }})
		require.NoError(t, err)
		require.Equal(t, "rec pinned", d.Name())
		require.Equal(t, Needs{FinalHidden: true}, d.Needs())
		require.Equal(t, 3, d.MaxDrafts())
		require.NoError(t, d.Start("a", []int32{1, 2}))
		prefill := Observation{Seq: "a", Pos0: 0, Tokens: []int32{1, 2}, Next: 5}
		require.NoError(t, d.Observe([]Observation{prefill}))
		props := []Proposal{{Seq: "a", Max: 2}}
		require.NoError(t, d.Propose(props))
		require.Equal(t, 1, in.proposed)
		want := []int32{6, 7}
		if rate == 0 {
			want = []int32{7, 8} // (truth+1) mod vocab
		}
		require.Equal(t, want, props[0].Drafts)
		require.Equal(t, 2, props[0].Max, "Max is the scheduler's again")
		acc := 2
		if rate == 0 {
			acc = 0
		}
		verify := Observation{Seq: "a", Pos0: 2, Tokens: append([]int32{5}, want[:acc]...), Next: truth[acc+1], Drafted: 2, Accepted: acc, Verify: true}
		require.NoError(t, d.Observe([]Observation{verify}))
		require.Equal(t, []Observation{prefill, verify}, in.observed)
		tm := d.Time()
		require.Equal(t, 1, tm.Steps)
		require.Equal(t, 1, tm.Spans)
		require.Equal(t, acc, tm.Accepted)
		require.Equal(t, 1-acc/2, tm.Rejected)
		require.Equal(t, int64(2), tm.Device.Runs, "one counter step per timed verify call (read before and after each)")
		require.Equal(t, float64(acc)/float64(acc+1-acc/2), tm.ChainRate())
		require.Positive(t, tm.Propose+tm.Observe)
		require.Positive(t, tm.Prefill)
	}
	_, err := NewPinned(&recorder{steps: 1}, PinnedOptions{Rate: 1.5, Truth: func([]int32) []int32 { return nil }, Vocab: 4})
	require.ErrorContains(t, err, "rate must be in [0, 1]")
	_, err = NewPinned(&recorder{steps: 1}, PinnedOptions{Rate: 0.5, Vocab: 4})
	require.ErrorContains(t, err, "greedy continuations")
}
