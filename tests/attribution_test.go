//go:build !race

// The quick study is a full engine-level attribution run (~20 s); under the
// race detector the attribution machinery is covered by core/attrib's own
// tests instead.

package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/glmflash/glmflash/core/attrib"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
	"github.com/stretchr/testify/require"
)

// The shipped quick study runs end to end and its outputs have the right
// shape: every arm present on every cell, parity 0, positive numbers, fired
// passes recorded, report and charts written.
func TestQuickStudy(t *testing.T) {
	st, err := attrib.Load(filepath.Join("..", "configs", "studies", "quick.yaml"), nil)
	require.NoError(t, err)
	cfg, err := randckpt.Preset(st.Model.Preset)
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "ck")
	require.NoError(t, randckpt.Write(dir, cfg, randckpt.Options{Seed: st.Model.Seed}))
	ck, err := model.Open(dir)
	require.NoError(t, err)
	defer ck.Close()
	runner := attrib.NewEngineRunner(st, ck.Config(), ck, ck, nil)
	defer runner.Close()
	res, err := attrib.Run(context.Background(), st, attrib.Options{Runner: runner, Vocab: cfg.VocabSize, Provenance: attrib.Provenance{Commit: "test"}})
	require.NoError(t, err)
	out := t.TempDir()
	files, sum, err := res.WriteAll(out)
	require.NoError(t, err)
	require.Len(t, files, 7) // results and intervals (jsonl), summary, report, three charts

	arms, _ := st.Expand()
	require.Len(t, arms, 1+1+1+5+5+1) // baseline, A/A, all, leave-one-out, add-one-in, explicit
	cells := st.Cells()
	require.Len(t, cells, 4)
	require.Len(t, res.Rows, len(arms)*len(cells)*st.Repetitions)
	require.Zero(t, sum.ParityTotal)
	for _, a := range arms {
		for _, c := range cells {
			cs := sum.PerCell[a.Name][c.Name()]
			require.NotNil(t, cs, "%s %s", a.Name, c.Name())
			require.Positive(t, cs.TokensPerS.Median)
			require.Positive(t, cs.TTFTP50Ms.Median)
			require.Positive(t, cs.E2EP50Ms.Median)
			require.Positive(t, cs.Ratio.Median)
			require.Equal(t, st.Repetitions, cs.Rounds)
			if a.Kind != attrib.KindBaseline {
				require.True(t, cs.Interval.Defined(), "%s %s: an interval from %d rounds", a.Name, c.Name(), cs.Rounds)
				require.Contains(t, []string{attrib.VerdictGain, attrib.VerdictLoss, attrib.VerdictTie}, cs.Interval.Verdict)
			}
			require.Zero(t, cs.Errors)
		}
	}
	fired := map[string][]string{}
	for _, as := range sum.Arms {
		fired[as.Arm] = as.Fired
	}
	require.Empty(t, fired["baseline"])
	require.Contains(t, fired["all"], "kda-projection-fusion")
	require.Equal(t, []string{"mhc-post-pre-fusion"}, fired["+mhc-post-pre-fusion"])
	require.NotContains(t, fired["-dsa-pooled-metadata"], "dsa-pooled-metadata")
	require.Len(t, sum.Contributions, 5)

	// JSONL: one row per measurement with provenance
	f, err := os.Open(filepath.Join(out, "results.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		var row attrib.Row
		require.NoError(t, json.Unmarshal(sc.Bytes(), &row))
		require.Equal(t, "test", row.Commit)
		require.NotEmpty(t, row.ConfigHash)
		require.Positive(t, row.TokensPerS)
		n++
	}
	require.Equal(t, len(res.Rows), n)
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	require.NoError(t, err)
	require.Contains(t, string(md), "## Per-pass contributions")
	require.Contains(t, string(md), "## Noise floor (A/A)")
	require.Contains(t, string(md), "0 mismatches")
	require.NotNil(t, sum.NoiseFloor)
	require.FileExists(t, filepath.Join(out, "intervals.jsonl"))
	require.FileExists(t, filepath.Join(out, "gaps.png"))
}

