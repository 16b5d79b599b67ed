//go:build race

package tests

// raceEnabled: the race detector slows the engine ~10×; statistical tests
// draw fewer samples under it (the scheduler's concurrency is what -race
// checks, and the full-size run is part of the plain test pass).
const raceEnabled = true
