package host

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/glmflash/glmflash/core/pass"
	"github.com/hashicorp/go-hclog"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

func TestExpectedSums(t *testing.T) {
	a, b := strings.Repeat("ab", 32), strings.Repeat("cd", 32)
	dir := t.TempDir()
	sums := filepath.Join(dir, "SHA256SUMS")
	write := func(s string) { require.NoError(t, os.WriteFile(sums, []byte(s), 0o644)) }
	write("# comment\n\n" + a + "  glmflash-pass-a\n" + b + " *sub/glmflash-pass-b\n")
	m, err := expectedSums(Options{SumsFile: sums, Checksums: map[string]string{"glmflash-pass-c": strings.ToUpper(a)}})
	require.NoError(t, err)
	require.Len(t, m, 3)
	require.Equal(t, byte(0xcd), m["glmflash-pass-b"][0], "binary-mode marker and directory are dropped")
	require.Equal(t, byte(0xab), m["glmflash-pass-c"][0])
	_, err = expectedSums(Options{SumsFile: sums, Checksums: map[string]string{"glmflash-pass-a": b}})
	require.ErrorContains(t, err, "two different expected checksums")
	write("nothex  glmflash-pass-a\n")
	_, err = expectedSums(Options{SumsFile: sums})
	require.ErrorContains(t, err, "SHA256SUMS:1")
	write(a + "\n")
	_, err = expectedSums(Options{SumsFile: sums})
	require.ErrorContains(t, err, "want")
	_, err = expectedSums(Options{SumsFile: filepath.Join(dir, "missing")})
	require.ErrorContains(t, err, "plugins.sums_file")
}

func TestDiscoveryAndRefusal(t *testing.T) {
	dir := t.TempDir()
	for name, mode := range map[string]os.FileMode{"glmflash-pass-x": 0o755, "glmflash-pass-notexec": 0o644, "other": 0o755, "glmflash-pass-": 0o755} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\nexit 1\n"), mode))
	}
	files, skipped, err := discover(dir)
	require.NoError(t, err)
	require.Equal(t, []string{"glmflash-pass-x"}, files)
	require.Equal(t, []skippedFile{{"glmflash-pass-notexec", "not executable (mode -rw-r--r--)"}}, skipped)
	h, err := Open(Options{Dir: dir, Log: zerolog.Nop(), Requested: map[string]map[string]any{"x": {"n": 3}}})
	require.NoError(t, err)
	defer h.Close()
	require.Equal(t, []string{"x"}, h.Names())
	p := h.Plugin("x")
	require.ErrorContains(t, p.Err(), "no expected SHA-256 for glmflash-pass-x")
	require.Empty(t, h.PIDs())
	// the placeholder pass accepts the configured options and fails at Eligible
	r := p.Registration()
	ps := r.New().(*Pass)
	d := r.Description
	require.Equal(t, "x", d.Name)
	require.Equal(t, "n", d.Options[0].Name)
	_, err = ps.EligibleE(nil, nil, &pass.Env{})
	require.ErrorContains(t, err, "not usable")
	_, err = Open(Options{Dir: filepath.Join(dir, "missing")})
	require.ErrorContains(t, err, "plugins.dir")
}

func TestZerologBridge(t *testing.T) {
	var b strings.Builder
	l := newZlog(zerolog.New(&b), "glmflash-pass-x").Named("sub").With("k", 1)
	l.Info("hello", "plugin", "/path/to/it", "err", os.ErrNotExist, "odd")
	l.Trace("quiet")
	l.Warn("shadowing", "message", "m", "level", "l", "time", "t", "logger", "g", "error", "e")
	out := b.String()
	require.Contains(t, out, `"plugin_message":"m","plugin_level":"l","plugin_time":"t","plugin_logger":"g","plugin_error":"e","message":"shadowing"`)
	require.Contains(t, out, `"plugin":"glmflash-pass-x"`)
	require.Contains(t, out, `"plugin_path":"/path/to/it"`)
	require.Contains(t, out, `"logger":"sub"`)
	require.Contains(t, out, `"k":1`)
	require.Contains(t, out, `"message":"hello"`)
	require.Contains(t, out, `"err":"file does not exist"`)
	require.Contains(t, out, `"level":"info"`)
	require.Contains(t, out, `"level":"trace"`)
	l.SetLevel(hclog.Warn)
	require.False(t, l.IsInfo())
	require.Equal(t, hclog.Off, newZlog(zerolog.Nop(), "x").GetLevel())
}
