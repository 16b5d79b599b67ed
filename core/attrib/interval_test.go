package attrib

import (
	"context"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// pairedRounds simulates n paired rounds of a reference and an arm that
// is effect faster: both share a per-round drift (the machine's state),
// each measurement has its own noise sigma.
func pairedRounds(r *rand.Rand, n int, effect, drift, sigma float64) (arm, ref []float64) {
	for range n {
		d := 1 + drift*r.NormFloat64()
		ref = append(ref, 100*d*(1+sigma*r.NormFloat64()))
		arm = append(arm, 100*(1+effect)*d*(1+sigma*r.NormFloat64()))
	}
	return arm, ref
}

// A 2% effect under 0.5% measurement noise and 5% drift between rounds is
// found: its interval excludes 1 and contains 1.02, with a bootstrap (12
// rounds) and with the t-interval (4 rounds).
func TestIntervalFindsTwoPercentEffect(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{12, 4} {
		arm, ref := pairedRounds(r, n, 0.02, 0.05, 0.005)
		iv := PairedInterval(LogRatios(arm, ref), Seed("two", "percent"))
		t.Logf("%d rounds: %s (%s)", n, iv, iv.Method)
		require.Equal(t, VerdictGain, iv.Verdict, "%d rounds", n)
		require.Greater(t, iv.Lo, 1.0)
		require.LessOrEqual(t, iv.Lo, 1.02)
		require.GreaterOrEqual(t, iv.Hi, 1.02)
		want := MethodBootstrap
		if n < MinBootstrapRounds {
			want = MethodT
		}
		require.Equal(t, want, iv.Method)
	}
}

// An A/A comparison (no effect) is a tie.
func TestAAIsATie(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{12, 5} {
		arm, ref := pairedRounds(r, n, 0, 0.05, 0.005)
		iv := PairedInterval(LogRatios(arm, ref), Seed("aa"))
		require.Equal(t, VerdictTie, iv.Verdict, "%d rounds: %s", n, iv)
		require.True(t, iv.Tie())
		require.Contains(t, iv.String(), "tie")
	}
}

// The intervals cover the true ratio about 95% of the time, bootstrap and
// t alike (400 simulated comparisons each, at 12 and 4 rounds).
func TestIntervalCoverage(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{12, 4} {
		covered := 0
		const trials = 400
		for i := range trials {
			arm, ref := pairedRounds(r, n, 0.03, 0.05, 0.01)
			iv := PairedInterval(LogRatios(arm, ref), uint64(i))
			if iv.Lo <= 1.03 && 1.03 <= iv.Hi {
				covered++
			}
		}
		frac := float64(covered) / trials
		t.Logf("%d rounds: coverage %.3f", n, frac)
		require.GreaterOrEqual(t, frac, 0.92, "%d rounds", n)
		require.LessOrEqual(t, frac, 0.98, "%d rounds", n)
	}
}

// The bootstrap is a function of its data and seed.
func TestBootstrapIsDeterministic(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	arm, ref := pairedRounds(r, 12, 0.01, 0.02, 0.01)
	d := LogRatios(arm, ref)
	a, b := PairedInterval(d, Seed("x")), PairedInterval(d, Seed("x"))
	require.Equal(t, a, b)
	c := PairedInterval(d, Seed("y"))
	require.Equal(t, a.Ratio, c.Ratio, "the estimate does not depend on the seed")
	require.NotEqual(t, a.Lo, c.Lo, "the resamples do")
	require.InDelta(t, a.Lo, c.Lo, 0.002)
}

// Too few rounds give no interval: neither a tie nor an effect.
func TestTooFewRounds(t *testing.T) {
	iv := PairedInterval([]float64{math.Log(1.5)}, 1)
	require.Equal(t, VerdictTooFew, iv.Verdict)
	require.False(t, iv.Tie())
	require.False(t, iv.Defined())
	require.True(t, math.IsInf(iv.HalfWidth(), 1))
	require.Contains(t, iv.String(), "too few rounds")
	require.Equal(t, VerdictNoSignal, GeoInterval(nil, 1).Verdict)
}

// The geometric mean over cells: its estimate is the mean of the cells'
// log ratios; its interval (joint over rounds) contains the true mean
// effect; with few and unequal rounds the t-interval adds the cells'
// variances.
func TestGeoInterval(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	var cells [][]float64
	for _, eff := range []float64{0.02, 0.04} {
		arm, ref := pairedRounds(r, 10, eff, 0.03, 0.004)
		cells = append(cells, LogRatios(arm, ref))
	}
	g := GeoInterval(cells, 1)
	require.Equal(t, MethodBootstrap, g.Method)
	require.Equal(t, 10, g.Rounds)
	require.InDelta(t, math.Exp((mean(cells[0])+mean(cells[1]))/2), g.Ratio, 1e-12)
	require.Less(t, g.Lo, math.Sqrt(1.02*1.04))
	require.Greater(t, g.Hi, math.Sqrt(1.02*1.04))
	require.Equal(t, VerdictGain, g.Verdict)
	u := GeoInterval([][]float64{cells[0][:3], cells[1][:5]}, 1)
	require.Equal(t, MethodT, u.Method)
	require.Equal(t, 3, u.Rounds)
}

// noisyRunner times each cell as a baseline wall time of one second,
// scaled by a per-round drift, divided by the arm's speed-up, with
// measurement noise (sigma, per cell name).
type noisyRunner struct {
	fakeRunner
	r       *rand.Rand
	drift   []float64
	speedup map[string]float64
	sigma   map[string]float64
	round   map[string]int // calls per arm and cell → round index
	sleep   time.Duration
}

func (f *noisyRunner) RunCell(ctx context.Context, a Arm, c Cell, prompts [][]int32) (*CellResult, error) {
	cr, err := f.fakeRunner.RunCell(ctx, a, c, prompts)
	k := a.Name + "|" + c.Name()
	i := f.round[k]
	f.round[k]++
	for len(f.drift) <= i {
		f.drift = append(f.drift, 1+0.05*f.r.NormFloat64())
	}
	sp := f.speedup[a.Name]
	if sp == 0 {
		sp = 1
	}
	cr.Wall = time.Duration(float64(time.Second) * f.drift[i] * (1 + f.sigma[c.Name()]*f.r.NormFloat64()) / sp)
	time.Sleep(f.sleep)
	return cr, err
}

func newNoisy(sigma map[string]float64) *noisyRunner {
	return &noisyRunner{r: rand.New(rand.NewPCG(11, 12)), speedup: map[string]float64{"+p1": 1.02, "all": 1.02}, sigma: sigma, round: map[string]int{}}
}

const adaptiveStudy = `
name: t
model: {preset: tiny}
arms: {baseline: true, all: true, leave_one_out: true, add_one_in: true}
passes: [{name: p1}, {name: p2}]
workloads:
  - {name: w, input_len: 4, output_len: 3, requests: 5, concurrency: [1, 2], seed: 1}
warmup: 1
`

// Adaptive mode stops on the target width (quiet cells stop at
// min_rounds), on the round limit (a noisy cell goes on to max_rounds),
// and on the time limit; the result says which, per cell.
func TestAdaptiveStopping(t *testing.T) {
	parse := func(adaptive string) *Study {
		s, err := Parse([]byte(adaptiveStudy+adaptive), "s.yaml", known)
		require.NoError(t, err)
		return s
	}
	// quiet: 0.2% noise, target ±2% → every cell stops at min_rounds
	s := parse("adaptive: {target_half_width: 0.02, min_rounds: 3, max_rounds: 12}\n")
	res, err := Run(context.Background(), s, Options{Runner: newNoisy(map[string]float64{"w C1": 0.002, "w C2": 0.002}), Vocab: 50})
	require.NoError(t, err)
	require.Equal(t, StopTarget, res.Stop)
	require.Equal(t, map[string]int{"w C1": 3, "w C2": 3}, res.CellRounds)
	sum := res.Summarize()
	require.Equal(t, VerdictGain, sum.PerCell["+p1"]["w C1"].Interval.Verdict)
	require.InDelta(t, 0.02, sum.PerCell["+p1"]["w C1"].Gap, 0.01)
	require.Equal(t, VerdictTie, sum.PerCell["+p2"]["w C1"].Interval.Verdict)
	for _, rec := range res.IntervalRecords(sum) {
		if rec.Cell != "geomean" {
			require.LessOrEqual(t, rec.HalfWidth(), 0.02, "%s on %s", rec.Comparison, rec.Cell)
		}
	}

	// one noisy cell: it runs to the round limit, the quiet one stops early
	res, err = Run(context.Background(), s, Options{Runner: newNoisy(map[string]float64{"w C1": 0.002, "w C2": 0.2}), Vocab: 50})
	require.NoError(t, err)
	require.Equal(t, StopMaxRounds, res.Stop)
	require.Equal(t, map[string]int{"w C1": 3, "w C2": 12}, res.CellRounds)
	require.Equal(t, StopTarget+" after 3 rounds", res.CellStop["w C1"])
	require.Equal(t, StopMaxRounds+" after 12 rounds", res.CellStop["w C2"])
	var b strings.Builder
	res.Console(&b, res.Summarize())
	require.Contains(t, b.String(), "stopped by the round limit")
	require.Contains(t, b.String(), "w C1: 3 rounds (target half-width reached after 3 rounds)")

	// a time limit: rounds take 7 arms × 2 cells × 10 ms; at most 0.5 s
	s = parse("adaptive: {target_half_width: 0.001, min_rounds: 2, max_rounds: 100, max_seconds: 0.5}\n")
	nr := newNoisy(map[string]float64{"w C1": 0.2, "w C2": 0.2})
	nr.sleep = 10 * time.Millisecond
	t0 := time.Now()
	res, err = Run(context.Background(), s, Options{Runner: nr, Vocab: 50})
	require.NoError(t, err)
	require.Equal(t, StopTime, res.Stop)
	require.Less(t, time.Since(t0), 2*time.Second)
	require.GreaterOrEqual(t, res.CellRounds["w C1"], 1)
	require.Less(t, res.CellRounds["w C1"], 100)
}

// New study keys are validated with errors that name them.
func TestAdaptiveAndDeviceKeysValidated(t *testing.T) {
	cases := map[string]string{
		"repetitions: 3\nadaptive: {target_half_width: 0.01, max_rounds: 5}":  "repetitions: not with adaptive",
		"adaptive: {target_half_width: 0, max_rounds: 5}":                     "adaptive.target_half_width",
		"adaptive: {target_half_width: 0.01, min_rounds: 1, max_rounds: 5}":   "adaptive.min_rounds",
		"adaptive: {target_half_width: 0.01, min_rounds: 4, max_rounds: 3}":   "adaptive.max_rounds",
		"adaptive: {target_half_width: 0.01, max_rounds: 5, max_seconds: -1}": "adaptive.max_seconds",
		"adaptive: {target_half_width: 0.01, max_rounds: 5, rounds: 3}":       "rounds",
		"device: tpu":                       `device: "tpu" is not a backend`,
		"precision: fp16":                   "precision: must be fp32 or bf16",
		"cuda: {graph_max_tokens: -2}":      "cuda.graph_max_tokens",
		"cuda: {graph_max_tokens: 2, x: 1}": "x",
	}
	for extra, want := range cases {
		_, err := Parse([]byte(adaptiveStudy+extra+"\n"), "s.yaml", known)
		require.ErrorContains(t, err, want, extra)
		require.ErrorContains(t, err, "s.yaml", extra)
	}
	// precision bf16 runs on the cpu as on cuda
	_, err := Parse([]byte(adaptiveStudy+"precision: bf16\n"), "s.yaml", known)
	require.NoError(t, err)
	for repl, want := range map[string]string{
		"concurrency: [1, 2], requests_per_level: [2], seed: 1":    "workloads[0].requests_per_level: 1 entries for 2 concurrency levels",
		"concurrency: [1, 2], requests_per_level: [2, 9], seed: 1": "workloads[0].requests_per_level[1]: must be in [1, requests = 5], got 9",
		"concurrency: [1, 1], seed: 1":                             "workloads[0].concurrency[1]: level 1 listed twice",
	} {
		_, err := Parse([]byte(strings.Replace(adaptiveStudy, "concurrency: [1, 2], seed: 1", repl, 1)), "s.yaml", known)
		require.ErrorContains(t, err, want)
	}
	s, err := Parse([]byte(strings.Replace(adaptiveStudy, "concurrency: [1, 2], seed: 1", "concurrency: [2, 1], requests_per_level: [4, 1], seed: 1", 1)+
		"device: cpu\nadaptive: {target_half_width: 0.02, max_rounds: 7}\n"), "s.yaml", known)
	require.NoError(t, err)
	require.Equal(t, 3, s.Adaptive.MinRounds, "min_rounds defaults to 3")
	require.Equal(t, 7, s.Repetitions)
	cells := s.Cells()
	require.Equal(t, 1, cells[0].Concurrency)
	require.Equal(t, 1, cells[0].Requests, "requests_per_level follows its level through the sort")
	require.Equal(t, 4, cells[1].Requests)
}
