package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/oncemill/oncemill/store/postgres/internal/pgerr"
)

// Internals for the tests of package postgres_test.

// Reruns is how many claims ran again after the READ COMMITTED corner.
func (s *Store) Reruns() int64 { return s.reruns.Load() }

// CleanupPass runs one pass of the background cleaner now, the loading of
// the key filters included.
func (s *Store) CleanupPass(ctx context.Context) (removed int, ran bool, err error) {
	return s.cleanerPass(ctx)
}

// WithPartitionWidth returns o with partitions w wide in place of the
// width o.Retention gives (partitionWidth, at least a minute), so that a
// benchmark spans several retentions in minutes. w is whole seconds: the
// partitions are named to the second (partitionName).
func WithPartitionWidth(o Options, w time.Duration) Options {
	if w < time.Second || w%time.Second != 0 {
		panic(fmt.Sprintf("WithPartitionWidth(%v): use whole seconds", w))
	}
	o.width = w
	return o
}

// WithBetweenBatches returns o with f run between two batches of a DELETE
// layout's cleanup pass, after its rest.
func WithBetweenBatches(o Options, f func()) Options {
	o.betweenBatches = f
	return o
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
	var q partClaims
	if p, ok := s.layout.(*partitionedLayout); ok {
		q = p.part.everywhere
	}
	return map[string]string{
		"partClaimLease": q.lease, "partClaimNew": q.new, "partClaimTx": q.tx, "partRecordRollback": q.rollback,
		"partCompleteMove": s.sql.completeMove, "partReleaseMove": s.sql.releaseMove, "partExtendMove": s.sql.extendMove,
	}
}

// partitionedLayout is s's layout, which must be the partitioned one.
func (s *Store) partitionedLayout() *partitionedLayout { return s.layout.(*partitionedLayout) }

// MigrateTo applies the embedded migrations up to version, and no further.
func (s *Store) MigrateTo(ctx context.Context, version int) error {
	return s.layout.migrate(ctx, version)
}

// Defaults and bounds the tests compare against.
const (
	DefaultTable       = defaultTable
	MaxErrorMessageLen = pgerr.MaxErrorMessageLen
)

// SchemaVersion is the newest schema version Migrate applies.
var SchemaVersion = schemaVersion

// PartitionWidth is the partition width a retention gives.
var PartitionWidth = partitionWidth

// KeyFilters is how many partitions' key filters claims consult now.
func (s *Store) KeyFilters() int {
	if f := s.partitionedLayout().keyFilters.Load(); f != nil {
		return len(f.filters)
	}
	return 0
}

// RefreshKeyFilters loads the key filters as every worker's cleaner does
// after its pass.
func (s *Store) RefreshKeyFilters(ctx context.Context) error {
	return s.partitionedLayout().refreshKeyFilters(ctx)
}

// ClaimLooksEverywhere reports whether a claim of scope/key now looks the
// key up in every partition (a filter may hold it, or none is loaded)
// rather than in the open ones only.
func (s *Store) ClaimLooksEverywhere(scope, key string) bool {
	p := s.partitionedLayout()
	return p.keyFilters.Load().claimsFor(keyHash(scope, key), &p.part.everywhere) == &p.part.everywhere
}

// WatermarkStatements are the watermark mode's statements of the delivery
// path and of MoveWatermark and DeleteWatermark, by name (not the operator's listing, which
// reads the table).
func (s *Store) WatermarkStatements() map[string]string {
	return s.watermarkStatements().ByName()
}

// NewKeyInOneStatement is the claim of a new key in one statement
// (sqlPartClaimNewCurrent, its token from the sequence) in the partition
// partitionName, [from, until). Its arguments: scope, key, fingerprint, expiry and
// purge time in microseconds, ClaimLockKey(scope, key), message UUID.
func (s *Store) NewKeyInOneStatement(partitionName string, from, until time.Time) string {
	return renderPartClaims(s.names, from, partition{name: partitionName, lower: from, upper: until}).newCurrent
}

// DeferredNewKey is the DELETE layout's deferred claim of a new key, and
// DeferredNewKeyInOneStatement the partitioned layout's into partitionName,
// whose own range guards the clock (the statement names no bound).
func (s *Store) DeferredNewKey() string { return s.sql.claimDeferred }

func (s *Store) DeferredNewKeyInOneStatement(partitionName string) string {
	return renderPartClaims(s.names, time.Time{}, partition{name: partitionName}).deferredCurrent
}

// ClaimLockKey is the second half of a claim's advisory lock key.
func ClaimLockKey(scope, key string) int32 { return claimLockKey(keyHash(scope, key)) }

// UnkeyedPartitions lists the partitions of the table without a unique
// index on (scope, key), as the store reads them (partition.keyed).
func (s *Store) UnkeyedPartitions(ctx context.Context) ([]string, error) {
	_, parts, err := s.listPartitions(ctx, s.pool)
	var names []string
	for _, p := range inTable(parts) {
		if !p.keyed {
			names = append(names, p.name)
		}
	}
	return names, err
}
