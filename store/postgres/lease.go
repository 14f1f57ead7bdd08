package postgres

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/requests"
	"github.com/oncemill/oncemill/store/postgres/internal/pgerr"
)

// The lease mode (store.Store): ClaimLease takes a key for a lease in one
// statement, in a transaction of its own; the handler runs outside the
// database; Complete, Release or Extend then name the record by its token.

// ClaimLease implements store.Store: one statement, in a transaction of its own.
func (s *Store) ClaimLease(ctx context.Context, req store.LeaseRequest) (store.ClaimResult, error) {
	if err := requests.ValidateLease(req); err != nil {
		return store.ClaimResult{}, fmt.Errorf("oncemill: postgres: begin: %w", err)
	}
	if err := s.checkNewID("begin", req.Scope, req.Key, req.Fingerprint); err != nil {
		return store.ClaimResult{}, err
	}
	req.MessageUUID = pgerr.StorableText(req.MessageUUID, pgerr.MaxMessageUUIDLen)
	ctx, cancel, err := s.gate.Enter(ctx, "begin", 0)
	if err != nil {
		return store.ClaimResult{}, err
	}
	defer s.gate.Leave(cancel)
	var m mends
	for runs := 1; ; runs++ {
		res, err := s.layout.claimLease(ctx, req)
		if again, err := s.layout.mend(ctx, err, &m); err != nil {
			return store.ClaimResult{}, err
		} else if again {
			continue
		}
		if err != nil || res.Decision != 0 {
			if err != nil {
				err = wrap("begin", err)
			}
			return res, err
		}
		if err := s.rerun("begin", req.Scope, req.Key, runs); err != nil {
			return store.ClaimResult{}, err
		}
	}
}

// Complete implements store.Store.
func (s *Store) Complete(ctx context.Context, lease store.Claim, out store.Completion) error {
	out, err := s.checkComplete("complete", lease, out)
	if err != nil {
		return err
	}
	ctx, cancel, err := s.gate.Enter(ctx, "complete", 0)
	if err != nil {
		return err
	}
	defer s.gate.Leave(cancel)
	args := []any{lease.Scope, lease.Key, lease.Token, int16(out.Status), out.Result, string(out.ErrorKind), out.ErrorMessage, micros(out.TTL)}
	tag, err := s.pool.Exec(ctx, s.sql.complete, args...)
	if err == nil && tag.RowsAffected() == 0 && s.sql.completeMove != "" {
		err = s.moveLease(ctx, lease, func(lock int32) (err error) {
			tag, err = s.pool.Exec(ctx, s.sql.completeMove, append(args, lock)...)
			return err
		})
	}
	if err != nil {
		return wrap("complete", err)
	}
	if tag.RowsAffected() == 0 {
		return leaseLost("complete", lease)
	}
	return nil
}

// checkComplete validates a Complete and returns the outcome as stored: the
// result copied, the error text made storable.
func (s *Store) checkComplete(op string, lease store.Claim, out store.Completion) (store.Completion, error) {
	if err := requests.ValidateCompletion(out); err != nil {
		return out, fmt.Errorf("oncemill: postgres: %s: %w", op, err)
	}
	if err := s.checkID(op, lease.Scope, lease.Key); err != nil {
		return out, err
	}
	if len(out.Result) > s.opts.MaxResultBytes {
		return out, pgerr.Invalid(op, "result is %d bytes, more than MaxResultBytes %d; raise Options.MaxResultBytes or lower policy.MaxResultBytes", len(out.Result), s.opts.MaxResultBytes)
	}
	out.Result = bytes.Clone(out.Result)
	out.ErrorKind = store.ErrorKind(pgerr.StorableText(string(out.ErrorKind), pgerr.MaxErrorKindLen))
	out.ErrorMessage = pgerr.StorableText(out.ErrorMessage, pgerr.MaxErrorMessageLen)
	return out, nil
}

func leaseLost(op string, l store.Claim) error {
	return fmt.Errorf("oncemill: postgres: %s %q/%q with token %d: %w", op, l.Scope, l.Key, l.Token, store.ErrLeaseLost)
}

