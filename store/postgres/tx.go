package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/requests"
	"github.com/oncemill/oncemill/store/postgres/internal/claimtx"
	"github.com/oncemill/oncemill/store/postgres/internal/guardtx"
	"github.com/oncemill/oncemill/store/postgres/internal/pgerr"
)

// The one-transaction mode (store.Transactional). Claim sends BEGIN and the
// claim statement in one round trip; the handler then works in that
// transaction (internal/claimtx); Commit sends COMMIT, preceded in the same
// round trip by a statement that stores the produced messages when there
// are some. A message costs the round trips and the one commit of a plain
// transaction. A deferred claim (store.TxRequest.Deferrable) sends its
// statements with the handler's first one instead.

// ErrTxOwned is returned by Commit and Rollback of the transaction a
// handler finds with TxFromContext: the stage ends it, committing when the
// handler returns nil and rolling back when it returns an error.
var ErrTxOwned = guardtx.ErrOwned

// TxFromContext returns the transaction the handler runs in, in the
// one-transaction mode (receiver.NewTransactional). Do the handler's
// database writes on it: they commit together with the record of the
// message's success, or not at all. Its Commit and Rollback return
// ErrTxOwned: the stage ends it. ok is false outside that mode.
func TxFromContext(ctx context.Context) (tx pgx.Tx, ok bool) { return guardtx.FromContext(ctx) }

// ClaimInTx implements store.Transactional. It acquires a connection from the
// pool and, for Execute, keeps it for the transaction until Commit or
// Rollback.
func (s *Store) ClaimInTx(ctx context.Context, req store.TxRequest) (store.TxResult, error) {
	if err := requests.ValidateTx(req); err != nil {
		return store.TxResult{}, fmt.Errorf("oncemill: postgres: claim: %w", err)
	}
	if err := s.checkNewID("claim", req.Scope, req.Key, req.Fingerprint); err != nil {
		return store.TxResult{}, err
	}
	req.MessageUUID = pgerr.StorableText(req.MessageUUID, pgerr.MaxMessageUUIDLen)
	ctx, cancel, err := s.gate.Enter(ctx, "claim", req.Wait)
	if err != nil {
		return store.TxResult{}, err
	}
	defer s.gate.Leave(cancel)
	purge := max(claimTTL(req.SuccessTTL), req.Retain)
	waitMS := max(req.Wait.Milliseconds(), 1) // lock_timeout 0 would mean no bound
	h := keyHash(req.Scope, req.Key)
	// A claim that waited for another delivery's transaction and then did
	// not take the key finds its row committed after the statement's
	// snapshot: the statement leaves it undecided, and it runs again in a
	// new transaction (sql.go). So a second run, or a lock timeout, is what
	// contention looks like here. What the layout lacks, the layout mends
	// (mend), and the claim runs again.
	m := mends{inTx: true}
	for runs := 1; ; runs++ {
		// Before the transaction begins, so that time since started bounds
		// the transaction's age at its commit (claimTTL).
		started := time.Now()
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			return store.TxResult{}, wrap("claim", err)
		}
		if req.Deferrable {
			return s.claimDeferred(conn, &req, purge, started, h), nil
		}
		res, tx, err := s.layout.claimTx(ctx, conn, req, purge, waitMS, h)
		if err == nil && res.Decision == store.DecisionExecute {
			t := claimtx.New(&s.txc, conn, tx, s.claimedRecord(&req, started))
			return store.TxResult{ClaimResult: res, Tx: t}, nil
		}
		// Nothing to keep: end the transaction and give the connection back.
		guardtx.Release(ctx, conn)
		if again, err := s.layout.mend(ctx, err, &m); err != nil {
			return store.TxResult{}, err
		} else if again {
			continue
		}
		switch {
		case pgerr.Code(err) == pgerr.LockNotAvailable:
			return store.TxResult{ClaimResult: store.ClaimResult{Decision: store.DecisionHeld}, Contended: true}, nil
		case err != nil:
			return store.TxResult{}, wrap("claim", err)
		case res.Decision != 0:
			return store.TxResult{ClaimResult: res, Contended: runs > 1}, nil
		}
		// Undecided: a new transaction sees the row as it is now.
		if err := s.rerun("claim", req.Scope, req.Key, runs); err != nil {
			return store.TxResult{}, err
		}
	}
}

// claimDeferred returns the deferred claim of req on conn: DecisionExecute,
// the transaction to begin with the handler's first statement, which sends
// the claim's statements (internal/claimtx, "The deferred claim").
func (s *Store) claimDeferred(conn *pgxpool.Conn, req *store.TxRequest, purge time.Duration, started time.Time, h uint64) store.TxResult {
	c, opts := s.layout.deferredClaim(req, purge, h)
	t := claimtx.NewDeferred(&s.txc, conn, opts, s.claimedRecord(req, started), c)
	return store.TxResult{ClaimResult: newKeyClaim(req), Tx: t}
}

// claimedRecord is what a claim's Commit writes of req's record.
func (s *Store) claimedRecord(req *store.TxRequest, started time.Time) claimtx.Record {
	return claimtx.Record{Scope: req.Scope, Key: req.Key, TTLMicros: micros(req.SuccessTTL), Slack: expirySlack(req.SuccessTTL), Started: started}
}

// RecordRollback implements store.Transactional.
func (s *Store) RecordRollback(ctx context.Context, lease store.Claim, fingerprint string, out store.Completion) error {
	switch out.Status {
	case store.StatusRetryable:
		if err := requests.ValidateRetry(out); err != nil {
			return fmt.Errorf("oncemill: postgres: record rollback: %w", err)
		}
	case store.StatusCachedFailure:
		out.RetryAfter, out.Uncounted = 0, false // a cached failure holds nothing back, and counts
	default:
		return pgerr.Invalid("record rollback", "outcome status must be failed or retryable, not %v", out.Status)
	}
	if out.TTL <= 0 {
		return pgerr.Invalid("record rollback", "outcome TTL %v must be positive", out.TTL)
	}
	if err := s.checkNewID("record rollback", lease.Scope, lease.Key, fingerprint); err != nil {
		return err
	}
	ctx, cancel, err := s.gate.Enter(ctx, "record rollback", 0)
	if err != nil {
		return err
	}
	defer s.gate.Leave(cancel)
	var m mends
	for {
		n, err := s.layout.recordRollback(ctx, lease, fingerprint, out)
		if again, err := s.layout.mend(ctx, err, &m); err != nil {
			return err
		} else if again {
			continue
		}
		if err != nil {
			return wrap("record rollback", err)
		}
		if n == 0 {
			return fmt.Errorf("oncemill: postgres: record rollback %q/%q: another delivery claimed or finished the key: %w", lease.Scope, lease.Key, store.ErrLeaseLost)
		}
		return nil
	}
}
