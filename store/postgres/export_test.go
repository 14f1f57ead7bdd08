package postgres

import "context"

// Internals for the tests of package postgres_test.

// Reruns is how many claims ran again after the READ COMMITTED corner.
func (s *Store) Reruns() int64 { return s.reruns.Load() }

// CleanupPass runs one pass of the background cleaner now.
func (s *Store) CleanupPass(ctx context.Context) (removed int, ran bool, err error) {
	return s.cleanupPass(ctx)
}

// CleanupLockKey is the advisory lock key of the store's cleaner.
func (s *Store) CleanupLockKey() int64 { return s.cleanupKey }

// Statements are the store's statements as sent, by name.
func (s *Store) Statements() map[string]string {
	q := s.sql
	return map[string]string{
		"begin": q.begin, "claimNew": q.claimNew, "claim": q.claim, "commitResult": q.commitResult,
		"recordRollback": q.recordRollback, "complete": q.complete, "extend": q.extend, "release": q.release,
		"releaseDelete": q.releaseDelete, "get": q.get, "del": q.del,
		"cleanupBatch": q.cleanupBatch, "cleanupLag": q.cleanupLag,
	}
}

// PartitionedStatements are the partitioned layout's statements that read
// or write the table, by name (empty in the DELETE layout).
func (s *Store) PartitionedStatements() map[string]string {
	q := s.sql
	return map[string]string{
		"partClaimLease": q.partClaimLease, "partClaimTx": q.partClaimTx, "partRecordRollback": q.partRecordRollback,
	}
}

// MigrateTo applies the embedded migrations up to version, and no further.
func (s *Store) MigrateTo(ctx context.Context, version int) error { return s.migrateTo(ctx, version) }

// Defaults and bounds the tests compare against.
const (
	DefaultTable       = defaultTable
	MaxErrorMessageLen = maxErrorMessageLen
)

// SchemaVersion is the newest schema version Migrate applies.
var SchemaVersion = schemaVersion

// WatermarkStatements are the watermark mode's statements of the delivery
// path and of MoveWatermark, by name (not the operator's listing, which
// reads the table).
func (s *Store) WatermarkStatements() map[string]string {
	q := s.wm
	return map[string]string{
		"wmClaim": q.claim, "wmClaimNew": q.claimNew, "wmCommitResult": q.commitResult, "wmRetryable": q.retryable, "wmFailed": q.failed,
		"wmLock": q.lock, "wmMove": q.move,
	}
}
