// Package passtest is what a pass's tests use, built-in or plugin (as
// net/http/httptest sits beside net/http): the transformers fixtures of the
// checkout, golden IR files, a one-call "build this graph and run these
// passes", and the conformance suite every pass passes (Run).
package passtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/eval"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/model/randckpt"
)

// Fixture is a transformers reference fixture: a checkpoint and its cases.
type Fixture struct {
	Checkpoint *model.Checkpoint
	Reference  *eval.Reference
}

// OpenFixture opens dir/checkpoint and dir/reference.safetensors; both
// close when the test ends.
func OpenFixture(t testing.TB, dir string) *Fixture {
	t.Helper()
	ck, err := model.Open(filepath.Join(dir, "checkpoint"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	ref, err := eval.Load(filepath.Join(dir, "reference.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	return &Fixture{Checkpoint: ck, Reference: ref}
}

// Root is the module's root directory (where go.mod is), found from the
// working directory upward.
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("passtest: no go.mod above the working directory")
		}
		dir = up
	}
}

// Fixtures lists the directories of the checkout's transformers fixtures
// of the trunk (testdata/glm5next-tiny-*, less the MTP fixture, whose
// reference is of another format), sorted; the first is tiny-a.
func Fixtures(t testing.TB) []string {
	t.Helper()
	all, err := filepath.Glob(filepath.Join(Root(t), "testdata", "glm5next-tiny-*"))
	var dirs []string
	for _, d := range all {
		if !eval.IsMTPReference(filepath.Join(d, "reference.json")) {
			dirs = append(dirs, d)
		}
	}
	if err != nil || len(dirs) == 0 {
		t.Fatalf("passtest: no fixtures under %s/testdata (%v)", Root(t), err)
	}
	return dirs
}

// TinyA opens the fixture glm5next-tiny-a (the model the golden IR files
// are written for).
func TinyA(t testing.TB) *Fixture {
	t.Helper()
	return OpenFixture(t, filepath.Join(Root(t), "testdata", "glm5next-tiny-a"))
}

// Golden compares got with the file at path; with GLMFLASH_UPDATE_GOLDEN=1
// in the environment it writes got there first.
func Golden(t testing.TB, path, got string) {
	t.Helper()
	if os.Getenv("GLMFLASH_UPDATE_GOLDEN") != "" {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (GLMFLASH_UPDATE_GOLDEN=1 writes it)", err)
	}
	if string(want) != got {
		t.Fatalf("%s differs from the graph (GLMFLASH_UPDATE_GOLDEN=1 rewrites it):\n%s", path, firstDiff(string(want), got))
	}
}

// firstDiff shows the first line where want and got differ.
func firstDiff(want, got string) string {
	wl, gl := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < max(len(wl), len(gl)); i++ {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g {
			return fmt.Sprintf("line %d:\n  want: %s\n  got:  %s", i+1, w, g)
		}
	}
	return ""
}

// Explain builds cfg's graph for mode (last-token logits), runs the
// requested passes over it (verifying after each) in env (pass.NewEnv(cfg,
// nil) when nil) and returns the rewritten graph, the report and the graph's
// text before the passes.
func Explain(t testing.TB, cfg *model.Config, mode graph.Mode, reqs []pass.Request, env *pass.Env) (*ir.Graph, *pass.Report, string) {
	t.Helper()
	g, err := graph.Build(cfg, graph.Options{Mode: mode, Logits: graph.LastLogits})
	if err != nil {
		t.Fatal(err)
	}
	before := g.Text()
	return g, RunOn(t, g, cfg, reqs, env), before
}

// TinyMTP opens the checkpoint of the MTP fixture glm5next-tiny-mtp (the
// tiny-a trunk plus an MTP layer): draft graphs are built for it.
func TinyMTP(t testing.TB) *model.Checkpoint {
	t.Helper()
	ck, err := model.Open(filepath.Join(Root(t), "testdata", "glm5next-tiny-mtp", "checkpoint"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	return ck
}

// SpecGraphs builds speculative decoding's graphs for cfg (which must have
// an MTP layer), by name: "verify" (the target's verify batch: span logits,
// final hidden rows), "draft-extend" (the MTP layer after a prefill chunk),
// "draft-extend-accepted" (after a verify step: lengths from acceptance),
// "draft-step" (a draft step reusing step 0's indexer selection) and
// "dflash" (a DFlash drafter's block draft forward).
func SpecGraphs(t testing.TB, cfg *model.Config) map[string]*ir.Graph {
	t.Helper()
	out := map[string]*ir.Graph{}
	var err error
	if out["verify"], err = graph.Build(cfg, graph.Options{Mode: graph.Verify, Logits: graph.SpanLogits, FinalHidden: true}); err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]graph.Options{
		"draft-extend":          {Mode: graph.Extend, Logits: graph.LastLogits, IndexShare: 4},
		"draft-extend-accepted": {Mode: graph.Verify, Logits: graph.LastLogits, IndexShare: 4},
		"draft-step":            {Mode: graph.Decode, Logits: graph.LastLogits, IndexShare: 4},
	} {
		if out[name], err = graph.BuildMTP(cfg, o); err != nil {
			t.Fatal(err)
		}
	}
	// a DFlash drafter's block draft forward (the tiny-dflash sizes over
	// cfg's hidden size and depth)
	d, err := randckpt.DFlashPreset("tiny-dflash", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if out["dflash"], err = graph.BuildDFlash(cfg, d, graph.Options{}); err != nil {
		t.Fatal(err)
	}
	return out
}

// RunOn runs the requested passes over g (verifying after each) in env
// (pass.NewEnv(cfg, nil) when nil) and returns the report.
func RunOn(t testing.TB, g *ir.Graph, cfg *model.Config, reqs []pass.Request, env *pass.Env) *pass.Report {
	t.Helper()
	pl, err := pass.NewPipeline(reqs, true)
	if err != nil {
		t.Fatal(err)
	}
	if env == nil {
		env = pass.NewEnv(cfg, nil)
	}
	rep, err := pl.Run(g, env)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// SpecStatement checks that the pass states how it treats verify and
// draft graphs (its Description's Verify and Draft), that running it on each of SpecGraphs
// leaves a graph that verifies and does not fail, and that the report
// shows the statement. It returns the pass's report per graph name.
func SpecStatement(t testing.TB, name string, cfg *model.Config, opts map[string]any) map[string]*pass.PassReport {
	t.Helper()
	reg, ok := pass.Lookup(name)
	if !ok {
		t.Fatalf("pass %s is not registered", name)
	}
	out := map[string]*pass.PassReport{}
	for gname, g := range SpecGraphs(t, cfg) {
		kind := pass.KindOf(g)
		stmt := reg.Speculation(kind)
		if strings.TrimSpace(stmt) == "" {
			t.Fatalf("pass %s states nothing about %s graphs", name, kind)
		}
		rep := RunOn(t, g, cfg, []pass.Request{{Name: name, Options: opts}}, nil)
		pr := rep.Find(name)
		if pr.Error != "" {
			t.Fatalf("pass %s failed on the %s graph: %s", name, gname, pr.Error)
		}
		if len(pr.Notes) == 0 || pr.Notes[0] != string(kind)+" graph: "+stmt {
			t.Fatalf("the report of pass %s on the %s graph does not show its statement: %q", name, gname, pr.Notes)
		}
		out[gname] = pr
	}
	return out
}
