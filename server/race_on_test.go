//go:build race

package server_test

// raceEnabled: the race detector runs (the tests' timing is several times
// slower, and CPU-bound work much more so).
const raceEnabled = true
