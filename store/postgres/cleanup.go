package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DeleteExpired removes expired records on demand, beside the background
// cleaner (Options.CleanupInterval), or instead of it when that is off,
// and returns how many it removed. To remove everything expired, call it
// until it returns 0. What it does depends on the layout:
//
// LayoutDelete: one bounded DELETE of up to limit expired records (expired
// leases included) whose purge time has come (the claim's
// LeaseRequest.Retain), oldest first, walking the purge_at index. Until
// then an expired lease keeps its attempt count for the next ClaimLease;
// after it, the next ClaimLease of the key starts again at attempt 1. It
// skips rows that another transaction holds (FOR UPDATE SKIP LOCKED), so it
// never waits for a ClaimLease, and holds its own row locks for one short
// statement.
//
// LayoutPartitioned: first what the cleaner's pass does, unless another
// worker's cleaner is in one (the same one-leader lock): it drops every
// partition whose rows may all go, blocking no claim (dropPartition), and
// returns their rows, which may be more than limit (a partition goes whole
// or not at all), having deleted none. Only when no partition could go does
// it delete up to limit expired records past their purge time, with the
// rule and the locking of LayoutDelete, from the partitions that stay:
// with no purge_at index that statement reads every partition, which suits
// an operator or a test, not a program in a loop; the rows it deletes leave
// dead tuples in partitions that would go whole later anyway. Its bound is
// Options.StatementTimeout plus twice the upkeep's wait (the longer of
// StatementTimeout and CleanupInterval): one wait for the transactions
// older than the pass, one for a detach. A call that runs out returns the
// context's error, having dropped what it finished; a detach it cut short
// leaves the partition detaching, which the next pass finishes.
func (s *Store) DeleteExpired(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, invalid("delete expired", "limit is %d, must be positive", limit)
	}
	extra := time.Duration(0)
	if s.opts.Layout == LayoutPartitioned {
		extra = 2 * s.upkeepWait() // the wait for older transactions, and a detach
	}
	ctx, cancel, err := s.enter(ctx, "delete expired", extra)
	if err != nil {
		return 0, err
	}
	defer s.leave(cancel)
	if s.opts.Layout == LayoutPartitioned {
		dropped, err := s.asLeader(ctx, s.partitionUpkeep)
		s.telemetry.deleted.Add(ctx, int64(dropped), s.telemetry.tableAttrs)
		if err != nil || dropped > 0 {
			return dropped, err
		}
	}
	var n int
	var newest time.Time
	if err := s.pool.QueryRow(ctx, s.sql.cleanupBatch, limit, time.Time{}).Scan(&n, &newest); err != nil {
		return 0, wrap("delete expired", err)
	}
	s.telemetry.deleted.Add(ctx, int64(n), s.telemetry.tableAttrs)
	return n, nil
}

// asLeader runs f under the cleaner's one-leader lock, as cleanupPass
// does, or returns 0 at once when another worker holds it.
func (s *Store) asLeader(ctx context.Context, f func(context.Context) (int, error)) (int, error) {
	s.cleanupMu.Lock()
	defer s.cleanupMu.Unlock()
	_, unlock, ok, err := s.leaderLock(ctx)
	if err != nil || !ok {
		return 0, err
	}
	defer unlock()
	return f(ctx)
}

// leaderLock takes the cleaner's one-leader lock: a session advisory lock
// (pg_try_advisory_lock) on a connection of its own, which unlock gives
// back (a worker that dies releases it with its session), and which the
// holder may use until then. ok is false when another worker holds it. The
// caller holds cleanupMu.
func (s *Store) leaderLock(ctx context.Context) (conn *pgxpool.Conn, unlock func(), ok bool, err error) {
	actx, cancel := context.WithTimeout(ctx, s.opts.StatementTimeout)
	defer cancel()
	conn, err = s.pool.Acquire(actx)
	if err != nil {
		return nil, nil, false, wrap("cleanup", err)
	}
	var locked bool
	if err := conn.QueryRow(actx, "SELECT pg_try_advisory_lock($1)", s.cleanupKey).Scan(&locked); err != nil {
		conn.Release()
		return nil, nil, false, wrap("cleanup: taking the cleaner lock", err)
	}
	if !locked {
		conn.Release()
		return nil, nil, false, nil
	}
	return conn, func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.StatementTimeout)
		defer cancel()
		var unlocked bool
		if uerr := conn.QueryRow(uctx, "SELECT pg_advisory_unlock($1)", s.cleanupKey).Scan(&unlocked); uerr != nil || !unlocked {
			// Ending the session is the sure way to drop the lock.
			_ = conn.Conn().Close(uctx)
		}
		conn.Release()
	}, true, nil
}

// cleanupPass removes every expired record in batches of
// Options.CleanupBatch (the partitioned layout: creates partitions ahead
// and drops those whose rows may all go), unless another worker is
// cleaning the same table: then it returns at once with ran false. The
// background cleaner runs it every Options.CleanupInterval.
//
// One cleaner at a time: the pass holds the one-leader lock (leaderLock)
// for its duration. Each batch is its own short transaction, so no lock is
// held from one batch to the next.
func (s *Store) cleanupPass(ctx context.Context) (removed int, ran bool, err error) {
	s.cleanupMu.Lock()
	defer s.cleanupMu.Unlock()
	conn, unlock, ok, err := s.leaderLock(ctx)
	if err != nil || !ok {
		return 0, false, err
	}
	defer unlock()

	if s.opts.Layout == LayoutPartitioned {
		// Partition upkeep instead of DELETE batches.
		removed, err := s.partitionUpkeep(ctx)
		s.telemetry.deleted.Add(ctx, int64(removed), s.telemetry.tableAttrs)
		return removed, true, err
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
		s.cleanupRest(ctx, time.Since(start))
	}
}

// cleanerPass is what the cleaner does each interval: the cleanup pass
// (cleanupPass, which only the leader runs) and, in the partitioned
// layout, the loading of the key filters its claims use, which every
// worker does: the leader's upkeep loads them from its own read of the
// catalog, and the others, or a leader whose upkeep failed, read it here.
func (s *Store) cleanerPass(ctx context.Context) (removed int, ran bool, err error) {
	removed, ran, err = s.cleanupPass(ctx)
	if s.opts.Layout == LayoutPartitioned && (!ran || err != nil) && ctx.Err() == nil {
		if ferr := s.refreshKeyFilters(ctx); ferr != nil {
			err = errors.Join(err, ferr)
		}
	}
	return removed, ran, err
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
		removed, ran, err := s.cleanerPass(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			s.opts.Logger.Error("oncemill: cleanup pass failed; it runs again next interval", "error", err, "removed", removed, "table", s.opts.Schema+"."+s.opts.Table)
		case ran && removed > 0:
			s.opts.Logger.Debug("oncemill: cleanup pass", "removed", removed, "table", s.opts.Schema+"."+s.opts.Table)
		}
	}
}

// cleanupRest rests after a step of the cleanup that took d (a full
// batch, a chunk of a partition's read) for cleanupPause(d), or until ctx
// ends.
func (s *Store) cleanupRest(ctx context.Context, d time.Duration) {
	pause := s.cleanupPause(d)
	if pause <= 0 {
		return
	}
	t := time.NewTimer(pause)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// cleanupPause is how long to rest after a step that took d, so that
// cleanup is busy for the CleanupDuty share of the time.
func (s *Store) cleanupPause(d time.Duration) time.Duration {
	duty := s.opts.CleanupDuty
	if duty >= 1 {
		return 0
	}
	return time.Duration(float64(d) * (1 - duty) / duty)
}