// The H200 campaign study is the six-cell shape with every arm, the A/A
// arm and adaptive rounds on the CUDA device; shrunk to the tiny preset on
// the CPU (the same file, sizes cut), it runs end to end: adaptive stops
// and says why, every cell of every arm has an interval, the A/A arm is
// reported, and every output is written.
func TestH200CampaignShrunkOnCPU(t *testing.T) {
	st, err := attrib.Load(filepath.Join("..", "configs", "studies", "campaign-h200.yaml"), nil)
	require.NoError(t, err)
	require.Equal(t, "cuda", st.Device)
	require.Equal(t, "bench", st.Model.Preset)
	require.NotNil(t, st.Adaptive)
	cells := st.Cells()
	require.Len(t, cells, 6)
	require.Equal(t, []int{4, 16, 32}, []int{cells[0].Requests, cells[1].Requests, cells[2].Requests})
	arms, err := st.Expand()
	require.NoError(t, err)
	require.Len(t, arms, 13)
	require.Equal(t, attrib.AAName, arms[1].Name)
	for _, p := range st.Passes {
		if p.Name == "prefill-autotune" {
			require.Equal(t, true, p.Options["tune_at_start"])
		}
	}

	// shrunk: the tiny preset on the CPU, two-token outputs, a 2-round cap
	st.Model.Preset, st.Device = "tiny", ""
	for i := range st.Workloads {
		st.Workloads[i].InputLen, st.Workloads[i].OutputLen = 6*(i+1), 2
		st.Workloads[i].Requests, st.Workloads[i].Concurrency, st.Workloads[i].RequestsPerLevel = 4, []int{1, 2, 4}, []int{1, 2, 4}
	}
	for i := range st.Passes {
		if st.Passes[i].Name == "prefill-autotune" {
			st.Passes[i].Options = map[string]any{"tune_at_start": true, "table_dir": t.TempDir(), "buckets": []int{1, 8}, "reps": 1}
		}
	}
	st.Adaptive.MinRounds, st.Adaptive.MaxRounds, st.Adaptive.MaxSeconds, st.Repetitions = 2, 2, 0, 2
	cfg, err := randckpt.Preset(st.Model.Preset)
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "ck")
	require.NoError(t, randckpt.Write(dir, cfg, randckpt.Options{Seed: st.Model.Seed}))
	ck, err := model.Open(dir)
	require.NoError(t, err)
	defer ck.Close()
	runner := attrib.NewEngineRunner(st, ck.Config(), ck, ck, nil)
	defer runner.Close()
	res, err := attrib.Run(context.Background(), st, attrib.Options{Runner: runner, Vocab: cfg.VocabSize, Provenance: attrib.Provenance{Commit: "test"}})
	require.NoError(t, err)
	require.Contains(t, []string{attrib.StopTarget, attrib.StopMaxRounds}, res.Stop)
	out := t.TempDir()
	files, sum, err := res.WriteAll(out)
	require.NoError(t, err)
	require.Len(t, files, 7)
	require.Zero(t, sum.ParityTotal)
	require.NotNil(t, sum.NoiseFloor)
	require.False(t, sum.Device, "no device counters on the CPU")
	for _, a := range arms {
		for _, c := range st.Cells() {
			cs := sum.PerCell[a.Name][c.Name()]
			require.Equal(t, res.CellRounds[c.Name()], cs.Rounds)
			if a.Kind != attrib.KindBaseline {
				require.True(t, cs.Interval.Defined(), "%s %s", a.Name, c.Name())
			}
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	require.NoError(t, err)
	require.Contains(t, string(md), "## Rounds")
	require.Contains(t, string(md), "adaptive: target ±1%")
}
