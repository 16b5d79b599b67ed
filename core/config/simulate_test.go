package config

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// speculative.simulate_acceptance: off (0) by default; a per-draft rate in
// (0, 1] with speculative decoding on, which String reports; anything else
// refused naming the key, from the file and from the environment.
func TestSimulateAcceptance(t *testing.T) {
	require.Zero(t, Default().Speculative.SimulateAcceptance)
	c, err := load(t, "speculative: {method: mtp, num_steps: 3, simulate_acceptance: 0.75}\n")
	require.NoError(t, err)
	require.Equal(t, 0.75, c.Speculative.SimulateAcceptance)
	require.Equal(t, "mtp 3-1-4, simulated acceptance 0.75", c.Speculative.String())
	c, err = load(t, "speculative: {method: mtp, simulate_acceptance: 1}\n")
	require.NoError(t, err)
	require.Equal(t, 1.0, c.Speculative.SimulateAcceptance)
	for yaml, want := range map[string]string{
		"speculative: {method: mtp, simulate_acceptance: 1.5}\n":  "speculative.simulate_acceptance (",
		"speculative: {method: mtp, simulate_acceptance: -0.2}\n": "must be a per-draft acceptance rate in (0, 1] (0: off), got -0.2",
		"speculative: {method: mtp, simulate_acceptance: .nan}\n": "speculative.simulate_acceptance",
		"speculative: {method: mtp, simulate_acceptance: high}\n": "speculative.simulate_acceptance",
		"speculative: {simulate_acceptance: 0.5}\n":               "0.5 needs speculative decoding on (speculative.method is off)",
	} {
		_, err := load(t, yaml)
		require.ErrorContains(t, err, want, yaml)
	}
	_, err = load(t, "speculative: {method: mtp}\n", "GLMFLASH_SPECULATIVE__SIMULATE_ACCEPTANCE=2")
	require.ErrorContains(t, err, "GLMFLASH_SPECULATIVE__SIMULATE_ACCEPTANCE")
}
