package postgres

// Internals for the tests of package postgres_test.

// Reruns is how many claims ran again after the READ COMMITTED corner.
func (s *Store) Reruns() int64 { return s.reruns.Load() }

// CleanupLockKey is the advisory lock key of the store's cleaner.
func (s *Store) CleanupLockKey() int64 { return s.cleanupKey }
