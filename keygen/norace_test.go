//go:build !race

package keygen_test

const raceEnabled = false
