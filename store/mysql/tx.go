package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/requests"
)

// The one-transaction mode (store.Transactional). ClaimInTx begins the
// handler's transaction and claims the key by its first statement, which
// inserts the record in its final, succeeded form; the handler works in
// that transaction (TxFromContext); Commit commits, preceded by an update
// storing the produced messages when there are some. The uncommitted row
// is the lease: a concurrent claim of the key waits on its lock, bounded by
// innodb_lock_wait_timeout for that one statement, then replays what the
// first committed, or takes the key when it rolled back.

type txKey struct{}

// TxFromContext returns the transaction the handler runs in, in the
// one-transaction mode (receiver.NewTransactional). Do the handler's
// database writes on it: they commit together with the record of the
// message's success, or not at all. Do not Commit or Roll it back: the
// stage ends it, committing when the handler returns nil and rolling back
// when it returns an error. Return the error of any statement that fails:
// a deadlock rolls the whole transaction back, claim included. ok is false
// outside that mode.
func TxFromContext(ctx context.Context) (tx *sql.Tx, ok bool) {
	tx, ok = ctx.Value(txKey{}).(*sql.Tx)
	return tx, ok
}

// ClaimInTx implements store.Transactional. For Execute it keeps a
// connection of the pool for the transaction, until Commit or Rollback.
// req.Wait is rounded to whole seconds (innodb_lock_wait_timeout's unit;
// below half a second, no wait). A deferred claim (req.Deferrable) is decided up front too, but
// takes only a new or free key: one that would carry an attempt count on
// answers Execute with a transaction whose Commit and Rollback roll back
// and return store.ErrLeaseLost, and the stage claims again without it.
func (s *Store) ClaimInTx(ctx context.Context, req store.TxRequest) (store.TxResult, error) {
	if err := requests.ValidateTx(req); err != nil {
		return store.TxResult{}, fmt.Errorf("oncemill: mysql: claim: %w", err)
	}
	if err := s.checkNewID("claim", req.Scope, req.Key, req.Fingerprint); err != nil {
		return store.TxResult{}, err
	}
	ctx, cancel, err := s.gate.Enter(ctx, "claim", max(req.Wait, time.Duration(waitSecs(req.Wait))*time.Second))
	if err != nil {
		return store.TxResult{}, err
	}
	defer s.gate.Leave(cancel)
	c := claim{scope: req.Scope, key: req.Key, fingerprint: req.Fingerprint,
		messageUUID: storable(req.MessageUUID, maxMessageUUIDLen), status: store.StatusSucceeded,
		ttl: claimTTL(req.SuccessTTL), purge: max(claimTTL(req.SuccessTTL), req.Retain), deferred: req.Deferrable}
	contended := false
	for runs := 1; ; runs++ {
		// Before the transaction begins, so that time since started bounds
		// the transaction's age at its commit (claimTTL).
		started := time.Now()
		t, err := s.begin(ctx)
		if err != nil {
			return store.TxResult{}, wrap("claim", err)
		}
		// The first try does not wait: a key another transaction holds is
		// contended, and then waited for in a transaction of its own (a
		// timeout may have ended the first, on a server with
		// innodb_rollback_on_timeout).
		wait := int64(0)
		if contended {
			wait = waitSecs(req.Wait)
		}
		res, err := s.claimIn(ctx, t.tx, &c, wait)
		if errors.Is(err, errDeferredLost) {
			t.lost = true
			err = nil
		}
		switch {
		case err == nil && res.Decision == store.DecisionExecute:
			if t.claimed(ctx) {
				t.rec = committed{scope: c.scope, key: c.key, token: res.Claim.Token, ttl: req.SuccessTTL, started: started}
				return store.TxResult{ClaimResult: res, Tx: t, Contended: contended}, nil
			}
			err = ctx.Err() // the claim's bound ran out as it returned
		case err == nil:
			t.end()
			if res.Decision == 0 {
				return store.TxResult{}, unknownStatus("claim", &c)
			}
			return store.TxResult{ClaimResult: res, Contended: contended}, nil
		}
		t.end()
		switch {
		case errNumber(err) == errLockWaitTimeout && !contended:
			contended = true
			continue
		case errNumber(err) == errLockWaitTimeout:
			return store.TxResult{ClaimResult: store.ClaimResult{Decision: store.DecisionHeld}, Contended: true}, nil
		case rerun(err, runs):
			continue
		}
		return store.TxResult{}, wrap("claim", err)
	}
}

// claimIn runs the claim's statements in tx.
func (s *Store) claimIn(ctx context.Context, tx querier, c *claim, wait int64) (store.ClaimResult, error) {
	token, err := s.insert(ctx, tx, c, wait)
	if err != nil || token > 0 {
		return c.inserted(token), err
	}
	return s.takeLocked(ctx, tx, c)
}

