package tests

import (
	"github.com/glmflash/glmflash/kernels/gemm"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/core/speculative/spectest"
	"github.com/glmflash/glmflash/model"
	_ "github.com/glmflash/glmflash/passes/all" // every built-in pass
	"github.com/glmflash/glmflash/passes/autotune"
	"github.com/glmflash/glmflash/passes/dsameta"
	"github.com/glmflash/glmflash/passes/hostlen"
	"github.com/glmflash/glmflash/passes/kdafusion"
	"github.com/glmflash/glmflash/passes/mhcfusion"
	"github.com/stretchr/testify/require"
)

// Each pass's own tests (golden IR, sites, statistics, its conformance
// suite) live in its package, passes/<name>. This file checks what only
// the registry as a whole can show: every registered pass, alone and all
// together in the default configuration's order, on every fixture.

// tuningDir returns a directory holding a tuning table for the fixtures'
// GEMM shapes at every default bucket (measured once per test).
func tuningDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	pl, err := pass.NewPipeline([]pass.Request{{Name: autotune.Name, Options: map[string]any{"tune_at_start": true, "table_dir": dir, "reps": 1, "cpu": "test-cpu"}}}, true)
	require.NoError(t, err)
	for _, name := range fixtures {
		ck, _ := openFixture(t, name)
		for _, lg := range []graph.Logits{graph.AllLogits, graph.LastLogits} {
			g, err := graph.Build(ck.Config(), graph.Options{Mode: graph.Prefill, Logits: lg})
			require.NoError(t, err)
			_, err = pl.Run(g, pass.NewEnv(ck.Config(), nil))
			require.NoError(t, err)
		}
	}
	return dir
}

