package attrib

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const good = `
name: t
model: {preset: tiny}
arms: {baseline: true, all: true, leave_one_out: true, add_one_in: true}
passes:
  - name: p1
  - name: p2
workloads:
  - {name: w, input_len: 4, output_len: 3, requests: 5, concurrency: [2, 1], seed: 1}
repetitions: 3
warmup: 1
`

func known(n string) bool { return n == "p1" || n == "p2" }

func TestStudyErrorsNameFileAndField(t *testing.T) {
	cases := map[string]string{
		"unknown pass":           strings.Replace(good, "name: p2", "name: p3", 1),
		"unknown workload field": strings.Replace(good, "seed: 1}", "seed: 1, inputlen: 3}", 1),
		"empty arm list":         strings.Replace(good, "arms: {baseline: true, all: true, leave_one_out: true, add_one_in: true}", "arms: {}", 1),
		"bad concurrency":        strings.Replace(good, "[2, 1]", "[0]", 1),
		"no workloads":           strings.Replace(good, "  - {name: w, input_len: 4, output_len: 3, requests: 5, concurrency: [2, 1], seed: 1}", "", 1) + "\n",
		"pass twice in an arm":   strings.Replace(good, "add_one_in: true}", "add_one_in: true, explicit: [{name: twice, passes: [{name: p1}, {name: p2}, {name: p1}]}]}", 1),
		"quoted number":          strings.Replace(good, "repetitions: 3", `repetitions: "3"`, 1),
		"rounds that wrap":       strings.Replace(good, "repetitions: 3", "repetitions: 9223372036854775807", 1),
		"start timeout":          good + "serving: {start_timeout_s: 9223372036854775807}\n",
	}
	want := map[string]string{
		"unknown pass":           `passes[1].name: unknown pass "p3"`,
		"unknown workload field": "inputlen",
		"empty arm list":         "arms: the arm list is empty",
		"bad concurrency":        "workloads[0].concurrency[0]",
		"no workloads":           "workloads",
		"pass twice in an arm":   `arms.explicit[0].passes[2].name: "p1" is listed twice in arm "twice" (also passes[0])`,
		"quoted number":          `repetitions`,
		"rounds that wrap":       "rounds in all at most",
		"start timeout":          "serving.start_timeout_s: must be in [0, 86400]",
	}
	for name, src := range cases {
		_, err := Parse([]byte(src), "s.yaml", known)
		require.Error(t, err, name)
		require.Contains(t, err.Error(), "s.yaml", name)
		require.Contains(t, err.Error(), want[name], name)
	}
	s, err := Parse([]byte(good), "s.yaml", known)
	require.NoError(t, err)
	arms, err := s.Expand()
	require.NoError(t, err)
	var names []string
	for _, a := range arms {
		names = append(names, a.Name)
	}
	require.Equal(t, []string{"baseline", AAName, "all", "-p1", "-p2", "+p1", "+p2"}, names)
	require.Equal(t, []string{"w C1", "w C2"}, []string{s.Cells()[0].Name(), s.Cells()[1].Name()})
}

// fakeRunner: output tokens are the prompt's first tokens; arm "+p1" is
// twice as fast and "-p2" changes one request's tokens (a parity failure).
type fakeRunner struct {
	order []string
}

func (f *fakeRunner) Prepare(context.Context, Arm) error { return nil }
func (f *fakeRunner) Info(a Arm) ArmInfo {
	var fired []string
	for _, p := range a.Passes {
		fired = append(fired, p.Name)
	}
	return ArmInfo{ConfigHash: "h", Fired: fired}
}
func (f *fakeRunner) Close() error { return nil }
func (f *fakeRunner) RunCell(ctx context.Context, a Arm, c Cell, prompts [][]int32) (*CellResult, error) {
	f.order = append(f.order, a.Name)
	wall := time.Second
	if a.Name == "+p1" || a.Name == "all" {
		wall = time.Second / 2 // twice the throughput
	}
	cr := &CellResult{Wall: wall}
	for i, p := range prompts {
		rr := RequestResult{TTFT: wall / 10, E2E: wall / 2, ITL: []time.Duration{wall / 20, wall / 20}}
		for j := 0; j < c.Workload.OutputLen; j++ {
			rr.Tokens = append(rr.Tokens, p[j%len(p)])
		}
		if a.Name == "-p2" && i == 0 {
			rr.Tokens[0]++
		}
		cr.Requests = append(cr.Requests, rr)
	}
	return cr, nil
}

func TestDriveRunsEveryRequestOnce(t *testing.T) {
	prompts := [][]int32{{1, 2}, {3, 4}, {5, 6}, {7, 8}, {9, 10}}
	gen := func(ctx context.Context, p []int32, n int, on func([]int32)) error {
		on([]int32{p[0]})
		on([]int32{p[1], p[0]})
		return nil
	}
	res := Drive(context.Background(), gen, prompts, 3, 3)
	require.Len(t, res.Requests, 5)
	for i, rr := range res.Requests {
		require.Equal(t, []int32{prompts[i][0], prompts[i][1], prompts[i][0]}, rr.Tokens)
		require.Len(t, rr.ITL, 2)
		require.Empty(t, rr.Err)
	}
}

