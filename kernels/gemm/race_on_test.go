//go:build race

package gemm

// raceOn: the race detector makes sync.Pool drop items at random, so
// pooled scratch is reallocated.
const raceOn = true
