package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/store/postgres/internal/pgerr"
)

// Cleanup of expired records, in either layout: on demand (DeleteExpired),
// and by the background cleaner, one leader at a time across the workers
// sharing the table; what a pass does is the layout's (layout.clean).

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
// The partitioned layout: first what the cleaner's pass does, unless another
// worker's cleaner is in one (the same one-leader lock): it drops every
// partition whose rows may all go, blocking no claim (dropPartition), and
// returns their rows, which may be more than limit (a partition goes whole
// or not at all), having deleted none. Only when no partition could go does
// it delete up to limit expired records past their purge time, with the
// rule and the locking of LayoutDelete, from the partitions that stay:
// with no purge_at index that statement reads every partition, which suits
// an operator or a test, not a program in a loop; the rows it deletes leave
// dead tuples in partitions that would go whole later anyway. The drops'
// bound is Options.StatementTimeout plus twice the upkeep's wait (the longer of
// StatementTimeout and CleanupInterval): one wait for the transactions
// older than the pass, one for a detach. A call that runs out returns the
// context's error, having dropped what it finished; a detach it cut short
// leaves the partition detaching, which the next pass finishes.
func (s *Store) DeleteExpired(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, pgerr.Invalid("delete expired", "limit is %d, must be positive", limit)
	}
	if dropped, err := s.layout.dropExpired(ctx); err != nil || dropped > 0 {
		return dropped, err
	}
	ctx, cancel, err := s.gate.Enter(ctx, "delete expired", 0)
	if err != nil {
		return 0, err
	}
	defer s.gate.Leave(cancel)
	var n int
	var newest time.Time
	if err := s.pool.QueryRow(ctx, s.sql.cleanupBatch, limit, time.Time{}).Scan(&n, &newest); err != nil {
		return 0, wrap("delete expired", err)
	}
	s.metrics.Removed(ctx, n)
	return n, nil
}

// CleanupLag returns how long the oldest record that cleanup may remove has
// waited for it, by the database clock, or 0 when there is none. It is what the
// oncemill.store.cleanup.lag gauge reports. In the partitioned layout, which
// has no purge_at index to find that record, it is how long the oldest
// partition has outlived the time it was due to go.
func (s *Store) CleanupLag(ctx context.Context) (time.Duration, error) {
	ctx, cancel, err := s.gate.Enter(ctx, "cleanup lag", 0)
	if err != nil {
		return 0, err
	}
	defer s.gate.Leave(cancel)
	return s.layout.cleanupLag(ctx)
}

// asLeader runs f under the cleaner's one-leader lock, as cleanerPass
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

// cleanerPass is what the cleaner does each interval: the layout's pass
// (layout.clean), as the leader when this worker takes the one-leader
// lock (leaderLock), which it holds for the pass, or else as a worker
// that follows; then ran is false.
func (s *Store) cleanerPass(ctx context.Context) (removed int, ran bool, err error) {
	s.cleanupMu.Lock()
	defer s.cleanupMu.Unlock()
	conn, unlock, ok, err := s.leaderLock(ctx)
	if err != nil || !ok {
		if _, ferr := s.layout.clean(ctx, nil); ferr != nil {
			err = errors.Join(err, ferr)
		}
		return 0, false, err
	}
	defer unlock()
	removed, err = s.layout.clean(ctx, conn)
	return removed, true, err
}

// cleaner runs a cleanup pass every interval until ctx ends, the first at
// once when first is set.
func (s *Store) cleaner(ctx context.Context, interval time.Duration, first bool) {
	defer close(s.cleanerDone)
	t := time.NewTicker(interval)
	defer t.Stop()
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