func TestRunPairsRoundsAndSummarizes(t *testing.T) {
	s, err := Parse([]byte(good), "s.yaml", known)
	require.NoError(t, err)
	fr := &fakeRunner{}
	var progress []string
	res, err := Run(context.Background(), s, Options{Runner: fr, Vocab: 50, Progress: func(d, tot int, l string) { progress = append(progress, fmt.Sprint(d, "/", tot)) }})
	require.NoError(t, err)
	require.Len(t, progress, 4*2*7)
	// interleaving: round 0 forward, round 1 reversed
	require.Equal(t, "baseline", fr.order[0])
	require.Equal(t, AAName, fr.order[1])
	require.Equal(t, "+p2", fr.order[14])
	require.Len(t, res.Rows, 3*2*7)
	require.Equal(t, StopFixed, res.Stop)
	require.Equal(t, map[string]int{"w C1": 3, "w C2": 3}, res.CellRounds)
	sum := res.Summarize()
	require.InDelta(t, 1.0, sum.PerCell["+p1"]["w C1"].Gap, 1e-9)
	require.Equal(t, VerdictGain, sum.PerCell["+p1"]["w C1"].Interval.Verdict)
	require.InDelta(t, 0.0, sum.PerCell["+p2"]["w C2"].Gap, 1e-9)
	require.Equal(t, VerdictTie, sum.PerCell["+p2"]["w C2"].Interval.Verdict)
	require.NotNil(t, sum.NoiseFloor)
	require.Empty(t, sum.NoiseFloor.Excluded)
	require.True(t, sum.NoiseFloor.Geo.Tie())
	for _, c := range sum.Contributions {
		if c.Pass == "p1" {
			require.InDelta(t, 1.0, c.GeoAddOneIn.Effect(), 1e-9)
			require.InDelta(t, 1.0, c.GeoLeaveOneOut.Effect(), 1e-9) // all (fast) over all-without-p1 (slow)
		}
	}
	require.Positive(t, sum.ParityTotal)
	for _, as := range sum.Arms {
		if as.Arm == "-p2" {
			require.Equal(t, 3*2, as.Parity) // one request per cell per round
		} else {
			require.Zero(t, as.Parity, as.Arm)
		}
	}
	var b strings.Builder
	res.Console(&b, sum)
	require.Contains(t, b.String(), "PARITY FAILURE")
	files, _, err := res.WriteAll(t.TempDir())
	require.NoError(t, err)
	require.Len(t, files, 7) // results, intervals, summary, report, three charts

	// parity: report counts the differences beside the A/A arm's instead
	// of failing
	s.Parity = ParityReport
	sum = res.Summarize()
	require.Equal(t, 3*2, sum.ParityTotal)
	require.Zero(t, sum.ParityAA)
	require.Equal(t, 3*2*5*(len(res.Arms)-1), sum.ParityRequests) // 5 requests per cell, 2 cells, 3 rounds
	b.Reset()
	res.Console(&b, sum)
	require.NotContains(t, b.String(), "PARITY FAILURE")
	require.Contains(t, b.String(), "6 of ")
	require.Contains(t, b.String(), "the A/A arm, the baseline's own configuration, 0 of 30")
}

// Study files come from users: parsing (and expanding what parses) never
// panics, whatever the bytes.
func FuzzParseStudy(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte(strings.Replace(good, "arms: {baseline: true, all: true, leave_one_out: true, add_one_in: true}", "arms: {}", 1)))
	f.Add([]byte(strings.Replace(good, "repetitions: 3", "adaptive: {target_half_width: 0.01, min_rounds: 3, max_rounds: 9, max_seconds: 60}", 1)))
	f.Add([]byte(strings.Replace(good, "concurrency: [2, 1]", "concurrency: [2, 1], requests_per_level: [4, 1]", 1) + "device: cuda\nprecision: bf16\ncuda: {graph_max_tokens: 32}\n"))
	for _, p := range []string{"../../configs/studies/quick.yaml", "../../configs/studies/campaign.yaml", "../../configs/studies/campaign-h200.yaml"} {
		b, err := os.ReadFile(p)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Parse(b, "fuzz.yaml", known)
		if err != nil {
			require.Contains(t, err.Error(), "fuzz.yaml")
			return
		}
		if _, err := s.Expand(); err == nil {
			_ = s.Cells()
		}
	})
}

// failingRunner fails one request of every cell of arm "all".
type failingRunner struct {
	fakeRunner
	cells int
}

