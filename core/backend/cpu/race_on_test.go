//go:build race

package cpu_test

// raceEnabled: the race detector makes sync.Pool drop items at random, so
// pooled scratch is reallocated and allocation counts are not zero.
const raceEnabled = true