// fixedTable writes a tuning table with the same parameters for every GEMM
// shape of cfg's decode graph (deterministic, unlike a measured one).
func fixedTable(t *testing.T, cfg *model.Config) string {
	t.Helper()
	dir := t.TempDir()
	g, err := graph.Build(cfg, graph.Options{Mode: graph.Decode, Logits: graph.LastLogits})
	require.NoError(t, err)
	tb := &autotune.Table{CPU: "test-cpu", ISA: gemm.Impl()}
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

// defaultRequests are the enabled passes of the built-in configuration, in
// its order, with its options; the tuning pass reads the table in tdir (the
// machine's own table would not cover the fixtures' shapes).
func defaultRequests(tdir string) []pass.Request {
	reqs := config.Default().Requests()
	for i := range reqs {
		if reqs[i].Name == autotune.Name {
			reqs[i].Options = map[string]any{"table_dir": tdir, "cpu": "test-cpu"}
		}
	}
	return reqs
}

// everyPass is one request per pass of the built-in configuration, enabled
// or not, with its options (the tuning pass reading tdir).
func everyPass(tdir string) []pass.Request {
	var reqs []pass.Request
	for _, p := range config.Default().Passes {
		r := pass.Request{Name: p.Name, Options: p.Options, Dir: p.Dir}
		if r.Name == autotune.Name {
			r.Options = map[string]any{"table_dir": tdir, "cpu": "test-cpu"}
		}
		reqs = append(reqs, r)
	}
	return reqs
}

func engineWith(t *testing.T, ck *model.Checkpoint, reqs []pass.Request) *engine.Engine {
	t.Helper()
	pl, err := pass.NewPipeline(reqs, true)
	require.NoError(t, err)
	e, err := engine.New(ck.Config(), ck, engine.Options{Slots: 2, Passes: pl, PassEnv: config.Default().PassEnv(ck.Config(), ck)})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	return e
}

// Every registered pass is in the built-in configuration (adding a pass is
// its package, one registration line and one YAML entry), and each pass
// package holds its own tests and golden IR.
func TestEveryPassIsRegisteredConfiguredAndTested(t *testing.T) {
	var configured []string
	for _, p := range config.Default().Passes {
		configured = append(configured, p.Name)
	}
	require.ElementsMatch(t, pass.Names(), configured, "the registry and configs/engine.yaml disagree")
	root := passtest.Root(t)
	for _, name := range pass.Names() {
		r, _ := pass.Lookup(name)
		pkg := reflect.TypeOf(r.New()).Elem().PkgPath()
		dir := filepath.Join(root, strings.TrimPrefix(pkg, "github.com/glmflash/glmflash/"))
		tests, _ := filepath.Glob(filepath.Join(dir, "*_test.go"))
		require.NotEmpty(t, tests, "pass %s (%s) has no tests of its own", name, pkg)
		golden, _ := filepath.Glob(filepath.Join(dir, "testdata", "*.golden"))
		require.NotEmpty(t, golden, "pass %s (%s) has no golden IR", name, pkg)
		var conformance bool
		for _, f := range tests {
			b, err := os.ReadFile(f)
			require.NoError(t, err)
			conformance = conformance || strings.Contains(string(b), "passtest.Run(")
		}
		require.True(t, conformance, "pass %s does not run the conformance suite", name)
	}
}

// Parity: each registered pass alone, the built-in configuration's passes
// together, and every pass together give every fixture case's logits within
// 1e-4 of the pass-off engine, with identical greedy tokens; and every pass
// fired.
func TestPassParityOnFixtures(t *testing.T) {
	tdir := tuningDir(t)
	every := everyPass(tdir)
	arms := map[string][]pass.Request{"default": defaultRequests(tdir), "every": every}
	for _, r := range every {
		arms[r.Name] = []pass.Request{r}
	}
	for _, name := range fixtures {
		ck, ref := openFixture(t, name)
		f := &passtest.Fixture{Checkpoint: ck, Reference: ref}
		base := passtest.RunCases(t, f, engineWith(t, ck, nil))
		for arm, reqs := range arms {
			e := engineWith(t, ck, reqs)
			worst, err := passtest.Compare(base, passtest.RunCases(t, f, e), ck.Config().VocabSize)
			require.NoError(t, err, "%s %s", name, arm)
			for key, rep := range e.Reports() {
				for _, r := range reqs {
					pr := rep.Find(r.Name)
					require.NotNil(t, pr)
					require.Empty(t, pr.Error, "%s %s %s", name, arm, key)
					require.NotEmpty(t, pr.Fired, "%s: %s fired nowhere in %s", name, r.Name, key)
				}
			}
			t.Logf("%s %-22s max|Δ| vs pass-off %.1e", name, arm, worst)
		}
	}
}

// Together, in the default order, the passes fire where each model implies:
// host-length-reuse then sees one hoisted DSA metadata node instead of one
// per DSA layer.
func TestPassesTogetherFireWhereExpected(t *testing.T) {
	for _, name := range fixtures {
		ck, _ := openFixture(t, name)
		cfg := ck.Config()
		kda, dsa := 0, 0
		for l := 0; l < cfg.NumHiddenLayers; l++ {
			if cfg.IsKDA(l) {
				kda++
			} else {
				dsa++
			}
		}
		L := cfg.NumHiddenLayers
		_, rep, _ := passtest.Explain(t, cfg, graph.Decode, defaultRequests(fixedTable(t, cfg)), nil)
		require.Len(t, rep.Find(kdafusion.Name).Fired, kda, name)
		require.Len(t, rep.Find(mhcfusion.Name).Fired, 2*L-1, name)
		require.Len(t, rep.Find(dsameta.Name).Fired, dsa, name)
		require.Len(t, rep.Find(hostlen.Name).Fired, 2*kda+1, name) // kda_conv + kda_attn per KDA layer + the hoisted metadata
		require.NotEmpty(t, rep.Find(autotune.Name).Fired, name)
		enabled := map[string]bool{}
		for _, p := range config.Default().Passes {
			enabled[p.Name] = p.On()
		}
		require.Len(t, rep.Passes, len(pass.Names()), "one row per registered pass")
		for _, p := range rep.Passes {
			require.Empty(t, p.Error, p.Name)
			require.Equal(t, enabled[p.Name], p.Requested, p.Name)
		}
	}
}

// Speculative decoding under every pass: each registered pass states how
// it treats verify and draft graphs and tests it in its package; alone and
// all together, the verify spans of a pass's engine still equal its plain
// decoding bit for bit and roll back to its plain run's state exactly,
// and the verify program's report carries each pass's statement.
func TestPassesOnSpeculativeDecoding(t *testing.T) {
	root := passtest.Root(t)
	for _, name := range pass.Names() {
		r, _ := pass.Lookup(name)
		require.True(t, r.Verify != "" && r.Draft != "", "pass %s does not state how it treats verify and draft graphs (Description.Verify, Draft)", name)
		pkg := reflect.TypeOf(r.New()).Elem().PkgPath()
		tests, _ := filepath.Glob(filepath.Join(root, strings.TrimPrefix(pkg, "github.com/glmflash/glmflash/"), "*_test.go"))
		tested := false
		for _, f := range tests {
			b, err := os.ReadFile(f)
			require.NoError(t, err)
			tested = tested || strings.Contains(string(b), "passtest.SpecStatement(")
		}
		require.True(t, tested, "pass %s has no test on speculative decoding's graphs (passtest.SpecStatement)", name)
	}
	ck, _ := openFixture(t, fixtures[0])
	every := everyPass(fixedTable(t, ck.Config()))
	arms := map[string][]pass.Request{"every": every}
	for _, r := range every {
		arms[r.Name] = []pass.Request{r}
	}
	wrong := map[int]bool{2: true, 3: true, 7: true, 12: true}
	for arm, reqs := range arms {
		pl, err := pass.NewPipeline(reqs, true)
		require.NoError(t, err)
		e, err := engine.New(ck.Config(), ck, engine.Options{Slots: 2, Rollback: 5, Passes: pl, PassEnv: config.Default().PassEnv(ck.Config(), ck)})
		require.NoError(t, err)
		plain := spectest.PlainRun(t, e, seqTokens(11, 2, ck.Config().VocabSize), 18)
		spectest.RollbackRun(t, e, plain, 4, wrong)
		rep := e.Report(engine.Key{Mode: graph.Verify, Logits: graph.SpanLogits})
		require.NotNil(t, rep, arm)
		for _, r := range reqs {
			pr := rep.Find(r.Name)
			require.Empty(t, pr.Error, "%s: %s", arm, r.Name)
			require.NotEmpty(t, pr.Notes, "%s: %s", arm, r.Name)
			require.True(t, strings.HasPrefix(pr.Notes[0], "verify graph: "), "%s: %s: %v", arm, r.Name, pr.Notes)
		}
		require.NoError(t, e.Close())
	}
}
