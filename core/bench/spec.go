package bench

import (
	"fmt"
	"slices"

	"github.com/glmflash/glmflash/core/attrib"
	"github.com/glmflash/glmflash/core/backend"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/sched"
	"github.com/glmflash/glmflash/core/speculative"
)

// drafters make the configured drafter of each speculative method
// (config.Speculative.Method) on an engine, with the programs it runs
// (their counters are the drafter's device work; nil: not counted). A
// method config accepts has its line here; bench refuses one without.
var drafters = map[string]func(e *engine.Engine, sp config.Speculative) (speculative.Drafter, []engine.Key, error){
	"mtp": func(e *engine.Engine, sp config.Speculative) (speculative.Drafter, []engine.Key, error) {
		d, err := speculative.NewMTP(e, speculative.MTPOptions{Steps: sp.Steps(), IndexShare: sp.Share(e.Config().IndexShareForMTPIteration)})
		if err != nil {
			return nil, nil, err
		}
		return d, d.Keys(), nil
	},
	"dflash": func(e *engine.Engine, _ config.Speculative) (speculative.Drafter, []engine.Key, error) {
		d, err := speculative.NewDFlash(e) // the engine holds the drafter (Spec.DFlashBlock its block)
		if err != nil {
			return nil, nil, err
		}
		return d, d.Keys(), nil
	},
}

// configured makes the configured drafter and a reader of its programs'
// counters, compiling them (and the verify program) first so that no
// measured run compiles.
func configured(e *engine.Engine, sp config.Speculative) (speculative.Drafter, func() backend.DeviceStats, error) {
	mk := drafters[sp.Method]
	if mk == nil {
		return nil, nil, fmt.Errorf("bench: speculative method %q has no drafter in bench", sp.Method)
	}
	d, keys, err := mk(e, sp)
	if err != nil {
		return nil, nil, err
	}
	var progs []backend.Program
	for _, k := range append(slices.Clone(keys), sched.SpecProgram(d)) {
		p, err := e.Program(k)
		if err != nil {
			d.Close()
			return nil, nil, err
		}
		progs = append(progs, p)
	}
	progs = progs[:len(keys)] // the verify program is the target's
	return d, func() backend.DeviceStats {
		var sum backend.DeviceStats
		for _, p := range progs {
			s := backend.DeviceStatsOf(p)
			sum.Runs += s.Runs
			sum.Launches += s.Launches
			sum.Kernels += s.Kernels
			sum.GraphReplays += s.GraphReplays
			sum.HostSyncs += s.HostSyncs
			sum.LengthSyncs += s.LengthSyncs
			sum.DeviceNs += s.DeviceNs
			sum.PrepNs += s.PrepNs
		}
		return sum
	}, nil
}

// pin is one pinned acceptance: a per-draft rate, and the length it was
// solved for (0: asked as a rate).
type pin struct {
	rate, length float64
}

// pins are the Spec's pinned acceptances, rates first.
func (s Spec) pins() []pin {
	var ps []pin
	for _, r := range s.SpecAccept {
		ps = append(ps, pin{rate: r})
	}
	for _, l := range s.SpecAcceptLen {
		r, _ := speculative.RateForLength(l, s.SpecSteps()) // Check refused what has no rate
		ps = append(ps, pin{rate: r, length: l})
	}
	return ps
}

func (p pin) String() string {
	if p.length > 0 {
		return fmt.Sprintf("length %.2f (rate %.4f)", p.length, p.rate)
	}
	return fmt.Sprintf("%.2f", p.rate)
}

// arm is one drafter of the speculative series.
type arm struct {
	name string
	// make returns the drafter measured (a Timed one: its time is the
	// series' drafter time).
	make func() (speculative.Drafter, *speculative.Timed, error)
	pin  *pin
	// sim is the scheduler's simulated acceptance (0: off; outputs not
	// checked).
	sim float64
}