// expirySlackDivisor sets how long a claim's record outlives SuccessTTL: by
// 1%. The claim's expiry counts from the start of its transaction, before
// the handler runs; a transaction that commits within the slack writes
// nothing more, and its record still lives at least SuccessTTL after the
// commit. A longer one moves the expiry to SuccessTTL after the commit.
const expirySlackDivisor = 100

func claimTTL(ttl time.Duration) time.Duration { return ttl + ttl/expirySlackDivisor }

// claimTx is an open one-transaction claim: store.Tx.
type claimTx struct {
	s  *Store
	tx *sql.Tx
	// cancel ends the transaction's context: the driver then closes the
	// connection and database/sql rolls the transaction back. The claim's
	// context runs it when the claim outlives its bound (begin); unbind
	// stops that once the claim returns, and finish runs it when the
	// transaction has ended.
	cancel context.CancelFunc
	unbind func() bool
	rec    committed
	ended  bool
	// lost is set for a deferred claim that did not take the key
	// (errDeferredLost): Commit and Rollback roll back and say so.
	lost bool
}

// committed is what Commit writes of the claimed record.
type committed struct {
	scope, key string
	token      int64
	ttl        time.Duration
	started    time.Time
}

// begin starts a transaction that lives until Commit or Rollback, not
// until ctx ends, while ctx bounds the claim that begins it.
func (s *Store) begin(ctx context.Context) (*claimTx, error) {
	txCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	t := &claimTx{s: s, cancel: cancel}
	t.unbind = context.AfterFunc(ctx, cancel)
	tx, err := s.db.BeginTx(txCtx, &s.opts.TxOptions)
	if err != nil {
		t.unbind()
		cancel()
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr // the claim's bound, which canceled txCtx
		}
		return nil, err
	}
	t.tx = tx
	return t, nil
}

// claimed lets the transaction outlive the claim's context, and reports
// whether it still can.
func (t *claimTx) claimed(ctx context.Context) bool {
	if !t.unbind() {
		return false
	}
	return ctx.Err() == nil
}

// end rolls back and lets go of the transaction's context.
func (t *claimTx) end() {
	t.ended = true
	t.unbind()
	_ = t.finish(false)
}

// finish ends the transaction by database/sql's Tx.Commit (commit) or
// Rollback, the one statement a transaction ends with, and then lets go
// of its context. Neither takes a context: they run on a goroutine of
// their own, and finish waits for it at most Options.StatementTimeout, so
// that a stalled server holds no caller longer. The goroutine, and the
// connection, are given back when the server answers or the connection
// fails. (COMMIT sent as a statement would be bounded by the driver, but
// database/sql would then send a ROLLBACK to give the connection back: a
// second round trip a message.)
func (t *claimTx) finish(commit bool) error {
	done := make(chan error, 1)
	go func() {
		var err error
		if commit {
			err = t.tx.Commit()
		} else {
			err = t.tx.Rollback()
		}
		t.cancel()
		done <- err
	}()
	timer := time.NewTimer(t.s.opts.StatementTimeout)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		return fmt.Errorf("no answer from the server within Options.StatementTimeout %v: %w", t.s.opts.StatementTimeout, context.DeadlineExceeded)
	}
}

// Context implements store.Tx: ctx carrying the handler's *sql.Tx.
func (t *claimTx) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, txKey{}, t.tx)
}

// Commit implements store.Tx, within Options.StatementTimeout.
func (t *claimTx) Commit(ctx context.Context, result []byte) error {
	if t.ended {
		return fmt.Errorf("oncemill: mysql: commit: %w", sql.ErrTxDone)
	}
	t.ended = true
	if t.lost {
		_ = t.finish(false)
		return t.lostErr("commit")
	}
	if len(result) > t.s.opts.MaxResultBytes {
		_ = t.finish(false)
		return invalid("commit", "result is %d bytes, more than MaxResultBytes %d; raise Options.MaxResultBytes or lower policy.MaxResultBytes", len(result), t.s.opts.MaxResultBytes)
	}
	if result != nil || time.Since(t.rec.started) > t.rec.ttl/expirySlackDivisor {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.s.opts.StatementTimeout)
		res, err := t.tx.ExecContext(uctx, t.s.sql.commitResult, result, us(t.rec.ttl), t.rec.scope, t.rec.key, t.rec.token)
		cancel()
		if err == nil {
			if n, _ := res.RowsAffected(); n == 0 {
				// The claim's row is not the transaction's any more: a
				// deadlock rolled it back, and the handler went on.
				err = fmt.Errorf("the transaction lost its claim (rolled back by the server): %w", store.ErrLeaseLost)
			}
		}
		if err != nil {
			_ = t.finish(false)
			return wrap("commit", err)
		}
	}
	if err := t.finish(true); err != nil {
		return wrap("commit", err)
	}
	return nil
}

