package tests

import (
	"fmt"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/engine"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/core/passtest"
	"github.com/glmflash/glmflash/passes/hostlen"
	"github.com/stretchr/testify/require"
)

// Deliberately broken plugins (plugins/testdata/*, built here): each makes
// its pass fail in the report with a clear reason and a log entry, the
// engine goes on (a built-in pass listed after it still fires) with outputs
// equal to the pass-off engine's, and no plugin process is left behind.
func TestPluginFailuresAreContained(t *testing.T) {
	dir := buildPlugins(t, map[string]string{
		"glmflash-pass-crash-test":      "./plugins/testdata/crash",
		"glmflash-pass-hang-test":       "./plugins/testdata/hang",
		"glmflash-pass-bad-ir-test":     "./plugins/testdata/badir",
		"glmflash-pass-unknown-op-test": "./plugins/testdata/unknownop",
		examplePlugin:                   examplePkg,
	})
	sums := checksums(t, dir)
	ck, ref := openFixture(t, fixtures[0])
	f := &passtest.Fixture{Checkpoint: ck, Reference: ref}
	base := passtest.RunCases(t, f, nil)
	cases := []struct {
		name, pass, options string
		timeoutMS           int
		badSum              string // file whose expected checksum is wrong
		want                []string
	}{
		{name: "os.Exit in Eligible", pass: "crash-test", options: "{mode: exit, at: eligible}",
			want: []string{"the plugin process exited during Eligible (crash)"}},
		{name: "panic in Apply", pass: "crash-test", options: "{mode: panic, at: apply}",
			want: []string{"the plugin process exited during Apply (crash)"}},
		{name: "hang past the timeout", pass: "hang-test", timeoutMS: 400,
			want: []string{"Eligible did not answer within 400ms (plugins.timeout_ms): the plugin was killed"}},
		{name: "IR failing the verifier", pass: "bad-ir-test",
			want: []string{"plugin returned an invalid graph", "node 0 (linear, layer -1)", "not defined before use"}},
		{name: "unknown op", pass: "unknown-op-test",
			want: []string{"plugin returned an invalid graph", `unknown op "fused_magic_head" (not registered in this engine)`}},
		{name: "checksum mismatch", pass: "shared-expert-fusion", badSum: examplePlugin,
			want: []string{"checksum verification failed: SHA-256 of", "expected " + strings.Repeat("0", 64)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var y strings.Builder
			fmt.Fprintf(&y, "passes:\n  - name: %s\n", c.pass)
			if c.options != "" {
				fmt.Fprintf(&y, "    options: %s\n", c.options)
			}
			fmt.Fprintf(&y, "  - name: %s\nplugins:\n  dir: %s\n", hostlen.Name, dir)
			if c.timeoutMS > 0 {
				fmt.Fprintf(&y, "  timeout_ms: %d\n", c.timeoutMS)
			}
			y.WriteString("  checksums:\n")
			for file, sum := range sums {
				if file == c.badSum {
					sum = strings.Repeat("0", 64)
				}
				fmt.Fprintf(&y, "    %s: %q\n", file, sum) // quoted: YAML reads an all-digit sum as a number
			}
			s := openPlugins(t, y.String())
			pids := s.host.PIDs()
			e := s.engine(t, ck)
			got := passtest.RunCases(t, f, e)
			require.Equal(t, base, got, "outputs must equal the pass-off engine's")
			require.NotEmpty(t, e.Reports())
			for key, rep := range e.Reports() {
				pr := rep.Find(c.pass)
				require.NotNil(t, pr, key.String())
				require.True(t, pr.Requested)
				require.Empty(t, pr.Fired, key.String())
				for _, w := range c.want {
					if !strings.Contains(pr.Error, w) {
						// later programs see the plugin disabled, with the first failure as the cause
						require.Contains(t, pr.Error, "is not usable", "%s: %s", key, pr.Error)
					}
				}
				require.Contains(t, rep.String(), c.pass+" failed: ")
				hl := rep.Find(hostlen.Name)
				require.Empty(t, hl.Error)
				require.NotEmpty(t, hl.Fired, "the engine goes on with the next pass")
			}
			errs := anyReportError(e.Reports(), c.pass)
			if invalidGraph := c.pass == "bad-ir-test" || c.pass == "unknown-op-test"; invalidGraph {
				// the plugin stays usable: every program gets its own verdict
				require.NoError(t, s.host.Plugin(c.pass).Err())
			} else {
				// a crash, a hang or a failed check disables the plugin for good
				require.Error(t, s.host.Plugin(c.pass).Err())
				errs += s.host.Plugin(c.pass).Err().Error()
			}
			for _, w := range c.want {
				require.Contains(t, errs, w)
			}
			logs := s.log.String()
			require.Contains(t, logs, `"plugin":"glmflash-pass-`+c.pass+`"`)
			require.Contains(t, logs, `"level":"error"`)
			require.Contains(t, logs, c.want[0])
			if c.pass != "bad-ir-test" && c.pass != "unknown-op-test" {
				// crashed, killed or never started: gone before the host closes
				requireProcessesGone(t, pids, dir)
			}
			require.NoError(t, s.host.Close())
			requireProcessesGone(t, pids, dir)
		})
	}
}

func anyReportError(reps map[engine.Key]*pass.Report, name string) string {
	var b strings.Builder
	for _, r := range reps {
		if pr := r.Find(name); pr != nil {
			b.WriteString(pr.Error + " ")
		}
	}
	return b.String()
}
