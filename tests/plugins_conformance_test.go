package tests

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/plugins/examples/sharedexpert/fusion"
	"github.com/stretchr/testify/require"
)

// The conformance suite every pass passes (each built-in pass runs it in
// its own package), run on the example plugin through its real subprocess,
// and in process as its author runs it before building the binary.
func TestPluginConformance(t *testing.T) {
	f := passtest.OpenFixture(t, fixtureDir(fixtures[0]))
	dir := buildPlugins(t, map[string]string{examplePlugin: examplePkg})
	s := openPlugins(t, fmt.Sprintf("passes:\n  - name: %s\nplugins:\n  dir: %s\n  checksums:\n    %s: %q\n",
		fusion.Name, dir, examplePlugin, sha256File(t, filepath.Join(dir, examplePlugin))))
	require.NoError(t, s.host.Plugin(fusion.Name).Err())
	ineligible := passtest.Ineligibility{Env: func(e *pass.Env) {
		e.LoRA = append(e.LoRA, pass.LoRATarget{Adapter: "conformance", Module: "shared_experts"})
	}}
	t.Run(fusion.Name, func(t *testing.T) {
		passtest.Run(t, f, passtest.Subject{Name: fusion.Name, Resolver: s.host, Ineligible: ineligible})
	})
	t.Run(fusion.Name+" in process", func(t *testing.T) {
		passtest.Run(t, f, passtest.Subject{Name: fusion.Name,
			Resolver: passtest.InProcess(fusion.Description, fusion.New), Ineligible: ineligible})
	})
	pids := s.host.PIDs()
	require.NoError(t, s.host.Close())
	requireProcessesGone(t, pids, dir)
}
