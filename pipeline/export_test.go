package pipeline

import "time"

// StoreFailuresInARow is how many Begins failed in a row, for tests.
func StoreFailuresInARow(s *Idempotency) int { return int(s.storeFailures.Load()) }

// AttemptPause is the pause before the nack of attempt's retryable
// failure, for tests.
func AttemptPause(s *Idempotency, attempt int) time.Duration { return s.attemptPause(attempt) }
