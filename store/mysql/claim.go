package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/oncemill/oncemill/store"
)

// What the claims of both modes share. A claim's first statement inserts
// the key's record (sqlClaimInsert): a new key is then taken in one
// statement. When the key has a row, the statement has locked it instead,
// in the claim's transaction; the claim reads the row with the server's
// clock (sqlClaimRead), decides in Go (decide), and, when it takes the
// key, writes the row (sqlClaimTake) before the lock goes.

// claim is a claim's request as its statements take it.
type claim struct {
	scope, key, fingerprint, messageUUID string
	// status is the new row's: in progress (the lease mode) or succeeded
	// (the one-transaction mode, whose commit makes it visible).
	status store.Status
	// ttl is the new row's expiry from now, purge its purge time.
	ttl, purge time.Duration
	// deferred: a deferred claim (store.TxRequest.Deferrable), which
	// takes a new or free key only (errDeferredLost).
	deferred bool
}

// errVanished: the row the claim's first statement found was gone when it
// read it (cleanup or Delete came between): the claim runs again.
var errVanished = errors.New("the record was removed during the claim")

// errDeferredLost: a deferred claim met a row whose attempt count it would
// carry on (a released key, an expired lease). Such a claim takes new keys
// only: its Commit and Rollback say store.ErrLeaseLost, and the stage
// claims again, up front.
var errDeferredLost = errors.New("a deferred claim met the key's record")

// maxClaimRuns bounds the runs of a claim that met a vanished row or a
// deadlock: each means another transaction changed the key meanwhile.
const maxClaimRuns = 10

// execer runs a statement: the pool, a connection or a transaction.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// querier runs statements in a transaction: a *sql.Tx, or a *sql.Conn in
// a transaction of the store's own (shortTx).
type querier interface {
	execer
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// insert runs the claim's first statement with its lock wait bounded to
// waitSecs, and returns the token of the row it inserted, or 0 when the
// key has a row (which it locked).
func (s *Store) insert(ctx context.Context, q execer, c *claim, waitSecs int64) (int64, error) {
	res, err := q.ExecContext(ctx, withWait(s.sql.claimInsert, waitSecs),
		c.scope, c.key, c.fingerprint, int16(c.status), us(c.ttl), us(c.purge), c.messageUUID)
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

// inserted is the answer for a new key taken with token, which is also the
// server clock of its statement.
func (c *claim) inserted(token int64) store.ClaimResult {
	return store.ClaimResult{Decision: store.DecisionExecute, Claim: store.Claim{
		Scope: c.scope, Key: c.key, Token: token, Attempt: 1,
		ExpiresAt: time.UnixMicro(token + us(c.ttl)), MessageUUID: c.messageUUID,
	}}
}

// takeLocked reads the row the claim's first statement locked in tx,
// decides, and takes the key when the decision is Execute.
func (s *Store) takeLocked(ctx context.Context, tx querier, c *claim) (store.ClaimResult, error) {
	var now int64
	rec, err := scanRecord(tx.QueryRowContext(ctx, s.sql.claimRead, c.scope, c.key), &now)
	if errors.Is(err, sql.ErrNoRows) {
		return store.ClaimResult{}, errVanished
	}
	if err != nil {
		return store.ClaimResult{}, err
	}
	d := decide(&rec, now, c.fingerprint)
	if d.decision != store.DecisionExecute {
		res := store.ClaimResult{Decision: d.decision, Record: &rec}
		if d.retryIn > 0 {
			res.RetryIn = d.retryIn
		}
		return res, nil
	}
	if c.deferred && !d.free {
		return store.ClaimResult{Decision: store.DecisionExecute, Claim: store.Claim{Scope: c.scope, Key: c.key, Attempt: rec.Attempt + 1}}, errDeferredLost
	}
	token := max(now, rec.Token+1) // above every token the key had
	attempt, created, fp := rec.Attempt+1, rec.CreatedAt.UnixMicro(), rec.Fingerprint
	if d.free {
		attempt, created = 1, now
	}
	if d.free || c.fingerprint != "" {
		fp = c.fingerprint
	}
	expires := now + us(c.ttl)
	takenOver := rec.Status == store.StatusInProgress
	if _, err := tx.ExecContext(ctx, s.sql.claimTake, int16(c.status), token, attempt, takenOver, fp,
		created, now, expires, now+us(c.purge), c.messageUUID, c.scope, c.key); err != nil {
		return store.ClaimResult{}, err
	}
	return store.ClaimResult{Decision: store.DecisionExecute, Takeover: takenOver, Claim: store.Claim{
		Scope: c.scope, Key: c.key, Token: token, Attempt: attempt, ExpiresAt: time.UnixMicro(expires), MessageUUID: c.messageUUID,
	}}, nil
}

// decision is what decide makes of a row.
type decision struct {
	decision store.Decision
	// free: the row finished or was released and has expired; the claim
	// starts again at attempt 1.
	free bool
	// retryIn is how long a retryable row holds the key back.
	retryIn time.Duration
}

// decide is the contract's rule for a claim with fingerprint fp that finds
// rec, at now (the server clock, microseconds). A free row is taken; else
// a different fingerprint is a mismatch; an expired lease, or a released
// row that nothing holds back, is carried on (attempt + 1); a live lease or
// a held-back release is held; a finished row is replayed.
func decide(rec *store.Record, now int64, fp string) decision {
	expired := rec.ExpiresAt.UnixMicro() <= now
	switch {
	case rec.Status != store.StatusInProgress && expired:
		return decision{decision: store.DecisionExecute, free: true}
	case fp != "" && rec.Fingerprint != "" && fp != rec.Fingerprint:
		return decision{decision: store.DecisionMismatch}
	case rec.Status == store.StatusInProgress && expired:
		return decision{decision: store.DecisionExecute}
	case rec.Status == store.StatusInProgress:
		return decision{decision: store.DecisionHeld}
	case rec.Status == store.StatusRetryable:
		if at := rec.RetryAt.UnixMicro(); !rec.RetryAt.IsZero() && at > now {
			return decision{decision: store.DecisionHeld, retryIn: time.Duration(at-now) * time.Microsecond}
		}
		return decision{decision: store.DecisionExecute}
	case rec.Status == store.StatusSucceeded || rec.Status == store.StatusCachedFailure:
		return decision{decision: store.DecisionReplay}
	}
	// A status this build does not know, written by a newer one: refuse to
	// decide rather than guess.
	return decision{}
}

// unknownStatus is the error of a claim that met a row decide cannot read.
func unknownStatus(op string, c *claim) error {
	return fmt.Errorf("oncemill: mysql: %s %q/%q: the record has a status this build does not know; upgrade oncemill", op, c.scope, c.key)
}

// rerun reports whether a claim that failed with err runs again: a row
// that vanished, or a deadlock, within maxClaimRuns.
func rerun(err error, runs int) bool {
	return runs < maxClaimRuns && (errors.Is(err, errVanished) || errNumber(err) == errDeadlock)
}
