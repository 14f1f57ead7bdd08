//go:build race

package keygen_test

// raceEnabled: the race detector makes sync.Pool drop items at random, so
// allocation counts that rely on the pool are not checked under -race.
const raceEnabled = true
