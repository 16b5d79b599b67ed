package model

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseGenerationConfig(t *testing.T) {
	g, err := ParseGenerationConfig([]byte(`{"eos_token_id": 7, "temperature": 0.6}`), "g.json")
	require.NoError(t, err)
	require.Equal(t, []int{7}, g.EOSTokenIDs)
	g, err = ParseGenerationConfig([]byte(`{"eos_token_id": [7, 9]}`), "g.json")
	require.NoError(t, err)
	require.Equal(t, []int{7, 9}, g.EOSTokenIDs)
	g, err = ParseGenerationConfig([]byte(`{"eos_token_id": null}`), "g.json")
	require.NoError(t, err)
	require.Empty(t, g.EOSTokenIDs)
	_, err = ParseGenerationConfig([]byte(`{"eos_token_id": "x"}`), "g.json")
	require.ErrorContains(t, err, "g.json: eos_token_id")
	_, err = ParseGenerationConfig([]byte(`{"eos_token_id": [1.5]}`), "g.json")
	require.ErrorContains(t, err, "eos_token_id[0]")
	_, err = ParseGenerationConfig([]byte(`[]`), "g.json")
	require.Error(t, err)
}

// A checkpoint's EOS ids are config.json's and generation_config.json's;
// an id outside the vocabulary is an error naming the field.
func TestOpenMergesGenerationConfigEOS(t *testing.T) {
	d := t.TempDir()
	for _, f := range []string{ConfigFile, SingleFile} {
		b, err := os.ReadFile(filepath.Join(fixtureDir, f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(d, f), b, 0o644))
	}
	ck, err := Open(d)
	require.NoError(t, err)
	require.Empty(t, ck.Config().EOSTokenIDs, "the fixture has none")
	ck.Close()
	require.NoError(t, os.WriteFile(filepath.Join(d, GenerationConfigFile), []byte(`{"eos_token_id": [5, 6]}`), 0o644))
	ck, err = Open(d)
	require.NoError(t, err)
	require.Equal(t, []int{5, 6}, ck.Config().EOSTokenIDs)
	ck.Close()
	require.NoError(t, os.WriteFile(filepath.Join(d, GenerationConfigFile), []byte(`{"eos_token_id": 999}`), 0o644))
	_, err = Open(d)
	require.ErrorContains(t, err, "eos_token_id[0] (999)")
	// the error names generation_config.json, not config.json (issue 37)
	require.NoError(t, os.WriteFile(filepath.Join(d, GenerationConfigFile), []byte(`{"eos_token_id": [1, 999]}`), 0o644))
	_, err = Open(d)
	require.EqualError(t, err, filepath.Join(d, GenerationConfigFile)+": eos_token_id[1] (999) must be a token id in [0, vocab_size 256 of config.json)")
}

func FuzzParseGenerationConfig(f *testing.F) {
	f.Add([]byte(`{"eos_token_id": [1, 2]}`))
	f.Add([]byte(`{"eos_token_id": 3}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := ParseGenerationConfig(b, "g.json"); err != nil {
			require.Contains(t, err.Error(), "g.json")
		}
	})
}
