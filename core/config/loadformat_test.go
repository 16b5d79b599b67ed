package config

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// model.load_format: auto by default; dummy over a preset or a directory
// (model.set scaling either), its weights mode left unresolved; bad values
// and settings that have no meaning with dummy weights refused, naming the
// key.
func TestLoadFormat(t *testing.T) {
	cfg, err := Load(Options{Environ: []string{}})
	require.NoError(t, err)
	require.Equal(t, LoadAuto, cfg.Model.LoadFormat)
	require.False(t, cfg.Model.Dummy())

	for _, c := range []struct{ yaml, device string }{
		{"model: {preset: tiny, load_format: dummy, set: {num_hidden_layers: 20}}\n", "cpu"},
		{"model: {dir: /m, load_format: dummy, set: {num_hidden_layers: 20}}\n", "cuda"},
		{"model: {dir: /m, load_format: safetensors}\n", "cpu"},
	} {
		cfg, err := Load(Options{Files: []string{writeYAML(t, c.yaml)}, Environ: []string{}, Flags: []Flag{{Key: "device", Value: c.device, Name: "--device"}}})
		require.NoError(t, err, c.yaml)
		if cfg.Model.Dummy() {
			require.Equal(t, WeightsAuto, cfg.Model.Weights, "no files: no weights mode")
			require.NoError(t, cfg.Validate(), "validates twice")
		}
	}
	cfg, err = Load(Options{Environ: []string{"GLMFLASH_MODEL__LOAD_FORMAT=dummy"}})
	require.NoError(t, err)
	require.True(t, cfg.Model.Dummy())
	require.Equal(t, "small", cfg.Model.Preset, "the default preset's config")

	for yaml, want := range map[string]string{
		"model: {load_format: random}\n":                                  `model.load_format: "random" is not auto, safetensors or dummy`,
		"model: {preset: \"\", load_format: dummy}\n":                     "model.load_format: dummy needs a config: model.preset (a preset's) or model.dir",
		"model: {dir: /m, set: {num_hidden_layers: 2}}\n":                 "model.set: scales a preset (or, with model.load_format dummy, the config.json of model.dir)",
		"model: {dir: /m, load_format: dummy, fp8: true}\n":               "model.fp8: with model.load_format dummy and model.dir the layout is the config.json's",
		"model: {preset: tiny, load_format: dummy, weights: guarded}\n":   `model.weights: "guarded" says how a checkpoint's files are held; model.load_format dummy reads none`,
		"model: {preset: tiny, load_format: dummy, weights: copy}\n":      `model.weights: "copy" says how`,
		"model: {preset: tiny, load_format: safetensors, weights: odd}\n": `model.weights: "odd" is not auto, copy or guarded`,
	} {
		_, err := Load(Options{Files: []string{writeYAML(t, yaml)}, Environ: []string{}})
		key, msg, _ := strings.Cut(want, ": ")
		require.ErrorContains(t, err, key+" (", yaml)
		require.ErrorContains(t, err, msg, yaml)
	}
}
