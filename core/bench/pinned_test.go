package bench

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/speculative"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/stretchr/testify/require"
)

// openPreset writes a random checkpoint of a preset and opens an engine on
// it sized for s.
func openPreset(t *testing.T, preset string, s Spec) (*model.Checkpoint, *engine.Engine) {
	t.Helper()
	cfg, err := randckpt.Preset(preset)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, randckpt.Write(dir, cfg, randckpt.Options{Seed: 1}))
	return open(t, dir, s)
}

// The configured drafter pinned (the default with Speculative on): on the
// tiny-mtp preset (3-1-4, batch 8) the MTP drafter runs for real (its programs ran, about
// three per verify step at 3-1-4: two draft steps and the draft extend)
// while its drafts are the plain run's greedy tokens spoiled at the rate,
// so every series' greedy tokens are plain decoding's (bench checks them
// and fails otherwise), the per-draft acceptance measured as a chain is
// within four binomial standard deviations of the pinned rate, and a rate
// asked as a length has that expected length. The unpinned MTP series
// times the same drafter.
func TestRunPinnedMTP(t *testing.T) {
	s := Spec{Prompt: 4, DecodeContext: 2, DecodeSteps: 192, Batches: []int{8}, Reps: 1, Warmup: 0,
		Speculative: config.Speculative{Method: "mtp", NumSteps: 3}, SpecAccept: []float64{0.6}, SpecAcceptLen: []float64{3}}
	require.NoError(t, s.Check(1<<20))
	require.Equal(t, DrafterConfigured, s.PinnedDrafter(backend.FP32))
	ck, e := openPreset(t, "tiny-mtp", s)
	res, err := Run(e, ck, s)
	require.NoError(t, err) // includes: every series' greedy tokens equal plain decoding's
	require.Equal(t, DrafterConfigured, res.PinnedDrafter)
	r3, err := speculative.RateForLength(3, 3)
	require.NoError(t, err)
	got := map[string]Series{}
	for _, ser := range res.Series {
		got[ser.Name] = ser
	}
	mtp, ok := got["sched decode batch 8 mtp 3-1-4"]
	require.True(t, ok)
	require.Nil(t, mtp.PinnedRate)
	require.Equal(t, "mtp", mtp.Drafter)
	for name, rate := range map[string]float64{"0.60": 0.6, fmt.Sprintf("length 3.00 (rate %.4f)", r3): r3} {
		ser, ok := got["sched decode batch 8 mtp 3-1-4 pinned at "+name]
		require.True(t, ok, name)
		require.Equal(t, "mtp pinned", ser.Drafter)
		require.NotNil(t, ser.PinnedRate)
		require.Equal(t, rate, *ser.PinnedRate)
		require.InDelta(t, speculative.ExpectedLength(rate, 3), ser.ExpectedLength, 1e-12)
		// the chain's decisions: every accepted draft, and a rejection per span that ended at one
		n := float64(ser.ChainDecisions)
		require.Greater(t, n, 1000.0, name)
		t.Logf("%s: per-draft rate %.4f over %v decisions (4σ %.4f), acceptance length %.3f (expected %.3f)", name, ser.ChainRate, n, 4*math.Sqrt(rate*(1-rate)/n), ser.AcceptanceLength, ser.ExpectedLength)
		require.InDelta(t, rate, ser.ChainRate, 4*math.Sqrt(rate*(1-rate)/n), "%s: %v decisions", name, n)
		require.InDelta(t, ser.ExpectedLength, ser.AcceptanceLength, 0.15, name) // spans cut short at the requests' ends aside
		require.GreaterOrEqual(t, ser.VerifySpans, 8*s.DecodeSteps/4, name)      // ≤ 4 tokens per span: the drafter never dropped out
		// the inner drafter's programs ran: two MTP draft steps and a draft extend per verify step (fewer at the requests' ends)
		require.InDelta(t, 3, ser.DrafterRunsPerStep, 0.25, name)
		require.InDelta(t, mtp.DrafterRunsPerStep, ser.DrafterRunsPerStep, 0.25, name)
		require.Positive(t, ser.DrafterMsPerStep, name)
		require.InDelta(t, ser.DrafterMsPerStep, ser.DrafterProposeMs+ser.DrafterObserveMs, 1e-5, name) // the total divided in whole ns
		require.Zero(t, ser.DrafterDeviceMsPerStep, "the cpu backend does not time device work")
	}
	require.InDelta(t, 3, got["sched decode batch 8 mtp 3-1-4 pinned at "+fmt.Sprintf("length 3.00 (rate %.4f)", r3)].ExpectedLength, 1e-9)
	var b strings.Builder
	require.NoError(t, res.WriteText(&b))
	out := b.String()
	require.Contains(t, out, "pinned   the configured drafter runs")
	require.Regexp(t, `mtp 3-1-4 pinned at 0\.60 .*acceptance length \d\.\d\d \(expected 2\.18\), drafts accepted \d+% \(per draft 0\.\d+, pinned at 0\.6, \d+ spans\).*drafter mtp pinned: \d+\.\d+ ms host wall per verify step`, out)
	j, err := res.JSON()
	require.NoError(t, err)
	require.Contains(t, string(j), `"pinned_drafter": "configured"`)
	require.Contains(t, string(j), `"drafter_ms_per_verify_step"`)
	require.Contains(t, string(j), `"per_draft_acceptance_rate"`)
}

