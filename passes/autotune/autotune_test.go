package autotune_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/passes/autotune"
	"github.com/stretchr/testify/require"
)

// fixedTable writes a tuning table with the same parameters for every GEMM
// shape of cfg's decode graph (deterministic, unlike a measured one).
func fixedTable(t *testing.T, cfg *model.Config, extra ...*ir.Graph) string {
	t.Helper()
	dir := t.TempDir()
	g, err := graph.Build(cfg, graph.Options{Mode: graph.Decode, Logits: graph.LastLogits})
	require.NoError(t, err)
	tb := &autotune.Table{CPU: "test-cpu", ISA: gemm.Impl()}
	var nodes []*ir.Node
	for _, x := range append([]*ir.Graph{g}, extra...) {
		nodes = append(nodes, x.Nodes...)
	}
	for _, n := range nodes {
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
	passtest.Golden(t, "testdata/tiny-a.decode.golden", g.StableText())
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
				require.Equal(t, []int{1, 8, 64, 512}, ir.AttrTuneBuckets.Get(n), "%s node %d", dir, n.ID)
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

// fakeTuner stands in for a device backend's GEMM tuner: two candidates up
// to 64 rows, one beyond; "lt:…" choices at 8 rows, "tiled" elsewhere.
type fakeTuner struct {
	library string
	calls   int
}

func (f *fakeTuner) TunerInfo() ir.TunerInfo {
	return ir.TunerInfo{Device: "cuda", Model: "Fake GPU 9000", Library: f.library}
}
func (f *fakeTuner) GEMMKind(dt string) string { return "f32a-" + strings.ToLower(dt) + "w" }
func (f *fakeTuner) GEMMCandidates(kind string, rows int) []string {
	if rows > 64 {
		return []string{"tiled"}
	}
	return []string{"tiled", "lt"}
}
func (f *fakeTuner) TuneGEMM(t ir.GEMMTune) (ir.GEMMChoice, error) {
	f.calls++
	if t.Rows == 8 {
		return ir.GEMMChoice{Kernel: "lt:" + strings.Repeat("00", 64), Name: "cuBLASLt algo 0", DefaultNs: 10, TunedNs: 5, Measured: 3, Rejected: 1}, nil
	}
	return ir.GEMMChoice{Kernel: "tiled", Name: "tiled", DefaultNs: 10, TunedNs: 10, Measured: 2}, nil
}

// On a device backend the pass measures through the backend's tuner and
// keeps the device model's table (cuda-fake-gpu-9000.json): buckets with
// one candidate are skipped with the reason, measured choices become node
// attributes the backend reads (kernel strings and the kind they were
// measured for), a second start loads them, library choices from another
// library version are re-measured or skipped, and without a tuner nothing
// is chosen.
func TestDeviceTuningTable(t *testing.T) {
	cfg := passtest.TinyA(t).Checkpoint.Config()
	dir := t.TempDir()
	ft := &fakeTuner{library: "cuBLASLt 1"}
	env := func() *pass.Env {
		e := pass.NewEnv(cfg, nil)
		e.Device, e.Tuner = "cuda", ft
		return e
	}
	req := []pass.Request{{Name: autotune.Name, Options: map[string]any{"tune_at_start": true, "table_dir": dir, "buckets": []int{1, 8, 512}, "reps": 1}}}
	g, rep, _ := passtest.Explain(t, cfg, graph.Prefill, req, env())
	pr := rep.Find(autotune.Name)
	require.NotEmpty(t, pr.Fired)
	require.Equal(t, int64(len(pr.Fired)), pr.Stats[0].Value)
	require.Equal(t, len(pr.Fired), ft.calls)
	for _, s := range pr.Skipped {
		require.Contains(t, s.Where, "@ 512 tokens")
		require.Contains(t, s.Reason, "only one kernel (tiled) runs this on Fake GPU 9000: nothing to choose")
	}
	tuned := 0
	for _, n := range g.Nodes {
		if n.Def().GEMM != nil {
			tuned++
			require.Equal(t, []int{1, 8}, ir.AttrTuneBuckets.Get(n))
			require.Equal(t, "tiled;lt:"+strings.Repeat("00", 64), ir.AttrTuneKernels.Get(n))
			require.Equal(t, "f32a-bf16w", ir.AttrTuneKind.Get(n), "tiny-a's weights are BF16 as the env reports them")
			_, grain := ir.AttrTuneColGrain.Lookup(n)
			require.False(t, grain)
		}
	}
	require.Equal(t, int64(tuned), pr.Stats[1].Value)
	path := filepath.Join(dir, "cuda-fake-gpu-9000.json")
	tb, err := autotune.LoadDeviceTable(dir, "cuda", "Fake GPU 9000")
	require.NoError(t, err)
	require.Equal(t, "cuBLASLt 1", tb.Library)
	require.Len(t, tb.Entries, len(pr.Fired))
	require.FileExists(t, path)

	// the next start loads the table
	ft.calls = 0
	req[0].Options["tune_at_start"] = false
	g2, rep2, _ := passtest.Explain(t, cfg, graph.Prefill, req, env())
	require.Zero(t, ft.calls)
	require.Zero(t, rep2.Find(autotune.Name).Stats[0].Value)
	require.Equal(t, g.Text(), g2.Text())

	// another cuBLASLt: its algorithm entries are not used as they are
	ft.library = "cuBLASLt 2"
	_, rep3, _ := passtest.Explain(t, cfg, graph.Prefill, req, env())
	var stale int
	for _, s := range rep3.Find(autotune.Name).Skipped {
		if strings.Contains(s.Reason, "measured with cuBLASLt 1, this is cuBLASLt 2") {
			stale++
		}
	}
	require.Equal(t, len(pr.Fired)/2, stale, "the 8-token buckets' algorithms")
	req[0].Options["tune_at_start"] = true
	_, rep4, _ := passtest.Explain(t, cfg, graph.Prefill, req, env())
	require.Equal(t, len(pr.Fired)/2, ft.calls, "re-measured")
	require.Len(t, rep4.Find(autotune.Name).Fired, len(pr.Fired))
	tb, err = autotune.LoadDeviceTable(dir, "cuda", "Fake GPU 9000")
	require.NoError(t, err)
	require.Equal(t, "cuBLASLt 2", tb.Library)

	// no tuner: nothing chosen, said once
	e := pass.NewEnv(cfg, nil)
	e.Device = "cuda"
	_, rep5, _ := passtest.Explain(t, cfg, graph.Prefill, req, e)
	require.Empty(t, rep5.Find(autotune.Name).Fired)
	require.Contains(t, rep5.Find(autotune.Name).Skipped[0].Reason, "no GEMM tuner for this device")

	// a device table must name kernels
	require.NoError(t, os.WriteFile(path, []byte(`{"device":"cuda","gpu":"Fake GPU 9000","entries":[{"op":"gemm","dtype":"x","n":1,"k":1,"bucket":1}]}`), 0o644))
	_, err = autotune.LoadDeviceTable(dir, "cuda", "Fake GPU 9000")
	require.ErrorContains(t, err, "names no kernel")
}

// A table measured with other GEMM kernels (another implementation: an
// AVX-512 machine's table on an AVX2 one) is not applied, and one skipped
// site says so, naming the file; the implementation's own table applies.
func TestOtherImplementationsTableIsNotApplied(t *testing.T) {
	cfg := passtest.TinyA(t).Checkpoint.Config()
	dir := fixedTable(t, cfg) // this process's implementation's table
	own := autotune.TablePath(dir, "test-cpu", gemm.Impl())
	other := autotune.TablePath(dir, "test-cpu", "avx512-elsewhere")
	require.NoError(t, os.Rename(own, other))
	b, err := os.ReadFile(other)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(other, []byte(strings.Replace(string(b), `"isa": "`+gemm.Impl()+`"`, `"isa": "avx512-elsewhere"`, 1)), 0o644))

	g, rep, before := passtest.Explain(t, cfg, graph.Decode, request(dir), nil)
	pr := rep.Find(autotune.Name)
	require.Empty(t, pr.Fired, "another implementation's entries tune nothing")
	require.Equal(t, before, g.Text())
	var said []string
	for _, s := range pr.Skipped {
		if strings.Contains(s.Reason, "not applied") {
			said = append(said, s.Reason)
		}
	}
	require.Len(t, said, 1, "said once")
	require.Contains(t, said[0], other)
	require.Contains(t, said[0], `the "`+gemm.Impl()+`" ones this process runs`)

	// a table of another CPU whose name starts like this one's is not
	// this CPU's (counted by what it holds); a table from before the key
	// (no isa, named without it) is
	longer := &autotune.Table{CPU: "test-cpu-9000", ISA: "avx2"}
	longer.Put(autotune.Entry{Op: "gemm", DType: "bf16", N: 1, K: 1, Bucket: 1, ColGrain: 1, RowBlock: 1})
	require.NoError(t, longer.Save(dir))
	legacy := filepath.Join(dir, "test-cpu-"+runtime.GOARCH+".json")
	require.NoError(t, os.WriteFile(legacy, []byte(`{"cpu": "test-cpu", "entries": []}`), 0o644))
	require.ElementsMatch(t, []string{other, legacy}, autotune.OtherTables(dir, "test-cpu", gemm.Impl()))

	// the same entries under this implementation's key apply
	_, rep, _ = passtest.Explain(t, cfg, graph.Decode, []pass.Request{{Name: autotune.Name, Options: map[string]any{"table_dir": dir, "cpu": "test-cpu", "isa": "avx512-elsewhere"}}}, nil)
	require.NotEmpty(t, rep.Find(autotune.Name).Fired)
}

// The committed CPU tables are keyed by their GEMM implementation: each
// file's name is its cpu, isa and goarch.
func TestCommittedTablesAreKeyed(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "configs", "tuning", "*.json"))
	require.NoError(t, err)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		var tb autotune.Table
		require.NoError(t, json.Unmarshal(b, &tb), f)
		if tb.Device != "" {
			continue
		}
		require.NotEmpty(t, tb.ISA, "%s names no GEMM implementation", f)
		require.Equal(t, autotune.TablePath("", tb.CPU, tb.ISA), strings.Replace(filepath.Base(f), tb.GOARCH, runtime.GOARCH, 1), f)
	}
}
