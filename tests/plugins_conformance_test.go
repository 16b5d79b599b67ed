package tests

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/model"
	"github.com/glmflash/glmflash/passes/autotune"
	"github.com/glmflash/glmflash/passes/dsameta"
	"github.com/glmflash/glmflash/passes/hostlen"
	"github.com/glmflash/glmflash/passes/kdafusion"
	"github.com/glmflash/glmflash/passes/mhcfusion"
	"github.com/glmflash/glmflash/plugins/conformance"
	"github.com/glmflash/glmflash/plugins/examples/sharedexpert/fusion"
	"github.com/stretchr/testify/require"
)

// One conformance suite for every pass: the five built-ins in process and
// the example plugin through its real subprocess.
func TestPassConformance(t *testing.T) {
	f := conformance.OpenFixture(t, fixtureDir(fixtures[0]))
	table := fixedTable(t, f.Checkpoint.Config())
	dir := buildPlugins(t, map[string]string{examplePlugin: examplePkg})
	s := openPlugins(t, fmt.Sprintf("passes:\n  - name: %s\nplugins:\n  dir: %s\n  checksums:\n    %s: %q\n",
		fusion.Name, dir, examplePlugin, sha256File(t, filepath.Join(dir, examplePlugin))))
	require.NoError(t, s.host.Plugin(fusion.Name).Err())
	subjects := []conformance.Subject{
		{Name: kdafusion.Name, Ineligible: conformance.Ineligibility{Env: func(e *pass.Env) { e.TP = pass.Topology{} }}},
		{Name: mhcfusion.Name, Ineligible: conformance.Ineligibility{Options: map[string]any{"intra_layer": false, "cross_layer": false}}},
		{Name: dsameta.Name, Ineligible: conformance.Ineligibility{Model: func(c *model.Config) { c.IndexKPool = 1 }}},
		{Name: hostlen.Name, Ineligible: conformance.Ineligibility{Env: func(e *pass.Env) { e.HostLengths = false }}},
		{Name: autotune.Name, Options: map[string]any{"table_dir": table, "cpu": "test-cpu"},
			Ineligible: conformance.Ineligibility{Options: map[string]any{"table_dir": t.TempDir(), "tune_at_start": false}}},
		{Name: fusion.Name, Resolver: s.host, Ineligible: conformance.Ineligibility{Env: func(e *pass.Env) {
			e.LoRA = append(e.LoRA, pass.LoRATarget{Adapter: "conformance", Module: "shared_experts"})
		}}},
	}
	for _, sub := range subjects {
		t.Run(sub.Name, func(t *testing.T) { conformance.Run(t, f, sub) })
	}
	// what a plugin author runs before building the binary
	t.Run(fusion.Name+" in process", func(t *testing.T) {
		conformance.Run(t, f, conformance.Subject{Name: fusion.Name,
			Resolver: conformance.InProcess(func() pass.Pass { return &fusion.Pass{} }), Ineligible: subjects[5].Ineligible})
	})
	pids := s.host.PIDs()
	require.NoError(t, s.host.Close())
	requireProcessesGone(t, pids, dir)
}
