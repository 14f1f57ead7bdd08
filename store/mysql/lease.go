package mysql

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/requests"
)

// The lease mode (store.Store): ClaimLease takes a key for a lease, the
// handler runs outside the database, and Complete, Release or Extend then
// name the record by its token, each in one statement.

// ClaimLease implements store.Store. A new key is taken by one autocommitted
// statement; a key with a row takes a short transaction that locks the row,
// reads it and, when it takes the key, writes it.
func (s *Store) ClaimLease(ctx context.Context, req store.LeaseRequest) (store.ClaimResult, error) {
	if err := requests.ValidateLease(req); err != nil {
		return store.ClaimResult{}, fmt.Errorf("oncemill: mysql: begin: %w", err)
	}
	if err := s.checkNewID("begin", req.Scope, req.Key, req.Fingerprint); err != nil {
		return store.ClaimResult{}, err
	}
	ctx, cancel, err := s.gate.Enter(ctx, "begin", 0)
	if err != nil {
		return store.ClaimResult{}, err
	}
	defer s.gate.Leave(cancel)
	c := claim{scope: req.Scope, key: req.Key, fingerprint: req.Fingerprint,
		messageUUID: storable(req.MessageUUID, maxMessageUUIDLen), status: store.StatusInProgress,
		ttl: req.LeaseDuration, purge: max(req.LeaseDuration, req.Retain)}
	// Another claim holds a row lock for a few statements; a one-transaction
	// claim of the same table for its handler's run.
	wait := leaseWait(s.opts.StatementTimeout)
	for runs := 1; ; runs++ {
		res, err := s.claimLease(ctx, &c, wait)
		if rerun(err, runs) {
			continue
		}
		if err != nil {
			return store.ClaimResult{}, wrap("begin", err)
		}
		if res.Decision == 0 {
			return store.ClaimResult{}, unknownStatus("begin", &c)
		}
		return res, nil
	}
}

func (s *Store) claimLease(ctx context.Context, c *claim, wait int64) (store.ClaimResult, error) {
	token, err := s.insert(ctx, s.db, c, wait)
	if err != nil || token > 0 {
		return c.inserted(token), err
	}
	conn, err := s.shortTx(ctx)
	if err != nil {
		return store.ClaimResult{}, err
	}
	// Again in the transaction, so that it holds the row's lock (or takes
	// the key, when the row went meanwhile).
	res, err := s.claimIn(ctx, conn, c, wait)
	if err != nil {
		_ = endShort(ctx, conn, false)
		return store.ClaimResult{}, err
	}
	return res, endShort(ctx, conn, true)
}

// Complete implements store.Store.
func (s *Store) Complete(ctx context.Context, lease store.Claim, out store.Completion) error {
	if err := requests.ValidateCompletion(out); err != nil {
		return fmt.Errorf("oncemill: mysql: complete: %w", err)
	}
	if err := checkID("complete", lease.Scope, lease.Key); err != nil {
		return err
	}
	if len(out.Result) > s.opts.MaxResultBytes {
		return invalid("complete", "result is %d bytes, more than MaxResultBytes %d; raise Options.MaxResultBytes or lower policy.MaxResultBytes", len(out.Result), s.opts.MaxResultBytes)
	}
	ctx, cancel, err := s.gate.Enter(ctx, "complete", 0)
	if err != nil {
		return err
	}
	defer s.gate.Leave(cancel)
	result := out.Result
	if result == nil && out.Status == store.StatusSucceeded {
		result = []byte{} // a success without a result stores an empty one
	}
	return s.leaseExec(ctx, "complete", lease, s.sql.complete, int16(out.Status), bytes.Clone(result),
		storable(string(out.ErrorKind), maxErrorKindLen), storable(out.ErrorMessage, maxErrorMessageLen), us(out.TTL),
		lease.Scope, lease.Key, lease.Token)
}

// Release implements store.Store. With out.TTL <= 0 the record is removed;
// else it keeps its attempt count (one less when out.Uncounted) and, with
// out.RetryAfter, retry_at by the server's clock, which holds the next
// claim back.
func (s *Store) Release(ctx context.Context, lease store.Claim, out store.Completion) error {
	if err := requests.ValidateRetry(out); err != nil {
		return fmt.Errorf("oncemill: mysql: release: %w", err)
	}
	if err := checkID("release", lease.Scope, lease.Key); err != nil {
		return err
	}
	ctx, cancel, err := s.gate.Enter(ctx, "release", 0)
	if err != nil {
		return err
	}
	defer s.gate.Leave(cancel)
	if out.TTL <= 0 {
		return s.leaseExec(ctx, "release", lease, s.sql.releaseDelete, lease.Scope, lease.Key, lease.Token)
	}
	return s.leaseExec(ctx, "release", lease, s.sql.release, uncounted(out), us(out.TTL),
		us(out.RetryAfter), us(out.RetryAfter), lease.Scope, lease.Key, lease.Token)
}

// leaseExec runs a statement on the lease's row: ErrLeaseLost when it
// names no row.
func (s *Store) leaseExec(ctx context.Context, op string, lease store.Claim, query string, args ...any) error {
	res, err := s.db.ExecContext(ctx, query, args...)
	if err != nil {
		return wrap(op, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return wrap(op, err)
	} else if n == 0 {
		return leaseLost(op, lease)
	}
	return nil
}

// Extend implements store.Store. It refuses a lease that has expired by the
// server's clock, even if nobody took it over yet.
func (s *Store) Extend(ctx context.Context, lease store.Claim, d time.Duration) (store.Claim, error) {
	if d <= 0 {
		return store.Claim{}, invalid("extend", "duration %v must be positive", d)
	}
	if err := checkID("extend", lease.Scope, lease.Key); err != nil {
		return store.Claim{}, err
	}
	ctx, cancel, err := s.gate.Enter(ctx, "extend", 0)
	if err != nil {
		return store.Claim{}, err
	}
	defer s.gate.Leave(cancel)
	res, err := s.db.ExecContext(ctx, s.sql.extend, us(d), lease.Scope, lease.Key, lease.Token)
	if err != nil {
		return store.Claim{}, wrap("extend", err)
	}
	expires, err := res.LastInsertId()
	if err != nil {
		return store.Claim{}, wrap("extend", err)
	}
	if n, _ := res.RowsAffected(); n == 0 || expires == 0 {
		return store.Claim{}, fmt.Errorf("oncemill: mysql: extend %q/%q with token %d: the lease was taken over, finished, or expired: %w",
			lease.Scope, lease.Key, lease.Token, store.ErrLeaseLost)
	}
	lease.ExpiresAt = time.UnixMicro(expires)
	return lease, nil
}

// uncounted is what a release takes off the lease's attempt count: 1 when
// out gives the attempt back (Completion.Uncounted), else 0.
func uncounted(out store.Completion) int32 {
	if out.Uncounted {
		return 1
	}
	return 0
}
