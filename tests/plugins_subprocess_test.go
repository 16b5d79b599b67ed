package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/eval"
	"github.com/glmflash/glmflash/core/graph"
	"github.com/glmflash/glmflash/core/ir"
	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/plugins/examples/sharedexpert/fusion"
	"github.com/glmflash/glmflash/plugins/host"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// The example plugin as a real subprocess, loaded from a directory named in
// the engine YAML, verified by checksum (inline and through a sums file),
// run through the engine: every case of every fixture within 1e-4 of the
// pass-off engine with identical greedy tokens, the transformers references
// still pass, and the report says where it fired and why it skipped.
func TestPluginExampleSubprocess(t *testing.T) {
	dir := buildPlugins(t, map[string]string{examplePlugin: examplePkg})
	sum := sha256File(t, filepath.Join(dir, examplePlugin))
	sums := filepath.Join(t.TempDir(), "SHA256SUMS")
	require.NoError(t, os.WriteFile(sums, []byte(sum+"  "+examplePlugin+"\n"), 0o644))
	yamls := map[string]string{
		"inline checksum": fmt.Sprintf("passes:\n  - name: %s\nplugins:\n  dir: %s\n  checksums:\n    %s: %s\n", fusion.Name, dir, examplePlugin, sum),
		"sums file":       fmt.Sprintf("passes:\n  - name: %s\nplugins:\n  dir: %s\n  sums_file: %s\n  timeout_ms: 20000\n", fusion.Name, dir, sums),
	}
	for how, yaml := range yamls {
		fxs := fixtures
		if how == "sums file" {
			fxs = fixtures[:1] // loading is what differs
		}
		t.Run(how, func(t *testing.T) {
			s := openPlugins(t, yaml)
			p := s.host.Plugin(fusion.Name)
			require.NotNil(t, p)
			require.NoError(t, p.Err())
			require.Equal(t, 1, p.Version)
			require.Equal(t, "1.0.0", p.Desc.Version)
			require.Contains(t, s.log.String(), `"plugin":"glmflash-pass-shared-expert-fusion"`)
			require.Contains(t, s.log.String(), "plugin loaded")
			for _, name := range fxs {
				ck, ref := openFixture(t, name)
				f := &passtest.Fixture{Checkpoint: ck, Reference: ref}
				base := passtest.RunCases(t, f, nil)
				e := s.engine(t, ck)
				worst, err := passtest.Compare(base, passtest.RunCases(t, f, e), ck.Config().VocabSize)
				require.NoError(t, err, name)
				res, err := eval.RunAll(e, ref)
				require.NoError(t, err)
				for _, r := range res {
					require.True(t, r.Pass(1e-4), "%s %s: max|Δ| %.2e vs transformers, greedy %v", name, r.Name, r.MaxAbsDiff, r.GreedyMatch)
				}
				rep := e.Report(engine.Key{Mode: graph.Decode, Logits: graph.LastLogits})
				require.NotNil(t, rep)
				pr := rep.Find(fusion.Name)
				require.NotNil(t, pr)
				require.Empty(t, pr.Error)
				require.Equal(t, "1.0.0", pr.Version)
				cfg := ck.Config()
				moe := 0
				for l := 0; l < cfg.NumHiddenLayers; l++ {
					if cfg.IsMoE(l) {
						moe++
					}
				}
				if cfg.NSharedExperts == 1 {
					require.Len(t, pr.Fired, moe, name)
					require.Empty(t, pr.Skipped, name)
					p, err := e.Program(engine.Key{Mode: graph.Decode, Logits: graph.LastLogits})
					require.NoError(t, err)
					ops := map[string]int{}
					for _, n := range p.Plan().Graph.Nodes {
						ops[n.Op]++
					}
					require.Equal(t, moe, ops[ir.OpMoEAppendExpert], name)
					require.Zero(t, ops[ir.OpAdd], name)
				} else {
					require.Empty(t, pr.Fired, name)
					require.Len(t, pr.Skipped, moe, name)
					require.Contains(t, pr.Skipped[0].Reason, "shared expert width 64 (n_shared_experts 2 × moe_intermediate_size 32) differs from a routed expert's 32")
				}
				t.Logf("%s: max|Δ| vs pass-off %.1e, fired %d, skipped %d", name, worst, len(pr.Fired), len(pr.Skipped))
			}
			pids := s.host.PIDs()
			require.Len(t, pids, 1)
			require.NoError(t, s.host.Close())
			requireProcessesGone(t, pids, dir)
		})
	}
}

