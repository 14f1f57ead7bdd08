// Package configerr makes the *oncemill.ConfigError every constructor and
// Build in oncemill return for a setting that cannot work.
package configerr

import (
	"errors"
	"fmt"

	"github.com/oncemill/oncemill"
)

// New returns a *oncemill.ConfigError for setting; format and args make its
// Problem. A %w verb in format sets Err.
func New(setting, format string, args ...any) *oncemill.ConfigError {
	e := fmt.Errorf(format, args...)
	return &oncemill.ConfigError{Setting: setting, Problem: e.Error(), Err: errors.Unwrap(e)}
}
