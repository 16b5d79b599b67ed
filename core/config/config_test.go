package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDefaultIsTheShippedFile(t *testing.T) {
	d := Default()
	require.Len(t, d.Enabled(), 5)
	require.True(t, d.VerifyEachPass())
}

func TestStrictDecodingNamesTheKey(t *testing.T) {
	_, err := Parse([]byte("passes:\n  - name: x\n    optoins: {}\n"), "f.yaml")
	require.ErrorContains(t, err, "optoins")
	require.ErrorContains(t, err, "f.yaml")
	_, err = Parse([]byte("paralel:\n  attention_tp_size: 2\n"), "f.yaml")
	require.ErrorContains(t, err, "paralel")
	_, err = Parse([]byte("parallel:\n  attention_tp_size: 2\n  attention_tp_rank: 2\n"), "f.yaml")
	require.ErrorContains(t, err, "attention_tp_rank")
	_, err = Parse([]byte("passes:\n  - name: a\n  - name: a\n"), "f.yaml")
	require.ErrorContains(t, err, "listed twice")
	_, err = Parse([]byte("passes: [\n"), "f.yaml")
	require.ErrorContains(t, err, "invalid YAML")
	_, err = Parse([]byte("lora:\n  adapters:\n    - name: a\n"), "f.yaml")
	require.ErrorContains(t, err, "targets")
}

func TestEnvironmentOverrides(t *testing.T) {
	p := filepath.Join(t.TempDir(), "e.yaml")
	require.NoError(t, os.WriteFile(p, []byte("parallel:\n  attention_tp_size: 1\n"), 0o644))
	t.Setenv("GLMFLASH_ENGINE_PARALLEL__ATTENTION_TP_SIZE", "4")
	t.Setenv("GLMFLASH_ENGINE_PARALLEL__ATTENTION_TP_RANK", "3")
	e, err := Load(p)
	require.NoError(t, err)
	require.Equal(t, 4, e.Parallel.AttentionTPSize)
	require.Equal(t, 3, e.Parallel.AttentionTPRank)
	t.Setenv("GLMFLASH_ENGINE_PARALLEL__ATTENTON_TP_SIZE", "4")
	_, err = Load(p)
	require.ErrorContains(t, err, "attenton_tp_size")
}

func FuzzParse(f *testing.F) {
	b, err := os.ReadFile(filepath.Join("..", "..", "configs", "engine.yaml"))
	require.NoError(f, err)
	f.Add(b)
	f.Add([]byte("passes: []\n"))
	f.Add([]byte("passes:\n  - name: x\n    enabled: false\n    options: {a: [1,2]}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = Parse(b, "fuzz")
	})
}

func TestPluginSettings(t *testing.T) {
	sum := strings.Repeat("ab", 32)
	e, err := Parse([]byte("plugins:\n  dir: /opt/p\n  allow_unverified: true\n  timeout_ms: 500\n  checksums:\n    glmflash-pass-x: "+sum+"\n"), "f.yaml")
	require.NoError(t, err)
	require.True(t, e.Plugins.AllowUnverified)
	require.Equal(t, sum, e.Plugins.Checksums["glmflash-pass-x"])
	require.False(t, Default().Plugins.AllowUnverified)
	_, err = Parse([]byte("plugins:\n  checksums:\n    glmflash-pass-x: abc\n"), "f.yaml")
	require.ErrorContains(t, err, "plugins.checksums.glmflash-pass-x")
	_, err = Parse([]byte("plugins:\n  allow_unverifed: true\n"), "f.yaml")
	require.ErrorContains(t, err, "allow_unverifed")
}
