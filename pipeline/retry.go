package pipeline

import "time"

// RetryConfig configures in-process retries (receiver's WithRetry):
// cenkalti/backoff/v5's exponential backoff. Every zero field means its
// default, so RetryConfig{} is 3 tries, waits from 100ms doubling to at
// most 2s with ±50% jitter, at most 10s in all. Only what the policy
// classifies as retryable is retried.
type RetryConfig struct {
	// InitialInterval is the first wait. Zero means 100ms.
	InitialInterval time.Duration
	// Multiplier grows each wait. Zero means 2; it must be 1 or more.
	Multiplier float64
	// MaxInterval caps each wait. Zero means 2s, or InitialInterval when
	// that is longer.
	MaxInterval time.Duration
	// RandomizationFactor is the jitter: each wait is ±this fraction.
	// Zero means 0.5; a negative value means no jitter.
	RandomizationFactor float64
	// MaxElapsedTime bounds the time spent retrying one delivery. Zero
	// means 10s.
	MaxElapsedTime time.Duration
	// MaxTries counts the first try; 1 disables retrying. Zero means 3.
	MaxTries int
	// OnRetry, when set, is called before each wait.
	OnRetry func(try int, err error, wait time.Duration)
}
