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
