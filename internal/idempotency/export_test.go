package idempotency

import "time"

// StoreFailuresInARow is how many claims failed in a row, for tests.
func StoreFailuresInARow(s *Leased) int { return int(s.storeFailures.Load()) }

// AttemptPause is the pause before the nack of attempt's retryable
// failure, for tests.
func AttemptPause(s *Leased, attempt int) time.Duration { return s.attemptPause(attempt) }
