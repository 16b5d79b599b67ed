//go:build race

package parallel

const raceOn = true
