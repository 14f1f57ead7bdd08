package mysql

import (
	"context"
	"time"
)

// Internals for the tests of package mysql_test.

// DefaultTable is the table of Options without one.
const DefaultTable = defaultTable

// SchemaVersion is the newest schema version Migrate applies.
var SchemaVersion = schemaVersion

// CleanupPass runs one pass of the background cleaner now.
func (s *Store) CleanupPass(ctx context.Context) (removed int, ran bool, err error) {
	return s.cleanerPass(ctx)
}

// CleanupLock is the SQL of the cleaner's lock name.
func (s *Store) CleanupLock() string { return s.names.cleanupLock }

// WaitSecs is a wait as innodb_lock_wait_timeout takes it.
func WaitSecs(d time.Duration) int64 { return waitSecs(d) }

// CleanupLag is what the oncemill.store.cleanup.lag gauge reports.
func (s *Store) CleanupLag(ctx context.Context) (time.Duration, error) { return s.cleanupLag(ctx) }