// speculative are the scheduler series of batch B: plain decoding, then
// each drafter, whose greedy tokens must be plain decoding's (except under
// simulated acceptance, which changes them).
func (r *runner) speculative(B int) error {
	cfg, sp, k, steps := r.cfg, r.s.Speculative, r.s.SpecSteps(), r.s.DecodeSteps
	prompts := make([][]int32, B)
	for i := range prompts {
		prompts[i] = attrib.BenchTokens(32, 100+i, cfg.VocabSize)
	}
	var plain *specRun
	if err := r.series(fmt.Sprintf("sched decode batch %d plain", B), func() (int, float64, *perStep, error) {
		run, err := runSched(r.e, nil, 0, prompts, steps)
		if err != nil {
			return 0, 0, nil, err
		}
		plain = run
		return run.decode, run.secs, nil, nil
	}); err != nil {
		return err
	}
	base := r.res.Series[len(r.res.Series)-1].TokensPerSec
	truth := map[string][]int32{}
	for i, p := range prompts {
		truth[fmt.Sprint(p)] = plain.tokens[i]
	}
	truthOf := func(p []int32) []int32 { return truth[fmt.Sprint(p)] }
	var arms []arm
	pinned := sp // the pinned series never simulate (their drafts pin them)
	pinned.SimulateAcceptance = 0
	if sp.On() { // its name says "simulated acceptance r" when simulated
		arms = append(arms, arm{name: sp.String(), sim: sp.SimulateAcceptance, make: func() (speculative.Drafter, *speculative.Timed, error) {
			d, counters, err := configured(r.e, sp)
			if err != nil {
				return nil, nil, err
			}
			t := speculative.NewTimed(d, counters)
			return t, t, nil
		}})
	}
	prec := r.e.Backend().Info().Precision
	for _, p := range r.s.pins() {
		p := p
		switch r.s.PinnedDrafter(prec) {
		case DrafterSimulated:
			// the drafter runs for real; the scheduler decides acceptance
			// at the rate (outputs are not the model's: not checked)
			arms = append(arms, arm{name: fmt.Sprintf("%s simulated at %s", pinned, p), pin: &p, sim: p.rate, make: func() (speculative.Drafter, *speculative.Timed, error) {
				d, counters, err := configured(r.e, pinned)
				if err != nil {
					return nil, nil, err
				}
				t := speculative.NewTimed(d, counters)
				return t, t, nil
			}})
			continue
		case DrafterConfigured:
			arms = append(arms, arm{name: fmt.Sprintf("%s pinned at %s", pinned, p), pin: &p, make: func() (speculative.Drafter, *speculative.Timed, error) {
				d, counters, err := configured(r.e, pinned)
				if err != nil {
					return nil, nil, err
				}
				pd, err := speculative.NewPinned(d, speculative.PinnedOptions{Truth: truthOf, Rate: p.rate, Seed: 1, Vocab: cfg.VocabSize, Counters: counters})
				if err != nil {
					d.Close()
					return nil, nil, err
				}
				return pd, pd.Timed, nil
			}})
			continue
		}
		arms = append(arms, arm{name: fmt.Sprintf("test drafter %d-1-%d at %s", k, k+1, p), pin: &p, make: func() (speculative.Drafter, *speculative.Timed, error) {
			d, err := speculative.NewScripted("test", k, speculative.Oracle(truthOf, speculative.WrongRate(p.rate, 1), cfg.VocabSize))
			if err != nil {
				return nil, nil, err
			}
			t := speculative.NewTimed(d, nil)
			return t, t, nil
		}})
	}
	for _, a := range arms {
		if err := r.specArm(B, a, prompts, plain, base); err != nil {
			return err
		}
	}
	return nil
}

// specArm measures one drafter's series of batch B and fills its
// speculative fields from the measured runs (not the warm-ups).
func (r *runner) specArm(B int, a arm, prompts [][]int32, plain *specRun, base float64) error {
	var total speculative.Stats
	var dt speculative.DrafterTime
	var decode, passes, run int
	var drafter string
	var agree *float64
	if err := r.series(fmt.Sprintf("sched decode batch %d %s", B, a.name), func() (int, float64, *perStep, error) {
		d, timed, err := a.make()
		if err != nil {
			return 0, 0, nil, err
		}
		defer d.Close()
		drafter = d.Name()
		sr, err := runSched(r.e, d, a.sim, prompts, r.s.DecodeSteps)
		if err != nil {
			return 0, 0, nil, err
		}
		switch {
		case a.sim > 0: // simulated: not the model's outputs
		case r.e.Backend().Info().Precision == backend.FP32:
			for i := range prompts {
				if fmt.Sprint(sr.tokens[i]) != fmt.Sprint(plain.tokens[i]) {
					return 0, 0, nil, fmt.Errorf("%s: request %d's greedy tokens differ from plain decoding's", a.name, i)
				}
			}
		default: // below fp32: measured, not checked
			same, all := 0, 0
			for i := range prompts {
				same += agreeing(sr.tokens[i], plain.tokens[i])
				all += len(plain.tokens[i])
			}
			if all > 0 {
				f := float64(same) / float64(all)
				agree = &f
			}
		}
		if run++; run > r.s.Warmup {
			total, decode, passes = total.Add(sr.st), decode+sr.decode, passes+sr.passes
			dt = dt.Add(timed.Time())
		}
		return sr.decode, sr.secs, nil, nil
	}); err != nil {
		return err
	}
	res := &r.res.Series[len(r.res.Series)-1]
	res.spec, res.Drafter, res.SimulatedAcceptance, res.GreedyAgreement = true, drafter, a.sim, agree
	res.AcceptanceLength = total.AcceptanceLength()
	if a.pin != nil {
		rate := a.pin.rate
		res.PinnedRate, res.TargetLength, res.ExpectedLength = &rate, a.pin.length, speculative.ExpectedLength(rate, r.s.SpecSteps())
	}
	if total.Drafted > 0 {
		res.AcceptRate = float64(total.Accepted) / float64(total.Drafted)
	}
	if passes > 0 {
		res.TokensPerPass = float64(decode) / float64(B) / float64(passes)
	}
	if base > 0 {
		res.SpeedUp = res.TokensPerSec / base
	}
	res.VerifySpans, res.ChainRate, res.ChainDecisions = dt.Spans, dt.ChainRate(), dt.Accepted+dt.Rejected
	if n := dt.Steps; n > 0 {
		res.VerifySteps = n
		res.DrafterMsPerStep = float64(dt.WallPerStep().Nanoseconds()) / 1e6
		res.DrafterProposeMs = float64(dt.Propose.Nanoseconds()) / 1e6 / float64(n)
		res.DrafterObserveMs = float64(dt.Observe.Nanoseconds()) / 1e6 / float64(n)
		res.DrafterDeviceMsPerStep, res.DrafterRunsPerStep = dt.DeviceMsPerStep(), dt.RunsPerStep()
	}
	return nil
}

// agreeing counts the tokens of got equal to want's, up to the first
// difference (after it the two decode different contexts).
func agreeing(got, want []int32) int {
	n := 0
	for n < len(got) && n < len(want) && got[n] == want[n] {
		n++
	}
	return n
}
