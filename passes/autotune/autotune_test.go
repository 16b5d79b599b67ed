package autotune_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/pass/passtest"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/passes/autotune"
	"github.com/stretchr/testify/require"
)

// fixedTable writes a tuning table with the same parameters for every GEMM
// shape of cfg's decode graph (deterministic, unlike a measured one).
func fixedTable(t *testing.T, cfg *model.Config) string {
	t.Helper()
	dir := t.TempDir()
	g, err := graph.Build(cfg, graph.Options{Mode: graph.Decode, Logits: graph.LastLogits})
	require.NoError(t, err)
	tb := &autotune.Table{CPU: "test-cpu"}
	for _, n := range g.Nodes {
		if gemm := n.Def().GEMM; gemm != nil {
			s := gemm(n)
			for i, b := range []int{1, 8, 64, 512} {
				tb.Put(autotune.Entry{Op: "gemm", DType: "bf16", N: s.N, K: s.K, Bucket: b, ColGrain: 4 << i, RowBlock: 16 << i})
			}
		}
	}
	require.NoError(t, tb.Save(dir))
	return dir
}

func request(dir string) []pass.Request {
	return []pass.Request{{Name: autotune.Name, Options: map[string]any{"table_dir": dir, "cpu": "test-cpu"}}}
}

// The rewrite of the tiny model's decode graph (tuned attributes on every
// GEMM), as IR text.
func TestGoldenIR(t *testing.T) {
	cfg := passtest.TinyA(t).Checkpoint.Config()
	g, _, _ := passtest.Explain(t, cfg, graph.Decode, request(fixedTable(t, cfg)), nil)
	passtest.Golden(t, "testdata/tiny-a.decode.golden", g.Text())
}

// One site per GEMM shape and bucket; every GEMM-trait node is tuned, and
// the other kernel ops are named in one skipped site.
func TestFiresPerShapeAndBucket(t *testing.T) {
	for _, dir := range passtest.Fixtures(t) {
		cfg := passtest.OpenFixture(t, dir).Checkpoint.Config()
		g, rep, _ := passtest.Explain(t, cfg, graph.Decode, request(fixedTable(t, cfg)), nil)
		shapes := map[[2]int]bool{}
		gemms := 0
		for _, n := range g.Nodes {
			if gemm := n.Def().GEMM; gemm != nil {
				s := gemm(n)
				shapes[[2]int{s.N, s.K}] = true
				gemms++
				require.Equal(t, []int{1, 8, 64, 512}, n.Attrs.Ints(ir.AttrTuneBuckets), "%s node %d", dir, n.ID)
			}
		}
		pr := rep.Find(autotune.Name)
		require.Len(t, pr.Fired, 4*len(shapes), dir)
		require.Equal(t, int64(gemms), pr.Stats[1].Value, dir)
		require.Len(t, pr.Skipped, 1, dir)
		require.Equal(t, "ops without the GEMM trait", pr.Skipped[0].Where)
		require.Contains(t, pr.Skipped[0].Reason, "no tunable kernel: add, dsa_meta, dsa_topk, embed")
	}
}

// A bucket without an entry keeps the defaults while tuning at start is
// off; nothing is written.
func TestNoEntryIsReported(t *testing.T) {
	cfg := passtest.TinyA(t).Checkpoint.Config()
	empty := t.TempDir()
	g, rep, before := passtest.Explain(t, cfg, graph.Decode, request(empty), nil)
	pr := rep.Find(autotune.Name)
	require.Empty(t, pr.Fired)
	require.Contains(t, pr.Skipped[len(pr.Skipped)-1].Reason, "no tuning entry for this bucket and tune_at_start is off")
	require.Equal(t, before, g.Text())
	files, _ := os.ReadDir(empty)
	require.Empty(t, files)
}

// A tuning table persisted by one start is loaded by the next, and gives the
// same graph (deterministic given a table); a malformed one is a skipped
// site, not a crash.
func TestTablePersistsAndReloads(t *testing.T) {
	cfg := passtest.TinyA(t).Checkpoint.Config()
	dir := t.TempDir()
	req := []pass.Request{{Name: autotune.Name, Options: map[string]any{"tune_at_start": true, "table_dir": dir, "buckets": []int{1, 64}, "reps": 1, "cpu": "unit"}}}
	g1, rep1, _ := passtest.Explain(t, cfg, graph.Prefill, req, nil)
	pr := rep1.Find(autotune.Name)
	require.NotEmpty(t, pr.Fired)
	require.Equal(t, int64(len(pr.Fired)), pr.Stats[0].Value, "every site was measured")
	files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	require.Len(t, files, 1)
	req[0].Options["tune_at_start"] = false
	g2, rep2, _ := passtest.Explain(t, cfg, graph.Prefill, req, nil)
	require.Equal(t, len(pr.Fired), len(rep2.Find(autotune.Name).Fired))
	require.Zero(t, rep2.Find(autotune.Name).Stats[0].Value)
	require.Equal(t, g1.Text(), g2.Text())
	require.NoError(t, os.WriteFile(files[0], []byte("{not json"), 0o644))
	_, rep3, _ := passtest.Explain(t, cfg, graph.Prefill, req, nil)
	require.Contains(t, rep3.Find(autotune.Name).Skipped[0].Reason, "tuning table")
}

// Options are checked when the pass is configured.
func TestOptionsAreValidated(t *testing.T) {
	for opts, want := range map[*map[string]any]string{
		{"buckets": []int{}}:   "option buckets must not be empty",
		{"buckets": []int{0}}:  "option buckets: 0 is not a positive token count",
		{"reps": 0}:            "option reps must be ≥ 1",
		{"tolerance": "small"}: "option tolerance: want float",
	} {
		_, err := pass.NewPipeline([]pass.Request{{Name: autotune.Name, Options: *opts}}, true)
		require.ErrorContains(t, err, want)
	}
}

// The conformance suite (with a fixed table; an empty one is ineligible).
func TestConformance(t *testing.T) {
	f := passtest.TinyA(t)
	passtest.Run(t, f, passtest.Subject{Name: autotune.Name, Options: map[string]any{"table_dir": fixedTable(t, f.Checkpoint.Config()), "cpu": "test-cpu"},
		Ineligible: passtest.Ineligibility{Options: map[string]any{"table_dir": t.TempDir(), "tune_at_start": false}}})
}
