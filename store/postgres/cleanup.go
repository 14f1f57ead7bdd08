package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// DeleteExpired removes expired records on demand, a batch at a time,
// beside the background cleaner (Options.CleanupInterval), or instead of it
// when that is off: one bounded DELETE of up to limit expired records
// (expired leases included) whose purge time has come (the claim's
// LeaseRequest.Retain), oldest first, returning how many it removed. Until
// then an expired lease keeps its attempt count for the next ClaimLease;
// after it, the next ClaimLease of the key starts again at attempt 1. To
// remove everything expired, call it until it returns 0. It skips rows
// that another transaction holds (FOR UPDATE SKIP LOCKED), so it never waits
// for a ClaimLease, and holds its own row locks for one short statement.
func (s *Store) DeleteExpired(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, invalid("delete expired", "limit is %d, must be positive", limit)
	}
	ctx, cancel, err := s.enter(ctx, "delete expired", 0)
	if err != nil {
		return 0, err
	}
	defer s.leave(cancel)
	var n int
	var newest time.Time
	if err := s.pool.QueryRow(ctx, s.sql.cleanupBatch, limit, time.Time{}).Scan(&n, &newest); err != nil {
		return 0, wrap("delete expired", err)
	}
	s.telemetry.deleted.Add(ctx, int64(n), s.telemetry.tableAttrs)
	return n, nil
}

// cleanupPass removes every expired record in batches of
// Options.CleanupBatch, unless another worker is cleaning the same table:
// then it returns at once with ran false. The background cleaner runs it
// every Options.CleanupInterval.
//
// One cleaner at a time: the pass holds a session advisory lock
// (pg_try_advisory_lock) on a connection of its own for its duration, and a
// worker that dies mid-pass releases it with its session. Each batch is its
// own short transaction, so no lock is held from one batch to the next.
func (s *Store) cleanupPass(ctx context.Context) (removed int, ran bool, err error) {
	s.cleanupMu.Lock()
	defer s.cleanupMu.Unlock()

	actx, cancel := context.WithTimeout(ctx, s.opts.StatementTimeout)
	defer cancel()
	conn, err := s.pool.Acquire(actx)
	if err != nil {
		return 0, false, wrap("cleanup", err)
	}
	var locked bool
	if err := conn.QueryRow(actx, "SELECT pg_try_advisory_lock($1)", s.cleanupKey).Scan(&locked); err != nil {
		conn.Release()
		return 0, false, wrap("cleanup: taking the cleaner lock", err)
	}
	if !locked {
		conn.Release()
		return 0, false, nil
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.StatementTimeout)
		defer cancel()
		var unlocked bool
		if uerr := conn.QueryRow(uctx, "SELECT pg_advisory_unlock($1)", s.cleanupKey).Scan(&unlocked); uerr != nil || !unlocked {
			// Ending the session is the sure way to drop the lock.
			_ = conn.Conn().Close(uctx)
		}
		conn.Release()
	}()

	if s.opts.Layout == LayoutPartitioned {
		// Partition upkeep instead of DELETE batches.
		if err := s.ensurePartitions(ctx); err != nil {
			return 0, true, err
		}
		removed, err := s.dropPartitions(ctx)
		s.telemetry.deleted.Add(ctx, int64(removed), s.telemetry.tableAttrs)
		if err != nil {
			return removed, true, err
		}
		return removed, true, s.buildKeyFilters(ctx)
	}
	batch := s.opts.CleanupBatch
	cursor := time.Time{} // older than any row
	for {
		if err := ctx.Err(); err != nil {
			return removed, true, fmt.Errorf("oncemill: postgres: cleanup: %w", err)
		}
		start := time.Now()
		var n int
		bctx, cancel := context.WithTimeout(ctx, s.opts.StatementTimeout)
		err := conn.QueryRow(bctx, s.sql.cleanupBatch, batch, cursor).Scan(&n, &cursor)
		cancel()
		if err != nil {
			return removed, true, wrap("cleanup", err)
		}
		removed += n
		s.telemetry.deleted.Add(ctx, int64(n), s.telemetry.tableAttrs)
		if n < batch {
			return removed, true, nil
		}
		// Between full batches, rest for a share of the time the batch took,
		// so a large backlog leaves the database to the handlers most of
		// the time (Options.CleanupDuty).
		if pause := s.cleanupPause(time.Since(start)); pause > 0 {
			t := time.NewTimer(pause)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
	}
}

// cleaner runs a cleanup pass every interval until ctx ends.
func (s *Store) cleaner(ctx context.Context, interval time.Duration) {
	defer close(s.cleanerDone)
	t := time.NewTicker(interval)
	defer t.Stop()
	// The partitioned layout's upkeep runs at once: a worker that starts
	// with no partition for now creates it before its first claim needs it.
	first := s.opts.Layout == LayoutPartitioned
	for {
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		first = false
		removed, ran, err := s.cleanupPass(ctx)
		if s.opts.Layout == LayoutPartitioned && ctx.Err() == nil {
			// Every worker, leader or not, loads the filters its claims use.
			if ferr := s.refreshKeyFilters(ctx); ferr != nil {
				err = errors.Join(err, ferr)
			}
		}
		switch {
		case err != nil && ctx.Err() == nil:
			s.opts.Logger.Error("oncemill: cleanup pass failed; it runs again next interval", "error", err, "removed", removed, "table", s.opts.Schema+"."+s.opts.Table)
		case ran && removed > 0:
			s.opts.Logger.Debug("oncemill: cleanup pass", "removed", removed, "table", s.opts.Schema+"."+s.opts.Table)
		}
	}
}

// cleanupPause is how long to rest after a full batch that took d, so that
// cleanup is busy for the CleanupDuty share of the time.
func (s *Store) cleanupPause(d time.Duration) time.Duration {
	duty := s.opts.CleanupDuty
	if duty >= 1 {
		return 0
	}
	return time.Duration(float64(d) * (1 - duty) / duty)
}
