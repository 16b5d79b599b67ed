package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/bench"
	"github.com/stretchr/testify/require"
)

// --speculative METHOD[:STEPS|:PRESET] sets the speculative section's keys;
// malformed values are refused naming the flag.
func TestSpeculativeFlag(t *testing.T) {
	for v, want := range map[string]string{"off": "off", "mtp": "mtp 5-1-6", "mtp:3": "mtp 3-1-4", "mtp:1-1-2": "mtp 1-1-2"} {
		fl, err := speculativeFlags(v)
		require.NoError(t, err, v)
		mf := &modelFlags{extra: fl}
		c, err := mf.config()
		require.NoError(t, err, v)
		require.Equal(t, want, c.Speculative.String(), v)
	}
	for _, v := range []string{"off:3", "mtp:x"} {
		_, err := speculativeFlags(v)
		require.ErrorContains(t, err, "--speculative", v)
	}
	fl, err := speculativeFlags("eagle:2")
	require.NoError(t, err)
	_, err = (&modelFlags{extra: fl}).config()
	require.ErrorContains(t, err, "speculative.method (flag --speculative)")
}

// bench --speculative mtp:N --spec-accept … --spec-accept-len …: plain
// decoding, the MTP drafter, and the MTP drafter pinned (the default
// --spec-drafter with --speculative) at each rate and length through the
// scheduler, with their acceptance lengths (exactly num_steps+1 at rate 1),
// tokens per trunk pass, speed-up over plain decoding and the drafter's
// time per verify step; greedy outputs are checked against plain
// decoding's inside bench. --spec-drafter scripted measures the test
// drafter alone.
func TestBenchSpeculative(t *testing.T) {
	d := t.TempDir()
	out, err := runCLI(t, "bench", "--preset", "tiny-mtp", "--cache-dir", d, "--speculative", "mtp:3", "--spec-accept", "1.0,0.5", "--spec-accept-len", "3",
		"--prompt", "8", "--decode-steps", "12", "--batch", "1,2", "--reps", "1", "--warmup", "0", "--json", d+"/b.json")
	require.NoError(t, err)
	require.Contains(t, out, "spec     mtp 3-1-4")
	require.Contains(t, out, "pinned   the configured drafter runs")
	got := benchSeries(t, d+"/b.json")
	for _, B := range []int{1, 2} {
		plain, ok := got[fmt.Sprintf("sched decode batch %d plain", B)]
		require.True(t, ok, out)
		require.Positive(t, plain.TokensPerSec)
		mtp := got[fmt.Sprintf("sched decode batch %d mtp 3-1-4", B)]
		require.GreaterOrEqual(t, mtp.AcceptanceLength, 1.0, out)
		require.Positive(t, mtp.SpeedUp)
		require.Positive(t, mtp.DrafterMsPerStep)
		full := got[fmt.Sprintf("sched decode batch %d mtp 3-1-4 pinned at 1.00", B)]
		require.Equal(t, 4.0, full.AcceptanceLength, out)
		require.Equal(t, 4.0, full.ExpectedLength)
		require.Equal(t, 1.0, full.AcceptRate)
		require.Equal(t, 1.0, full.ChainRate)
		require.InDelta(t, 4.0, full.TokensPerPass, 1.0, out) // requests of a batch finish together but for the last partial span
		require.Positive(t, full.DrafterRunsPerStep, "the MTP drafter's programs ran")
		half := got[fmt.Sprintf("sched decode batch %d mtp 3-1-4 pinned at 0.50", B)]
		require.Equal(t, 1.875, half.ExpectedLength)
		require.Greater(t, half.AcceptanceLength, 1.0)
		require.Less(t, half.AcceptanceLength, 4.0)
		var byLen bench.Series
		for name, s := range got {
			if strings.HasPrefix(name, fmt.Sprintf("sched decode batch %d mtp 3-1-4 pinned at length 3.00 (rate 0.", B)) {
				byLen = s
			}
		}
		require.Equal(t, 3.0, byLen.TargetLength, out)
		require.InDelta(t, 3.0, byLen.ExpectedLength, 1e-9)
	}
	require.Contains(t, out, "acceptance length 4.00 (expected 4.00)")
	require.Contains(t, out, "ms host wall per verify step")

	out, err = runCLI(t, "bench", "--preset", "tiny-mtp", "--cache-dir", d, "--speculative", "mtp:3", "--spec-accept", "1.0", "--spec-drafter", "scripted",
		"--prompt", "8", "--decode-steps", "8", "--batch", "1", "--reps", "1", "--warmup", "0", "--json", d+"/s.json")
	require.NoError(t, err)
	require.Contains(t, out, "pinned   the test drafter alone")
	s, ok := benchSeries(t, d+"/s.json")["sched decode batch 1 test drafter 3-1-4 at 1.00"]
	require.True(t, ok, out)
	require.Equal(t, 4.0, s.ExpectedLength)
	require.Zero(t, s.DrafterRunsPerStep, "the test drafter runs no program")
}

// benchSeries reads a bench JSON report's series by name.
func benchSeries(t *testing.T, path string) map[string]bench.Series {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var res struct {
		Results []bench.Series `json:"results"`
	}
	require.NoError(t, json.Unmarshal(b, &res))
	got := map[string]bench.Series{}
	for _, r := range res.Results {
		got[r.Name] = r
	}
	return got
}
