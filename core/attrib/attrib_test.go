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
	}
	want := map[string]string{
		"unknown pass":           `passes[1].name: unknown pass "p3"`,
		"unknown workload field": "inputlen",
		"empty arm list":         "arms: the arm list is empty",
		"bad concurrency":        "workloads[0].concurrency[0]",
		"no workloads":           "workloads",
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
	require.Equal(t, []string{"baseline", "all", "-p1", "-p2", "+p1", "+p2"}, names)
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
	require.Len(t, progress, 4*2*6)
	// interleaving: round 0 forward, round 1 reversed
	require.Equal(t, "baseline", fr.order[0])
	require.Equal(t, "+p2", fr.order[12])
	require.Len(t, res.Rows, 3*2*6)
	sum := res.Summarize()
	require.InDelta(t, 1.0, sum.PerCell["+p1"]["w C1"].Gap, 1e-9)
	require.InDelta(t, 0.0, sum.PerCell["+p2"]["w C2"].Gap, 1e-9)
	for _, c := range sum.Contributions {
		if c.Pass == "p1" {
			require.InDelta(t, 1.0, c.GeoAddOneIn, 1e-9)
			require.InDelta(t, 1.0, c.GeoLeaveOneOut, 1e-9) // all (fast) over all-without-p1 (slow)
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
	require.Len(t, files, 5)
}

// Study files come from users: parsing (and expanding what parses) never
// panics, whatever the bytes.
func FuzzParseStudy(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte(strings.Replace(good, "arms: {baseline: true, all: true, leave_one_out: true, add_one_in: true}", "arms: {}", 1)))
	for _, p := range []string{"../../configs/studies/quick.yaml", "../../configs/studies/campaign.yaml"} {
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
