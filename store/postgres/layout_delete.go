package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres/internal/claimtx"
	"github.com/oncemill/oncemill/store/postgres/internal/pgerr"
)

// deleteLayout is the layout of one plain table (LayoutDelete), whose
// primary key keeps a key to one row, and whose expired rows the cleaner
// deletes in bounded batches walking the purge_at index.
type deleteLayout struct{ *Store }

var _ layout = deleteLayout{}

func (s deleteLayout) claimLease(ctx context.Context, req store.LeaseRequest) (store.ClaimResult, error) {
	return claimStatement(ctx, s.pool, s.sql.begin, req.Scope, req.Key, req.Fingerprint,
		micros(req.LeaseDuration), micros(req.LeaseDuration+req.Retain), req.MessageUUID)
}

// claimTx begins the transaction and claims the key in it: BEGIN and
// sqlClaimNew in one round trip (pgx.Batch.BeginTx), which takes a new key
// without waiting, an insert as small as a hand-written inbox's; for a key
// that has a row, or is held, sqlClaim decides in a second round trip,
// waiting for the holder up to the claim's bound.
func (s deleteLayout) claimTx(ctx context.Context, conn *pgxpool.Conn, req store.TxRequest, purge time.Duration, waitMS int64, h uint64) (store.ClaimResult, pgx.Tx, error) {
	lock := claimLockKey(h)
	b := &pgx.Batch{}
	b.BeginTx(s.opts.TxOptions)
	b.Queue(s.sql.claimNew, newKeyArgs(true, &req, purge, lock)...)
	br := conn.SendBatch(ctx, b)
	taken, err := batchInserted(br)
	tx := br.Tx()
	switch {
	case err != nil:
		return store.ClaimResult{}, tx, err
	case taken:
		return newKeyClaim(&req), tx, nil
	}
	res, err := claimStatement(ctx, tx, s.sql.claim, req.Scope, req.Key, req.Fingerprint,
		micros(claimTTL(req.SuccessTTL)), micros(purge), req.MessageUUID, waitMS, lock)
	return res, tx, err
}

// deferredClaim is sqlClaimNewDeferred, which takes the key's lock itself.
func (s deleteLayout) deferredClaim(req *store.TxRequest, purge time.Duration, h uint64) (claimtx.Claim, pgx.TxOptions) {
	return claimtx.Claim{Scope: req.Scope, Key: req.Key, Insert: s.sql.claimDeferred, Args: newKeyArgs(true, req, purge, claimLockKey(h))}, s.opts.TxOptions
}

func (s deleteLayout) recordRollback(ctx context.Context, lease store.Claim, fingerprint string, out store.Completion) (int64, error) {
	tag, err := s.pool.Exec(ctx, s.sql.recordRollback, lease.Scope, lease.Key, fingerprint, int16(out.Status), lease.Token, int32(lease.Attempt)-uncounted(out),
		micros(out.TTL), pgerr.StorableText(string(out.ErrorKind), pgerr.MaxErrorKindLen), pgerr.StorableText(out.ErrorMessage, pgerr.MaxErrorMessageLen), micros(out.TTL),
		claimLockKey(keyHash(lease.Scope, lease.Key)), pgerr.StorableText(lease.MessageUUID, pgerr.MaxMessageUUIDLen), micros(out.RetryAfter))
	return tag.RowsAffected(), err
}

// mend mends nothing: the table lacks nothing a statement finds missing.
func (deleteLayout) mend(context.Context, error, *mends) (bool, error) { return false, nil }

func (s deleteLayout) cleanupLag(ctx context.Context) (time.Duration, error) {
	var secs float64
	if err := s.pool.QueryRow(ctx, s.sql.cleanupLag).Scan(&secs); err != nil {
		return 0, wrap("cleanup lag", err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// clean removes every expired record in batches of Options.CleanupBatch.
// Each batch is its own short transaction, so no lock is held from one
// batch to the next.
func (s deleteLayout) clean(ctx context.Context, leader *pgxpool.Conn) (removed int, err error) {
	if leader == nil {
		return 0, nil
	}
	batch := s.opts.CleanupBatch
	cursor := time.Time{} // older than any row
	for {
		if err := ctx.Err(); err != nil {
			return removed, fmt.Errorf("oncemill: postgres: cleanup: %w", err)
		}
		start := time.Now()
		var n int
		bctx, cancel := context.WithTimeout(ctx, s.opts.StatementTimeout)
		err := leader.QueryRow(bctx, s.sql.cleanupBatch, batch, cursor).Scan(&n, &cursor)
		cancel()
		if err != nil {
			return removed, wrap("cleanup", err)
		}
		removed += n
		s.metrics.Removed(ctx, n)
		if n < batch {
			return removed, nil
		}
		// Between full batches, rest for a share of the time the batch took,
		// so a large backlog leaves the database to the handlers most of
		// the time (Options.CleanupDuty).
		s.cleanupRest(ctx, time.Since(start))
		if s.opts.betweenBatches != nil {
			s.opts.betweenBatches()
		}
	}
}

// dropExpired drops nothing: DeleteExpired's DELETE does it all.
func (deleteLayout) dropExpired(context.Context) (int, error) { return 0, nil }

// migrate refuses a table of the partitioned layout.
func (s deleteLayout) migrate(ctx context.Context, version int) error {
	_, err := s.migrateTables(ctx, version, func(_ pgx.Tx, kind string, current int) (int, error) {
		if kind == "p" {
			return 0, fmt.Errorf("oncemill: postgres: migrate: table %s has the partitioned layout: %s", s.names.table, setPartitioned)
		}
		return current, nil
	})
	return err
}