// Release implements store.Store: one statement. With out.TTL <= 0 the
// record is removed; else it keeps its attempt count (one less when
// out.Uncounted) and, with out.RetryAfter, retry_at = now() + RetryAfter by
// the database's clock, which holds the next claim back.
func (s *Store) Release(ctx context.Context, lease store.Claim, out store.Completion) error {
	if err := requests.ValidateRetry(out); err != nil {
		return fmt.Errorf("oncemill: postgres: release: %w", err)
	}
	if err := s.checkID("release", lease.Scope, lease.Key); err != nil {
		return err
	}
	ctx, cancel, err := s.gate.Enter(ctx, "release", 0)
	if err != nil {
		return err
	}
	defer s.gate.Leave(cancel)
	var tag pgconn.CommandTag
	if out.TTL <= 0 {
		tag, err = s.pool.Exec(ctx, s.sql.releaseDelete, lease.Scope, lease.Key, lease.Token)
	} else {
		args := []any{lease.Scope, lease.Key, lease.Token, micros(out.TTL), uncounted(out), micros(out.RetryAfter)}
		tag, err = s.pool.Exec(ctx, s.sql.release, args...)
		if err == nil && tag.RowsAffected() == 0 && s.sql.releaseMove != "" {
			err = s.moveLease(ctx, lease, func(lock int32) (err error) {
				tag, err = s.pool.Exec(ctx, s.sql.releaseMove, append(args, lock)...)
				return err
			})
		}
	}
	if err != nil {
		return wrap("release", err)
	}
	if tag.RowsAffected() == 0 {
		return leaseLost("release", lease)
	}
	return nil
}

// Extend implements store.Store. It refuses a lease that has expired by the
// database's clock, even if nobody took it over yet.
func (s *Store) Extend(ctx context.Context, lease store.Claim, d time.Duration) (store.Claim, error) {
	if d <= 0 {
		return store.Claim{}, pgerr.Invalid("extend", "duration %v must be positive", d)
	}
	if err := s.checkID("extend", lease.Scope, lease.Key); err != nil {
		return store.Claim{}, err
	}
	ctx, cancel, err := s.gate.Enter(ctx, "extend", 0)
	if err != nil {
		return store.Claim{}, err
	}
	defer s.gate.Leave(cancel)
	var attempt int32
	var expires time.Time
	args := []any{lease.Scope, lease.Key, lease.Token, micros(d)}
	err = s.pool.QueryRow(ctx, s.sql.extend, args...).Scan(&attempt, &expires)
	if errors.Is(err, pgx.ErrNoRows) && s.sql.extendMove != "" {
		err = s.moveLease(ctx, lease, func(lock int32) error {
			return s.pool.QueryRow(ctx, s.sql.extendMove, append(args, lock)...).Scan(&attempt, &expires)
		})
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Claim{}, fmt.Errorf("oncemill: postgres: extend %q/%q with token %d: the lease was taken over, finished, or expired: %w",
			lease.Scope, lease.Key, lease.Token, store.ErrLeaseLost)
	}
	if err != nil {
		return store.Claim{}, wrap("extend", err)
	}
	lease.Attempt = int(attempt)
	lease.ExpiresAt = expires
	return lease, nil
}

// moveLease runs move, the partitioned layout's form of a Complete,
// Release or Extend (partMove) whose in-place form found no row: the
// lease's row was claimed filterDelay ago or more, or the lease was lost.
// move is given the key's lock. The row goes to the partition of now,
// which a worker whose cleaner has not run for a while may have to create
// first (mend).
func (s *Store) moveLease(ctx context.Context, lease store.Claim, move func(lock int32) error) error {
	lock := claimLockKey(keyHash(lease.Scope, lease.Key))
	var m mends
	for {
		err := move(lock)
		if again, merr := s.layout.mend(ctx, err, &m); merr != nil || !again {
			return cmp.Or(merr, err)
		}
	}
}

// uncounted is what a release takes off the lease's attempt count: 1 when
// out gives the attempt back (Completion.Uncounted), else 0.
func uncounted(out store.Completion) int32 {
	if out.Uncounted {
		return 1
	}
	return 0
}
