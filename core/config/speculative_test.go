package config

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The speculative section: off by default; mtp with a preset, num_steps or
// both agreeing (5-1-6 when neither is given); index sharing unset (the
// checkpoint's) or forced; every bad value a KeyError naming the key and
// its source; environment variables and flags override the file.
func TestSpeculativeSection(t *testing.T) {
	d := Default()
	require.False(t, d.Speculative.On())
	require.Equal(t, "off", d.Speculative.String())
	require.Equal(t, 0, d.Speculative.Steps())

	for yaml, want := range map[string]struct {
		steps int
		share func(bool) bool
	}{
		"speculative: {method: mtp}\n":                                    {5, func(c bool) bool { return c }},
		"speculative: {method: mtp, preset: 1-1-2}\n":                     {1, func(c bool) bool { return c }},
		"speculative: {method: mtp, num_steps: 3}\n":                      {3, func(c bool) bool { return c }},
		"speculative: {method: mtp, num_steps: 5, preset: 5-1-6}\n":       {5, func(c bool) bool { return c }},
		"speculative: {method: mtp, preset: 7-1-8, index_share: false}\n": {7, func(bool) bool { return false }},
		"speculative: {method: mtp, num_steps: 2, index_share: true}\n":   {2, func(bool) bool { return true }},
	} {
		c, err := load(t, yaml)
		require.NoError(t, err, yaml)
		require.True(t, c.Speculative.On(), yaml)
		require.Equal(t, want.steps, c.Speculative.Steps(), yaml)
		for _, ck := range []bool{false, true} {
			require.Equal(t, want.share(ck), c.Speculative.Share(ck), yaml)
		}
	}
	for yaml, want := range map[string]string{
		"speculative: {method: eagle}\n":                            `speculative.method (`,
		"speculative: {method: mtp, num_steps: -1}\n":               "speculative.num_steps (",
		"speculative: {method: mtp, num_steps: 33}\n":               "must be in [1, 32]",
		"speculative: {method: mtp, preset: 5-2-6}\n":               "topk must be 1",
		"speculative: {method: mtp, preset: 5-1-5}\n":               "num_draft_tokens must be num_steps+1",
		"speculative: {method: mtp, preset: fast}\n":                "speculative.preset (",
		"speculative: {method: mtp, preset: 5-1-6, num_steps: 2}\n": "disagrees with speculative.preset 5-1-6",
		"speculative: {method: mtp, num_steps: 2.5}\n":              "speculative.num_steps",
		"speculative: {method: mtp, index_share: maybe}\n":          "speculative.index_share",
		"speculative: {metod: mtp}\n":                               `unknown key "speculative.metod"`,
	} {
		_, err := load(t, yaml)
		require.ErrorContains(t, err, want, yaml)
	}
	// the environment overrides the file, and errors name the variable
	c, err := load(t, "speculative: {method: mtp, preset: 1-1-2}\n", "GLMFLASH_SPECULATIVE__PRESET=5-1-6", "GLMFLASH_SPECULATIVE__INDEX_SHARE=false")
	require.NoError(t, err)
	require.Equal(t, 5, c.Speculative.Steps())
	require.False(t, c.Speculative.Share(true))
	_, err = load(t, "", "GLMFLASH_SPECULATIVE__METHOD=mtp", "GLMFLASH_SPECULATIVE__NUM_STEPS=x")
	require.ErrorContains(t, err, "GLMFLASH_SPECULATIVE__NUM_STEPS")
	_, err = load(t, "", "GLMFLASH_SPECULATIVE__METHOD=draft")
	require.ErrorContains(t, err, "environment variable GLMFLASH_SPECULATIVE__METHOD")
	// flags override both
	c, err = Load(Options{Environ: []string{"GLMFLASH_SPECULATIVE__METHOD=off"}, Flags: []Flag{{Key: "speculative.method", Value: "mtp", Name: "--speculative"}, {Key: "speculative.num_steps", Value: "4", Name: "--speculative"}}})
	require.NoError(t, err)
	require.Equal(t, "mtp 4-1-5", c.Speculative.String())
}

func TestSpecPresets(t *testing.T) {
	for s, steps := range map[string]int{"5-1-6": 5, "1-1-2": 1, "3-1-4": 3, "32-1-33": 32} {
		p, err := ParseSpecPreset(s)
		require.NoError(t, err, s)
		require.Equal(t, steps, p.Steps)
	}
	for _, bad := range []string{"5-2-6", "5-1-5", "0-1-1", "x", "5-1", "a-1-2", "33-1-34", ""} {
		_, err := ParseSpecPreset(bad)
		require.Error(t, err, bad)
	}
}

// Method dflash: the drafter's directory is required (relative to the
// file that names it); the MTP chain's keys are refused naming them, and a
// draft_model without method dflash too.
func TestSpeculativeDFlash(t *testing.T) {
	c, err := load(t, "speculative: {method: dflash, draft_model: /ckpt/dflash}\n")
	require.NoError(t, err)
	require.True(t, c.Speculative.On())
	require.True(t, c.Speculative.DFlash())
	require.Zero(t, c.Speculative.Steps(), "the drafter's block gives its drafts")
	require.Equal(t, "dflash /ckpt/dflash", c.Speculative.String())
	for yaml, want := range map[string]string{
		"speculative: {method: dflash}\n":                                    "speculative.draft_model (",
		"speculative: {method: dflash, draft_model: d, preset: 5-1-6}\n":     "speculative.preset (",
		"speculative: {method: dflash, draft_model: d, num_steps: 3}\n":      "speculative.num_steps (",
		"speculative: {method: dflash, draft_model: d, index_share: true}\n": "speculative.index_share (",
		"speculative: {method: mtp, draft_model: d}\n":                       "speculative.draft_model (",
		"speculative: {draft_model: d}\n":                                    "set speculative.method dflash",
		"speculative: {method: medusa, draft_model: d}\n":                    "must be off, mtp or dflash",
	} {
		_, err := load(t, yaml)
		require.ErrorContains(t, err, want, yaml)
	}
	c, err = load(t, "model: {preset: tiny-dflash}\nspeculative: {method: dflash}\n")
	require.NoError(t, err, "a -dflash preset brings its drafter")
	require.Empty(t, c.Speculative.DraftModel)
	c, err = Load(Options{Flags: []Flag{{Key: "speculative.method", Value: "dflash", Name: "--speculative"}, {Key: "speculative.draft_model", Value: "rel/dflash", Name: "--draft-model"}}})
	require.NoError(t, err)
	require.Equal(t, "rel/dflash", c.Speculative.DraftModel, "a flag's path is relative to the working directory")
}
