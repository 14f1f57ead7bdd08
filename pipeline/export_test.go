package pipeline

// StoreFailuresInARow is how many Begins failed in a row, for tests.
func StoreFailuresInARow(s *Idempotency) int { return int(s.storeFailures.Load()) }
