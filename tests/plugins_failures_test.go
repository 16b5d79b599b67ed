package tests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/plugins/host"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// Every way a plugin can fail to load is named where the user sees it: a
// pass listed in passes: whose plugin did not load is an error (or a FAILED
// row) carrying the real reason, never a bare "unknown pass".
func TestEveryPluginLoadFailureIsNamed(t *testing.T) {
	built := buildPlugins(t, map[string]string{
		"glmflash-pass-versions-test": "./plugins/testdata/versions",
		examplePlugin:                 examplePkg,
	})
	copyTo := func(dir, from, to string, mode os.FileMode) string {
		b, err := os.ReadFile(filepath.Join(built, from))
		require.NoError(t, err)
		p := filepath.Join(dir, to)
		require.NoError(t, os.WriteFile(p, b, mode))
		return p
	}
	cases := []struct {
		name   string
		setup  func(dir string) (sums map[string]string, extra string)
		listed string // the pass the configuration asks for
		want   []string
	}{
		{"not executable", func(d string) (map[string]string, string) {
			copyTo(d, examplePlugin, "glmflash-pass-ext", 0o644)
			return nil, ""
		}, "shared-expert-fusion", []string{"glmflash-pass-ext: not executable (mode -rw-r--r--)"}},
		{"wrong checksum", func(d string) (map[string]string, string) {
			copyTo(d, examplePlugin, "glmflash-pass-ext", 0o755)
			return map[string]string{"glmflash-pass-ext": strings.Repeat("ab", 32)}, ""
		}, "shared-expert-fusion", []string{"glmflash-pass-ext: checksum verification failed: SHA-256 of", "expected " + strings.Repeat("ab", 32)}},
		{"no checksum", func(d string) (map[string]string, string) {
			copyTo(d, examplePlugin, "glmflash-pass-ext", 0o755)
			return nil, ""
		}, "shared-expert-fusion", []string{"glmflash-pass-ext: no expected SHA-256 for glmflash-pass-ext", "allow_unverified"}},
		{"protocol version", func(d string) (map[string]string, string) {
			p := copyTo(d, "glmflash-pass-versions-test", "glmflash-pass-vt", 0o755)
			t.Setenv("GLMFLASH_TEST_PLUGIN_VERSIONS", "7")
			return map[string]string{"glmflash-pass-vt": sha256File(t, p)}, ""
		}, "versions-test", []string{"glmflash-pass-vt: could not start", "incompatible API version"}},
		{"exits at start", func(d string) (map[string]string, string) {
			p := filepath.Join(d, "glmflash-pass-quits")
			require.NoError(t, os.WriteFile(p, []byte("#!/bin/sh\necho bye >&2\nexit 3\n"), 0o755))
			return map[string]string{"glmflash-pass-quits": sha256File(t, p)}, ""
		}, "quitter", []string{"glmflash-pass-quits: could not start"}},
		{"not a plugin at all", func(d string) (map[string]string, string) {
			p := filepath.Join(d, "glmflash-pass-text")
			require.NoError(t, os.WriteFile(p, []byte("hello\n"), 0o755))
			return map[string]string{"glmflash-pass-text": sha256File(t, p)}, ""
		}, "texty", []string{"glmflash-pass-text: could not start"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := t.TempDir()
			sums, _ := c.setup(d)
			ec := &config.Config{Passes: []config.PassConfig{{Name: c.listed}}, Plugins: config.Plugins{Dir: d, Checksums: sums, StartTimeoutMS: 5000}}
			h, err := host.Open(host.OptionsFromConfig(ec, zerolog.Nop()))
			require.NoError(t, err)
			defer h.Close()
			_, err = ec.Pipeline(h)
			if err == nil {
				// the plugin's file name gave the pass its name: a FAILED row
				p := h.Plugin(c.listed)
				require.NotNil(t, p)
				err = p.Err()
			}
			require.Error(t, err)
			for _, w := range c.want {
				require.Contains(t, err.Error(), w)
			}
			require.NoError(t, h.Close())
			requireProcessesGone(t, h.PIDs(), d)
		})
	}
}

// passes list shows files that look like plugins but are not, with why.
func TestPassesListShowsIgnoredPlugins(t *testing.T) {
	d := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(d, "glmflash-pass-noexec"), []byte("#!/bin/sh\n"), 0o644))
	cfg := filepath.Join(t.TempDir(), "engine.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("passes: []\nplugins: {dir: "+d+"}\n"), 0o644))
	out, err := glmflash(t, glmflashBinary(t), "passes", "list", "--config", cfg)
	require.NoError(t, err, out)
	require.Contains(t, out, "NOT LOADED: glmflash-pass-noexec: not executable (mode -rw-r--r--)")
}