// Spec refuses acceptance lengths beyond the verify span and an unknown or
// unusable SpecDrafter; the pinned drafter defaults to the configured one
// only when a drafter is configured.
func TestSpecPinned(t *testing.T) {
	ok := Spec{Prompt: 4, DecodeContext: 1, DecodeSteps: 1, Batches: []int{1}, Reps: 1, SpecAcceptLen: []float64{6}}
	require.NoError(t, ok.Check(16))
	require.Equal(t, 5, ok.SpecSteps(), "the test drafter alone: 5-1-6")
	require.Equal(t, DrafterScripted, ok.PinnedDrafter(backend.FP32))
	for name, bad := range map[string]func(*Spec){
		"must be in [1, 6], got 6.5": func(s *Spec) { s.SpecAcceptLen = []float64{6.5} },
		"must be in [1, 6], got 0.5": func(s *Spec) { s.SpecAcceptLen = []float64{0.5} },
		"needs a configured drafter": func(s *Spec) { s.SpecDrafter = DrafterConfigured },
		`got "mtp"`:                  func(s *Spec) { s.SpecDrafter = "mtp" },
	} {
		s := ok
		bad(&s)
		require.ErrorContains(t, s.Check(16), name, name)
	}
	on := ok
	on.Speculative = config.Speculative{Method: "mtp", NumSteps: 7}
	require.NoError(t, on.Check(16))
	require.Equal(t, DrafterConfigured, on.PinnedDrafter(backend.FP32))
	require.Equal(t, DrafterSimulated, on.PinnedDrafter(backend.BF16), "below fp32 the plain run's tokens are not the verify's: simulated")
	on.SpecDrafter = DrafterScripted
	require.Equal(t, DrafterScripted, on.PinnedDrafter(backend.BF16))
	on.SpecDrafter = DrafterSimulated
	require.NoError(t, on.Check(16))
	on.SpecAccept = []float64{0}
	require.ErrorContains(t, on.Check(16), "cannot be simulated")
	off := ok
	off.SpecDrafter = DrafterSimulated
	require.ErrorContains(t, off.Check(16), "needs a configured drafter")
}

// With speculative.simulate_acceptance the configured drafter's series runs
// with simulated acceptance (its outputs are not checked: they are not the
// model's) and every report says so: its name, its fields, the header
// line and the JSON; the pinned series never simulate.
func TestRunSimulatedAcceptance(t *testing.T) {
	s := Spec{Prompt: 4, DecodeContext: 2, DecodeSteps: 24, Batches: []int{2}, Reps: 1, Warmup: 0,
		Speculative: config.Speculative{Method: "mtp", NumSteps: 2, SimulateAcceptance: 0.8}, SpecAccept: []float64{1}}
	ck, e := open(t, mtpFixture, s)
	res, err := Run(e, ck, s)
	require.NoError(t, err)
	got := map[string]Series{}
	for _, ser := range res.Series {
		got[ser.Name] = ser
	}
	sim, ok := got["sched decode batch 2 mtp 2-1-3, simulated acceptance 0.8"]
	require.True(t, ok, "%v", got)
	require.Equal(t, 0.8, sim.SimulatedAcceptance)
	require.Greater(t, sim.ChainRate, 0.5, "random MTP weights accept almost nothing by themselves")
	pinned := got["sched decode batch 2 mtp 2-1-3 pinned at 1.00"]
	require.Zero(t, pinned.SimulatedAcceptance)
	require.Equal(t, 3.0, pinned.AcceptanceLength)
	var b strings.Builder
	require.NoError(t, res.WriteText(&b))
	require.Contains(t, b.String(), "simulate speculative.simulate_acceptance 0.8: the mtp 2-1-3, simulated acceptance 0.8 series accepts drafts by a seeded chain")
	require.Contains(t, b.String(), "SIMULATED acceptance 0.8 per draft: outputs are not the model's")
	j, err := res.JSON()
	require.NoError(t, err)
	require.Contains(t, string(j), `"simulated_acceptance": 0.8`)
}

