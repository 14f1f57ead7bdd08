//go:build !unix

package redisstore_test

import "time"

// processCPU: this platform does not tell (see cpu_unix_test.go).
func processCPU() (time.Duration, bool) { return 0, false }
