//go:build !race

package gemm

const raceOn = false
