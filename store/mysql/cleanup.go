package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"strings"
	"time"
)

// Cleanup of expired records: on demand (DeleteExpired), and by the
// background cleaner, one leader at a time across the workers sharing the
// table.

// DeleteExpired removes up to limit expired records whose purge time has
// come (the claim's LeaseRequest.Retain), oldest first, expired leases
// included, and returns how many it removed; to remove everything expired,
// call it until it returns 0. Until the purge time an expired lease keeps
// its attempt count for the next claim. One batch is one short
// transaction: it locks the rows it picks with FOR UPDATE SKIP LOCKED,
// never waiting for a row a claim holds, and deletes them by primary key.
// (A DELETE … ORDER BY purge_at LIMIT n would wait for the oldest row an
// open handler transaction holds, and hold the rows before it meanwhile.)
func (s *Store) DeleteExpired(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, invalid("delete expired", "limit is %d, must be positive", limit)
	}
	ctx, cancel, err := s.gate.Enter(ctx, "delete expired", 0)
	if err != nil {
		return 0, err
	}
	defer s.gate.Leave(cancel)
	n, err := s.deleteBatch(ctx, limit)
	if err != nil {
		return 0, wrap("delete expired", err)
	}
	s.metrics.Removed(ctx, n)
	return n, nil
}

func (s *Store) deleteBatch(ctx context.Context, limit int) (int, error) {
	conn, err := s.shortTx(ctx)
	if err != nil {
		return 0, err
	}
	n, err := s.deleteOn(ctx, conn, limit)
	if err != nil || n == 0 {
		_ = endShort(ctx, conn, false)
		return 0, err
	}
	return n, endShort(ctx, conn, true)
}

func (s *Store) deleteOn(ctx context.Context, tx *sql.Conn, limit int) (int, error) {
	rows, err := tx.QueryContext(ctx, s.sql.cleanupPick, limit)
	if err != nil {
		return 0, err
	}
	var keys []any
	for rows.Next() {
		var scope, key []byte
		if err := rows.Scan(&scope, &key); err != nil {
			rows.Close()
			return 0, err
		}
		keys = append(keys, scope, key)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(keys) == 0 {
		return 0, err
	}
	n := len(keys) / 2
	del := s.names.render("DELETE FROM {{TABLE}} WHERE (scope, `key`) IN (" + strings.Repeat("(?, ?), ", n-1) + "(?, ?))")
	res, err := tx.ExecContext(ctx, del, keys...)
	if err != nil {
		return 0, err
	}
	deleted, err := res.RowsAffected()
	return int(deleted), err
}

// cleanerPass is what the cleaner does each interval: batches until none
// is full, resting after each full one (Options.CleanupDuty), as the
// leader: under a named lock (GET_LOCK) on a connection of its own, which
// a worker that dies releases with its session. ran is false when another
// worker holds the lock.
func (s *Store) cleanerPass(ctx context.Context) (removed int, ran bool, err error) {
	s.cleanupMu.Lock()
	defer s.cleanupMu.Unlock()
	lctx, cancel := context.WithTimeout(ctx, s.opts.StatementTimeout)
	defer cancel()
	conn, err := s.db.Conn(lctx)
	if err != nil {
		return 0, false, wrap("cleanup", err)
	}
	defer conn.Close()
	var locked sql.NullInt64
	if err := conn.QueryRowContext(lctx, s.names.render("SELECT GET_LOCK({{CLEANUP_LOCK}}, 0)")).Scan(&locked); err != nil {
		return 0, false, wrap("cleanup: taking the cleaner lock", err)
	}
	if locked.Int64 != 1 {
		return 0, false, nil
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.StatementTimeout)
		defer cancel()
		if _, uerr := conn.ExecContext(uctx, s.names.render("DO RELEASE_LOCK({{CLEANUP_LOCK}})")); uerr != nil {
			// Ending the session is the sure way to drop the lock.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}()
	for ctx.Err() == nil {
		start := time.Now()
		n, err := s.DeleteExpired(ctx, s.opts.CleanupBatch)
		removed += n
		if err != nil || n < s.opts.CleanupBatch {
			return removed, true, err
		}
		s.rest(ctx, time.Since(start))
	}
	return removed, true, nil
}

// cleaner runs a cleanup pass every interval until ctx ends.
func (s *Store) cleaner(ctx context.Context, interval time.Duration) {
	defer close(s.cleanerDone)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		removed, ran, err := s.cleanerPass(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			s.opts.Logger.Error("oncemill: cleanup pass failed; it runs again next interval", "error", err, "removed", removed, "table", s.opts.Table)
		case ran && removed > 0:
			s.opts.Logger.Debug("oncemill: cleanup pass", "removed", removed, "table", s.opts.Table)
		}
	}
}

// rest waits after a batch that took d, so that cleanup is busy for the
// CleanupDuty share of the time, or until ctx ends.
func (s *Store) rest(ctx context.Context, d time.Duration) {
	if s.opts.CleanupDuty >= 1 {
		return
	}
	t := time.NewTimer(time.Duration(float64(d) * (1 - s.opts.CleanupDuty) / s.opts.CleanupDuty))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// cleanupLag is what the oncemill.store.cleanup.lag gauge reports: how
// long the oldest record cleanup may remove has waited for it, by the
// server clock, or 0 when there is none.
func (s *Store) cleanupLag(ctx context.Context) (time.Duration, error) {
	ctx, cancel, err := s.gate.Enter(ctx, "cleanup lag", 0)
	if err != nil {
		return 0, err
	}
	defer s.gate.Leave(cancel)
	var lag int64
	if err := s.db.QueryRowContext(ctx, s.sql.cleanupLag).Scan(&lag); err != nil {
		return 0, wrap("cleanup lag", err)
	}
	return time.Duration(lag) * time.Microsecond, nil
}