// SpecDrafter simulated (the default below fp32): the configured drafter
// runs for real and the scheduler simulates its acceptance at the pinned
// rate, so the acceptance length is the pinned one whatever the target's
// argmax says (at bf16 a verify's can differ from a decode step's, and
// the plain run's tokens then stop pinning it); its outputs are not
// checked and every report says the series is simulated.
func TestRunSimulatedPinnedMTP(t *testing.T) {
	s := Spec{Prompt: 4, DecodeContext: 2, DecodeSteps: 160, Batches: []int{8}, Reps: 1, Warmup: 0,
		Speculative: config.Speculative{Method: "mtp", NumSteps: 3}, SpecAcceptLen: []float64{3}, SpecDrafter: DrafterSimulated}
	require.NoError(t, s.Check(1<<20))
	ck, e := openPreset(t, "tiny-mtp", s)
	res, err := Run(e, ck, s)
	require.NoError(t, err)
	require.Equal(t, DrafterSimulated, res.PinnedDrafter)
	r3, err := speculative.RateForLength(3, 3)
	require.NoError(t, err)
	var ser *Series
	for i := range res.Series {
		if res.Series[i].Name == fmt.Sprintf("sched decode batch 8 mtp 3-1-4 simulated at length 3.00 (rate %.4f)", r3) {
			ser = &res.Series[i]
		}
	}
	require.NotNil(t, ser, "the simulated series")
	require.Equal(t, r3, ser.SimulatedAcceptance, "reported as simulated")
	require.Equal(t, r3, *ser.PinnedRate)
	require.InDelta(t, 3, ser.AcceptanceLength, 0.2, "the pinned length, simulated")
	require.Positive(t, ser.DrafterMsPerStep, "the drafter ran")
	var b strings.Builder
	require.NoError(t, res.WriteText(&b))
	require.Contains(t, b.String(), "the scheduler simulates acceptance at the rate")
}

// Below fp32 the speculative series' greedy tokens are measured against
// plain decoding's, not checked (a bf16 verify's argmax can differ from a
// decode step's at near-ties: the H200 run failed on it), and the pinned
// series default to simulated acceptance; at bf16 on the cpu backend the
// MTP series still runs through and reports its agreement.
func TestRunSpeculativeBelowFP32(t *testing.T) {
	s := Spec{Prompt: 4, DecodeContext: 2, DecodeSteps: 48, Batches: []int{4}, Reps: 1, Warmup: 0,
		Speculative: config.Speculative{Method: "mtp", NumSteps: 3}, SpecAcceptLen: []float64{3}}
	require.NoError(t, s.Check(1<<20))
	cfg, err := randckpt.Preset("tiny-mtp")
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, randckpt.Write(dir, cfg, randckpt.Options{Seed: 1}))
	ck, err := model.Open(dir)
	require.NoError(t, err)
	t.Cleanup(func() { ck.Close() })
	e, err := engine.New(ck.Config(), ck, engine.Options{Slots: s.Slots(), Rollback: s.Rollback(), Backend: backend.Options{Precision: backend.BF16}})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	res, err := Run(e, ck, s)
	require.NoError(t, err)
	require.Equal(t, DrafterSimulated, res.PinnedDrafter)
	var mtp *Series
	for i := range res.Series {
		if res.Series[i].Name == "sched decode batch 4 mtp 3-1-4" {
			mtp = &res.Series[i]
		}
	}
	require.NotNil(t, mtp)
	require.NotNil(t, mtp.GreedyAgreement, "measured, not checked")
	require.InDelta(t, 0.5, *mtp.GreedyAgreement, 0.5)
	var b strings.Builder
	require.NoError(t, res.WriteText(&b))
	require.Contains(t, b.String(), "below fp32 not checked")
}
