package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres/internal/claimtx"
)

// What the claims of both modes and both layouts share: reading a claim's
// answer, the key's hash and lock, and the record's lifetime.

// rerun counts a statement that left a key undecided (the READ COMMITTED
// corner: the row changed under it), and refuses to go on after
// claimRetries of them in a row.
func (s *Store) rerun(op, scope, key string, runs int) error {
	s.reruns.Add(1)
	if runs > s.claimRetries {
		return fmt.Errorf("oncemill: postgres: %s %q/%q: the record kept changing under %d statements in a row; try again", op, scope, key, runs)
	}
	return nil
}

// querier runs a statement: the pool, or a connection in a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// claimStatement runs one form of sqlClaim (sql.go) and returns the
// decision, or decision 0 when the statement left the key undecided.
func claimStatement(ctx context.Context, q querier, sql string, args ...any) (store.ClaimResult, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return store.ClaimResult{}, err
	}
	return scanClaim(rows, args[0].(string), args[1].(string))
}

// batchClaim reads the results of a batch's first statement (a lock, or
// BEGIN) and the claim after it.
func batchClaim(br pgx.BatchResults, scope, key string) (store.ClaimResult, error) {
	if _, err := br.Exec(); err != nil {
		return store.ClaimResult{}, err
	}
	rows, err := br.Query()
	if err != nil {
		return store.ClaimResult{}, err
	}
	return scanClaim(rows, scope, key)
}

// scanClaim reads the answer of a claim statement: the decision, or
// decision 0 when the statement left the key undecided.
func scanClaim(rows pgx.Rows, scope, key string) (store.ClaimResult, error) {
	defer rows.Close()
	if !rows.Next() {
		rows.Close()
		return store.ClaimResult{}, rows.Err() // no row: undecided
	}
	var (
		decision, status int16
		attempt          int32
		takenOver        bool
		kind             string
		retryAt          *time.Time // a retryable record's next attempt; nil: none
		retryIn          int64      // microseconds retryAt holds the key back from now
		rec              = &store.Record{Scope: scope, Key: key}
		dest             = []any{&decision, &rec.Fingerprint, &status, &rec.Token, &attempt, &takenOver,
			&rec.Result, &kind, &rec.ErrorMessage, &rec.CreatedAt, &rec.UpdatedAt, &rec.ExpiresAt, &rec.MessageUUID, &retryAt, &retryIn}
	)
	for len(dest) < len(rows.FieldDescriptions()) {
		dest = append(dest, nil) // a form's set_config: lock_timeout put back, a lease answered
	}
	if err := rows.Scan(dest...); err != nil {
		return store.ClaimResult{}, err
	}
	// Close reads up to the end of the statement: only a statement that
	// succeeded may hand out its answer.
	rows.Close()
	if err := rows.Err(); err != nil {
		return store.ClaimResult{}, err
	}
	rec.Status, rec.Attempt, rec.ErrorKind = store.Status(status), int(attempt), store.ErrorKind(kind)
	switch store.Decision(decision) {
	case 0:
		return store.ClaimResult{}, nil
	case store.DecisionExecute:
		return store.ClaimResult{
			Decision: store.DecisionExecute,
			Takeover: takenOver,
			Claim: store.Claim{Scope: rec.Scope, Key: rec.Key, Token: rec.Token, Attempt: rec.Attempt, ExpiresAt: rec.ExpiresAt,
				MessageUUID: rec.MessageUUID},
		}, nil
	}
	if rec.Status == store.StatusInProgress {
		rec.LeaseExpiresAt = rec.ExpiresAt
	}
	if retryAt != nil {
		rec.RetryAt = *retryAt
	}
	res := store.ClaimResult{Decision: store.Decision(decision), Record: rec}
	if res.Decision == store.DecisionHeld && rec.Status == store.StatusRetryable {
		// Held back (Completion.RetryAfter): no delivery holds the key.
		res.RetryIn = max(time.Duration(retryIn)*time.Microsecond, time.Microsecond)
	}
	return res, nil
}