func (f *failingRunner) RunCell(ctx context.Context, a Arm, c Cell, prompts [][]int32) (*CellResult, error) {
	f.cells++
	cr, err := f.fakeRunner.RunCell(ctx, a, c, prompts)
	if a.Name == "all" {
		cr.Requests[1].Err = "max_tokens: prompt (4 tokens) + max_tokens (3) exceed the context limit 5"
		cr.Requests[1].Tokens = nil
	}
	return cr, err
}

// A failed request fails the study, naming the arm, the cell and the
// request; no parity or speed is reported from it.
func TestFailedRequestFailsTheStudy(t *testing.T) {
	s, err := Parse([]byte(good), "s.yaml", known)
	require.NoError(t, err)
	fr := &failingRunner{}
	_, err = Run(context.Background(), s, Options{Runner: fr, Vocab: 50})
	require.ErrorContains(t, err, "arm all, cell w C1, round 1: 1 of 5 requests failed (request 1: max_tokens")
}

// A study is validated entirely before anything runs: sizes are bounded
// and every request must fit the model's context.
func TestStudyBoundsAndModelCheck(t *testing.T) {
	for field, repl := range map[string][2]string{
		"workloads[0].requests":       {"requests: 5", "requests: 1000000000"},
		"workloads[0].input_len":      {"input_len: 4", "input_len: 1000000000"},
		"workloads[0].output_len":     {"output_len: 3", "output_len: 1000000000"},
		"workloads[0].concurrency[1]": {"[2, 1]", "[2, 100000000]"},
		"prompt tokens":               {"input_len: 4, output_len: 3, requests: 5", "input_len: 100000, output_len: 3, requests: 100000"},
		"rounds":                      {"repetitions: 3", "repetitions: 100000"},
	} {
		_, err := Parse([]byte(strings.Replace(good, repl[0], repl[1], 1)), "s.yaml", known)
		require.ErrorContains(t, err, field)
	}
	s, err := Parse([]byte(good), "s.yaml", known)
	require.NoError(t, err)
	require.NoError(t, s.CheckModel(50, 7))
	require.ErrorContains(t, s.CheckModel(50, 6), "s.yaml: workloads[0] (w): input_len 4 + output_len 3 exceed the model's context limit 6")
}

// The destination is checked first: an earlier run's directory is refused
// (never mixed, its files untouched), an unwritable one too; files appear
// all at once, and a failed run leaves nothing.
func TestOutputIsCheckedFirstAndWrittenAtomically(t *testing.T) {
	d := t.TempDir()
	old := d + "/old"
	require.NoError(t, os.MkdirAll(old, 0o755))
	require.NoError(t, os.WriteFile(old+"/contributions-leave-one-out.png", []byte("x"), 0o644))
	_, err := PrepareOutput(old)
	require.ErrorContains(t, err, "already holds 1 entries")
	if os.Getuid() != 0 { // root writes anywhere
		ro := d + "/ro"
		require.NoError(t, os.MkdirAll(ro, 0o555))
		_, err = PrepareOutput(ro + "/out")
		require.ErrorContains(t, err, "not writable")
	}
	_, err = PrepareOutput(old + "/contributions-leave-one-out.png/x")
	require.Error(t, err)

	s, err := Parse([]byte(good), "s.yaml", known)
	require.NoError(t, err)
	res, err := Run(context.Background(), s, Options{Runner: &fakeRunner{}, Vocab: 50})
	require.NoError(t, err)
	o, err := PrepareOutput(d + "/new")
	require.NoError(t, err)
	_, err = os.Stat(d + "/new")
	require.True(t, os.IsNotExist(err), "nothing appears before the commit")
	files, _, err := o.Commit(res)
	require.NoError(t, err)
	require.Len(t, files, 7)
	for _, f := range files {
		require.FileExists(t, f)
	}
	ents, _ := os.ReadDir(d)
	require.Len(t, ents, 2, "no staging folder left: old and new")

	o, err = PrepareOutput(d + "/failed")
	require.NoError(t, err)
	o.Abort()
	ents, _ = os.ReadDir(d)
	require.Len(t, ents, 2, "an aborted run leaves nothing")
}

// A study can name a scaled preset in the FP8 layout (the gpu campaign's
// model); fp8 and set apply to presets only.
func TestStudyModelScaledPreset(t *testing.T) {
	src := strings.Replace(good, "model: {preset: tiny}", "model: {preset: tiny, fp8: true, set: {n_routed_experts: 16}}", 1)
	s, err := Parse([]byte(src), "s.yaml", known)
	require.NoError(t, err)
	require.True(t, s.Model.FP8)
	require.EqualValues(t, 16, s.Model.Set["n_routed_experts"])
	_, err = Parse([]byte(strings.Replace(good, "model: {preset: tiny}", "model: {dir: x, set: {n_routed_experts: 16}}", 1)), "s.yaml", known)
	require.ErrorContains(t, err, "model: fp8 and set apply to a preset")
	_, err = Parse([]byte(good+"parity: loose\n"), "s.yaml", known)
	require.ErrorContains(t, err, "parity: must be exact or report")
}