// Protocol version negotiation picks the highest version both sides speak;
// a plugin that speaks none of the host's versions is reported as failed.
func TestPluginVersionNegotiation(t *testing.T) {
	dir := buildPlugins(t, map[string]string{"glmflash-pass-versions-test": "./plugins/testdata/versions"})
	sums := checksums(t, dir)
	for _, c := range []struct {
		plugin string
		host   []int
		want   int
		err    string
	}{
		{"1", []int{1}, 1, ""},
		{"1,2", []int{1}, 1, ""},
		{"1,2", []int{1, 2}, 2, ""},
		{"2,3", []int{1, 2, 3}, 3, ""},
		{"2", []int{1}, 0, "incompatible API version"},
	} {
		t.Setenv("GLMFLASH_TEST_PLUGIN_VERSIONS", c.plugin)
		h, err := host.Open(host.Options{Dir: dir, Checksums: sums, Versions: c.host, Log: zerolog.Nop()})
		require.NoError(t, err)
		p := h.Plugin("versions-test")
		if c.err != "" {
			require.NotNil(t, p)
			require.ErrorContains(t, p.Err(), c.err)
		} else {
			require.NoError(t, p.Err())
			require.Equal(t, c.want, p.Version, "plugin %s host %v", c.plugin, c.host)
		}
		pids := h.PIDs()
		require.NoError(t, h.Close())
		requireProcessesGone(t, pids, dir)
	}
}

// Without an expected checksum a plugin is refused unless allow_unverified
// is on; a plugin that is not requested is stopped after describing itself;
// unknown pass names are still errors.
func TestPluginChecksumPolicy(t *testing.T) {
	dir := buildPlugins(t, map[string]string{examplePlugin: examplePkg})
	s := openPlugins(t, fmt.Sprintf("passes:\n  - name: %s\nplugins:\n  dir: %s\n", fusion.Name, dir))
	p := s.host.Plugin(fusion.Name)
	require.NotNil(t, p, "the refused plugin is known by its file name")
	require.ErrorContains(t, p.Err(), "no expected SHA-256")
	require.ErrorContains(t, p.Err(), "allow_unverified")
	require.Empty(t, s.host.PIDs(), "an unverified plugin never runs")

	s = openPlugins(t, fmt.Sprintf("passes:\n  - name: %s\nplugins:\n  dir: %s\n  allow_unverified: true\n", fusion.Name, dir))
	require.NoError(t, s.host.Plugin(fusion.Name).Err())
	require.Contains(t, s.log.String(), "unverified")
	require.NoError(t, s.host.Close())

	ec, err := config.Parse([]byte(fmt.Sprintf("passes:\n  - name: no-such-pass\nplugins:\n  dir: %s\n  allow_unverified: true\n", dir)), "t.yaml")
	require.NoError(t, err)
	h, err := host.Open(host.OptionsFromConfig(ec, zerolog.Nop()))
	require.NoError(t, err)
	_, err = ec.Pipeline(h)
	require.ErrorContains(t, err, `unknown pass "no-such-pass"`)
	require.ErrorContains(t, err, fusion.Name, "the error lists plugin passes too")
	require.NoError(t, h.Close())

	// listed but disabled: started to learn its name, then stopped
	s = openPlugins(t, fmt.Sprintf("passes:\n  - name: %s\n    enabled: false\nplugins:\n  dir: %s\n  allow_unverified: true\n", fusion.Name, dir))
	pids := s.host.PIDs()
	s.host.StopUnused(nil)
	requireProcessesGone(t, pids, dir)
	ck, _ := openFixture(t, fixtures[0])
	g, err := graph.Build(ck.Config(), graph.Options{Mode: graph.Decode, Logits: graph.LastLogits})
	require.NoError(t, err)
	rep, err := s.pl.Run(g, s.ec.PassEnv(ck.Config(), ck))
	require.NoError(t, err)
	pr := rep.Find(fusion.Name)
	require.NotNil(t, pr)
	require.False(t, pr.Requested)
	require.True(t, strings.HasPrefix(s.host.Plugin(fusion.Name).Err().Error(), "stopped"))
}
