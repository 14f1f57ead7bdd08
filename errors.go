package oncemill

import (
	"errors"
)

// ErrInvalidConfig is wrapped by every error a constructor or Build in
// oncemill returns for a setting that cannot work. The error is a
// *ConfigError naming the setting and what to change.
var ErrInvalidConfig = errors.New("oncemill: invalid configuration")

// ConfigError is a setting that cannot work. Its message names the setting
// and says what to change; errors.Is(err, ErrInvalidConfig) holds for it.
type ConfigError struct {
	// Setting names what is wrong, as the user wrote it: "WithScope",
	// "WithPolicy(Policy.LeaseDuration)", "WithRetry(RetryConfig.MaxTries)",
	// "postgres.Options.Schema".
	Setting string
	// Problem says what is wrong and what to change.
	Problem string
	// Err is the underlying cause, if any (a parse error, for example).
	Err error
}

func (e *ConfigError) Error() string {
	return "oncemill: invalid configuration: " + e.Setting + ": " + e.Problem
}

// Unwrap returns ErrInvalidConfig and the cause.
func (e *ConfigError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrInvalidConfig}
	}
	return []error{ErrInvalidConfig, e.Err}
}