// Rollback implements store.Tx, within Options.StatementTimeout.
func (t *claimTx) Rollback(ctx context.Context) error {
	if t.ended {
		return nil
	}
	t.ended = true
	if err := t.finish(false); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return wrap("rollback", err)
	}
	if t.lost {
		return t.lostErr("rollback")
	}
	return nil
}

func (t *claimTx) lostErr(op string) error {
	return fmt.Errorf("oncemill: mysql: %s: the deferred claim of %q/%q met its record; claim again up front: %w", op, t.rec.scope, t.rec.key, store.ErrLeaseLost)
}

// RecordRollback implements store.Transactional: in a short transaction
// of its own, it locks the key's row without waiting, and records out over
// it unless another delivery claimed or finished the key meanwhile.
func (s *Store) RecordRollback(ctx context.Context, lease store.Claim, fingerprint string, out store.Completion) error {
	switch out.Status {
	case store.StatusRetryable:
		if err := requests.ValidateRetry(out); err != nil {
			return fmt.Errorf("oncemill: mysql: record rollback: %w", err)
		}
	case store.StatusCachedFailure:
		out.RetryAfter, out.Uncounted = 0, false // a cached failure holds nothing back, and counts
	default:
		return invalid("record rollback", "outcome status must be failed or retryable, not %v", out.Status)
	}
	if out.TTL <= 0 {
		return invalid("record rollback", "outcome TTL %v must be positive", out.TTL)
	}
	if err := s.checkNewID("record rollback", lease.Scope, lease.Key, fingerprint); err != nil {
		return err
	}
	ctx, cancel, err := s.gate.Enter(ctx, "record rollback", 0)
	if err != nil {
		return err
	}
	defer s.gate.Leave(cancel)
	for runs := 1; ; runs++ {
		recorded, err := s.recordRollback(ctx, lease, fingerprint, out)
		switch {
		case rerun(err, runs):
			continue
		case err != nil && errNumber(err) != errLockWaitTimeout && errNumber(err) != errDupKey:
			return wrap("record rollback", err)
		case err != nil || !recorded:
			return fmt.Errorf("oncemill: mysql: record rollback %q/%q: another delivery claimed or finished the key: %w", lease.Scope, lease.Key, store.ErrLeaseLost)
		}
		return nil
	}
}

func (s *Store) recordRollback(ctx context.Context, lease store.Claim, fp string, out store.Completion) (bool, error) {
	conn, err := s.shortTx(ctx)
	if err != nil {
		return false, err
	}
	recorded, err := s.recordOn(ctx, conn, lease, fp, out)
	if err != nil || !recorded {
		_ = endShort(ctx, conn, false)
		return false, err
	}
	return true, endShort(ctx, conn, true)
}

func (s *Store) recordOn(ctx context.Context, tx querier, lease store.Claim, fp string, out store.Completion) (bool, error) {
	attempt := lease.Attempt - int(uncounted(out))
	token := lease.Token
	var now int64
	rec, err := scanRecord(tx.QueryRowContext(ctx, s.sql.recordRead, lease.Scope, lease.Key), &now)
	kind, msg := storable(string(out.ErrorKind), maxErrorKindLen), storable(out.ErrorMessage, maxErrorMessageLen)
	uuid := storable(lease.MessageUUID, maxMessageUUIDLen)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		_, err = tx.ExecContext(ctx, withWait(s.sql.recordInsert, 0), lease.Scope, lease.Key,
			fp, int16(out.Status), token, attempt, kind, msg, uuid, nil, us(out.TTL), us(out.TTL), us(out.RetryAfter), us(out.RetryAfter))
	case err != nil:
		return false, err
	default:
		d := decide(&rec, now, fp)
		if d.decision != store.DecisionExecute {
			return false, nil // held, finished, or another payload's
		}
		created := rec.CreatedAt.UnixMicro()
		if d.free {
			created = now
		} else {
			token, attempt = max(token, rec.Token), max(attempt, rec.Attempt)
		}
		if !d.free && fp == "" {
			fp = rec.Fingerprint
		}
		_, err = tx.ExecContext(ctx, s.sql.recordUpdate,
			fp, int16(out.Status), token, attempt, kind, msg, uuid, created, us(out.TTL), us(out.TTL), us(out.RetryAfter), us(out.RetryAfter),
			lease.Scope, lease.Key)
	}
	return err == nil, err
}