// batchInserted reads the results of a batch of BEGIN and an insert of a
// new key's record (sqlClaimNew), and closes the batch: whether the insert
// took the key.
func batchInserted(br pgx.BatchResults) (bool, error) {
	_, err := br.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err == nil && tag.RowsAffected() == 1, err
}

// newKeyClaim is the claim of req's key by an insert of its record, which
// only takes a key that has no row: its token is claimtx.Token, as a
// deferred claim's (a later claim of the key takes the greater of the
// sequence's next and the row's token plus one), so the insert need not
// return it.
func newKeyClaim(req *store.TxRequest) store.ClaimResult {
	return store.ClaimResult{Decision: store.DecisionExecute, Claim: store.Claim{Scope: req.Scope, Key: req.Key, Token: claimtx.Token, Attempt: 1, MessageUUID: req.MessageUUID}}
}

// newKeyArgs are the arguments of an insert of a new key's record: $6 the
// key's lock (lock) and $7 the message UUID when the statement takes the
// lock itself (locks: sqlClaimNew, sqlPartClaimNewCurrent and their
// deferred forms), $6 the message UUID when the lock was taken before it
// (sqlPartClaimNew).
func newKeyArgs(locks bool, req *store.TxRequest, purge time.Duration, lock int32) []any {
	if locks {
		return []any{req.Scope, req.Key, req.Fingerprint, micros(claimTTL(req.SuccessTTL)), micros(purge), lock, req.MessageUUID}
	}
	return []any{req.Scope, req.Key, req.Fingerprint, micros(claimTTL(req.SuccessTTL)), micros(purge), req.MessageUUID}
}

// takeNewKey reads a fast-path claim's answer, the token of the row it
// inserted for a new key, as the batch's next result (unless err, an
// earlier result's error, is set), and closes the batch: taken with the
// claim, or not taken when the key has a row and the claim goes on in the
// transaction.
func takeNewKey(br pgx.BatchResults, err error, req store.TxRequest) (res store.ClaimResult, tx pgx.Tx, taken bool, _ error) {
	var token int64
	if err == nil {
		err = br.QueryRow().Scan(&token)
	}
	if cerr := br.Close(); err == nil || errors.Is(err, pgx.ErrNoRows) && cerr != nil {
		err = cerr
	}
	tx = br.Tx()
	switch {
	case err == nil:
		return store.ClaimResult{Decision: store.DecisionExecute, Claim: store.Claim{Scope: req.Scope, Key: req.Key, Token: token, Attempt: 1, MessageUUID: req.MessageUUID}}, tx, true, nil
	case errors.Is(err, pgx.ErrNoRows):
		return store.ClaimResult{}, tx, false, nil
	}
	return store.ClaimResult{}, tx, false, err
}

// claimLockKey is the second half of a claim's advisory lock key, from the
// key's hash (keyHash). Two keys that share it only make each other's
// claims take the slower path.
func claimLockKey(h uint64) int32 { return int32(h) }

// keyHash is the 64-bit hash of scope, a NUL byte (which neither may
// contain) and key, computed once a claim: its lock key (claimLockKey) and
// what a key filter holds (keyFilters.claimsFor).
func keyHash(scope, key string) uint64 {
	var h xxhash.Digest
	h.Reset()
	h.WriteString(scope)
	h.Write([]byte{0})
	h.WriteString(key)
	return h.Sum64()
}

// expirySlackDivisor sets how long a claim's record outlives SuccessTTL:
// by SuccessTTL/expirySlackDivisor, 1%. The claim's expiry counts from the start of
// its transaction, before the handler runs; a transaction that commits
// within the slack writes nothing more, and its record still lives at least
// SuccessTTL after the commit. A longer one moves the expiry to SuccessTTL
// after the commit, in the commit's round trip.
const expirySlackDivisor = 100

func expirySlack(ttl time.Duration) time.Duration { return ttl / expirySlackDivisor }

// claimTTL is the lifetime a claim gives its record: SuccessTTL plus the
// slack.
func claimTTL(ttl time.Duration) time.Duration { return ttl + expirySlack(ttl) }
