//go:build !unix

package testenv

import (
	"errors"
	"time"
)

// ProcessCPU: this platform does not tell (see cpu_unix.go).
func ProcessCPU() (time.Duration, error) { return 0, errors.ErrUnsupported }
