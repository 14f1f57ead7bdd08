package postgres

// Internals for the tests of package postgres_test.

// BeginQueueLen is how many Begins wait for a batch worker.
func (s *Store) BeginQueueLen() int { return s.begins.queued() }

// CompleteQueueLen is how many Completes wait for a batch worker.
func (s *Store) CompleteQueueLen() int { return s.completes.queued() }

// Reruns is how many Begins ran again after the READ COMMITTED corner.
func (s *Store) Reruns() int64 { return s.reruns.Load() }

// CleanupLockKey is the advisory lock key of the store's cleaner.
func (s *Store) CleanupLockKey() int64 { return s.cleanupKey }
