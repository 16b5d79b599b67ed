package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// --speculative METHOD[:STEPS|:PRESET] sets the speculative section's keys;
// malformed values are refused naming the flag.
func TestSpeculativeFlag(t *testing.T) {
	for v, want := range map[string]string{"off": "off", "mtp": "mtp 5-1-6", "mtp:3": "mtp 3-1-4", "mtp:1-1-2": "mtp 1-1-2"} {
		fl, err := speculativeFlags(v)
		require.NoError(t, err, v)
		mf := &modelFlags{extra: fl}
		c, err := mf.config()
		require.NoError(t, err, v)
		require.Equal(t, want, c.Speculative.String(), v)
	}
	for _, v := range []string{"off:3", "mtp:x"} {
		_, err := speculativeFlags(v)
		require.ErrorContains(t, err, "--speculative", v)
	}
	fl, err := speculativeFlags("eagle:2")
	require.NoError(t, err)
	_, err = (&modelFlags{extra: fl}).config()
	require.ErrorContains(t, err, "speculative.method (flag --speculative)")
}
