//go:build unix

package testenv

import (
	"fmt"
	"syscall"
	"time"
)

// ProcessCPU is the CPU time this process has used so far, user and
// system, from getrusage: its goroutines, its garbage collector and its
// system calls. A benchmark reads it around a variant's rounds for the
// client's share of a message.
func ProcessCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
