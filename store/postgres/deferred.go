package postgres

import (
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres/internal/lazytx"
)

// The one-transaction mode's deferred claim (store.TxRequest.Deferrable,
// docs/stores.md, "The deferred claim"). A claim of a new
// key decides nothing that the handler needs before its first statement:
// the record it inserts is the transaction's own until the commit. So
// ClaimInTx answers DecisionExecute without a round trip, and the claim's
// statements go out with BEGIN and the handler's first statement, in one
// batch (lazytx.Prelude): the key's advisory lock without waiting and the
// insert of a new key's record, as the fast path of a claim decided up
// front sends them. A message then costs BEGIN-and-claim-and-statement,
// the handler's other statements, and COMMIT: one round trip fewer than a
// transaction that begins on its own.
//
// When the key is held or has a row, the claim fails on the server (its
// insert, or deferredMarker cast to a number), which aborts the transaction before
// the handler's statement runs: the statement, and every one after it,
// fails with errDeferredRefused, and Commit and Rollback return it. It
// wraps store.ErrLeaseLost: the stage claims again, decided up front, and
// replays the record, or waits for the holder, or runs the key if it came
// free. Nothing of the refused transaction commits; what the handler did
// outside the database before its first statement is all that runs for a
// duplicate.

// deferredToken is a deferred claim's token: it has to be known before the
// claim is sent. The claim only takes a key that has no row, so no token of
// the key's current record is below it, and a later claim of the key takes
// the greater of the sequence's next and the row's token plus one.
const deferredToken = 1

// deferredMarker is the text a deferred claim's statements fail to cast
// when they do not take the key (SQLSTATE 22P02).
const deferredMarker = "oncemill: the key is held or has a record"

// newTokenFromSequence gives a claim decided up front the sequence's next
// token, and deferredTokenLiteral a deferred claim its token.
var (
	newTokenFromSequence = strings.NewReplacer("{{NEW_TOKEN}}", "nextval({{SEQ_LITERAL}})")
	deferredTokenLiteral = strings.NewReplacer("{{NEW_TOKEN}}", fmt.Sprint(deferredToken))
)

// A deferred claim of a new key that no lookup in other partitions guards
// (sqlClaimNewDeferred, sqlPartClaimNewCurrentDeferred) is a plain INSERT ..
// VALUES that fails when it does not take the key: the key's lock, tried
// first, leaves a NOT NULL column NULL when another claim holds it (SQLSTATE
// 23502), the unique index refuses a key that has a row (23505), and in
// the partitioned layout the partition's range refuses a clock outside it
// (23514). A failed statement aborts the transaction, which is what a
// refused deferred claim has to do, so the insert needs no ON CONFLICT
// arbiter (a second probe of the unique index), no INSERT .. SELECT and no
// CTE to turn "nothing inserted" into a failure (deferredForm), each of
// which PostgreSQL pays for on every claim (docs/benchmarks.md, "The
// deferred claim as a plain insert").

// sqlClaimNewDeferred is sqlClaimNew's deferred form: the token is NULL
// when the key's lock ($6) is held. Parameters as sqlClaimNew's.
const sqlClaimNewDeferred = `
INSERT INTO {{TABLE}} (scope, key, fingerprint, status, token, attempt, taken_over,
	expires_at, purge_at, created_at, updated_at, message_uuid)
VALUES ($1::text, $2::text, $3::text, {{SUCCEEDED}}, CASE WHEN pg_try_advisory_xact_lock({{CLAIM_LOCK}}, $6) THEN {{NEW_TOKEN}} END, 1, false,
	now() + $4::int8 * interval '1 microsecond', now() + $5::int8 * interval '1 microsecond', now(), now(), $7::text)`

// sqlPartClaimNewCurrentDeferred is sqlPartClaimNewCurrent's deferred form:
// claimed_at is the clock read after the key's lock ($6) was taken, NULL
// when it is held; the partition's own range, which PostgreSQL checks on
// an insert into a partition by name, stands for the statement's check of
// the clock against [{{LOOKUP_FROM}}, {{UNTIL}}), its bounds, so
// sqlPartClaimNewCurrent's argument holds as it is. Parameters as
// sqlClaimNew's.
const sqlPartClaimNewCurrentDeferred = `
INSERT INTO {{PARTITION}} (scope, key, fingerprint, status, token, attempt, taken_over,
	expires_at, purge_at, created_at, updated_at, message_uuid, claimed_at)
VALUES ($1::text, $2::text, $3::text, {{SUCCEEDED}}, {{NEW_TOKEN}}, 1, false,
	now() + $4::int8 * interval '1 microsecond', now() + $5::int8 * interval '1 microsecond', now(), now(), $7::text,
	CASE WHEN ` + sqlReadCommitted + ` AND pg_try_advisory_xact_lock({{CLAIM_LOCK}}, $6) THEN clock_timestamp() END)`

// deferredForm turns sqlPartClaimNew, an insert that returns the token, or
// nothing when the key has a row, into a deferred claim's, which fails
// instead of returning nothing.
func deferredForm(insert string) string {
	return "WITH ins AS (" + deferredTokenLiteral.Replace(insert) + ")\n" +
		"SELECT coalesce((SELECT token::text FROM ins), '" + deferredMarker + "')::int8"
}

// errDeferredRefused is what the handler's statements, Commit and Rollback
// return after a deferred claim did not take the key.
var errDeferredRefused = fmt.Errorf("the claim sent with the handler's first statement did not take the key (another delivery holds it or has recorded it, or the claim failed), so nothing in this transaction commits; return the error: the delivery is claimed again and answered from the record: %w", store.ErrLeaseLost)

// deferredClaim is a deferred claim's statements: lazytx.Prelude.
type deferredClaim struct {
	s   *Store
	req store.TxRequest
	// purge is the record's purge time from now.
	purge time.Duration
	// lockFirst is whether Queue sent the key's lock in a statement of its
	// own, whose result Read reads first.
	lockFirst bool
}

var _ lazytx.Prelude = (*deferredClaim)(nil)

// Queue queues the claim. In the partitioned layout, unless the key is
// taken in one statement (partClaims.inOneStatement), the lock goes in a
// statement of its own, so that the insert's snapshot, taken after it,
// holds every row a previous holder committed (sql_partitioned.go).
func (c *deferredClaim) Queue(b *pgx.Batch) {
	s, req := c.s, &c.req
	h := keyHash(req.Scope, req.Key)
	lock := claimLockKey(h)
	insert := s.sql.claimDeferred
	c.lockFirst = false
	if s.opts.Layout == LayoutPartitioned {
		claims := s.keyFilters.Load().claimsFor(h, &s.sql.part)
		insert = claims.deferredCurrent
		if !claims.inOneStatement(time.Now()) {
			b.Queue(s.sql.partLockDeferred, lock)
			insert, c.lockFirst = claims.deferred, true
		}
	}
	queueNewKey(b, insert, !c.lockFirst, req, c.purge, lock)
}

// Read reads the claim's results after BEGIN's (err). Any failure refuses
// the claim: a key held or recorded, and every other (BEGIN's, no partition
// for now, a lost connection), which the claim decided up front meets
// again and handles: a database that is down fails it, a store failure
// that spends no attempt.
func (c *deferredClaim) Read(br pgx.BatchResults, err error) error {
	switch {
	case err != nil:
	case c.lockFirst: // the lock, then deferredForm's insert, which returns the token
		if _, err = br.Exec(); err == nil {
			var token int64
			err = br.QueryRow().Scan(&token)
		}
	default: // the insert, which fails unless it takes the key
		_, err = br.Exec()
	}
	if err != nil {
		return fmt.Errorf("oncemill: postgres: claim %q/%q: %w (%w)", c.req.Scope, c.req.Key, errDeferredRefused, err)
	}
	return nil
}

// claimDeferred returns the deferred claim of req on conn: DecisionExecute,
// the transaction to begin with the handler's first statement.
func (s *Store) claimDeferred(conn *pgxpool.Conn, req store.TxRequest, purge time.Duration, started time.Time) store.TxResult {
	t := &claimTx{s: s, conn: conn, scope: req.Scope, key: req.Key, ttl: req.SuccessTTL, started: started,
		deferred: deferredClaim{s: s, req: req, purge: purge}}
	t.lazy = lazytx.New(conn, s.txOptions(), s.opts.StatementTimeout, &t.deferred)
	t.handler = newHandlerTx(t.lazy, t, true)
	claim := store.Claim{Scope: req.Scope, Key: req.Key, Token: deferredToken, Attempt: 1, MessageUUID: req.MessageUUID}
	return store.TxResult{ClaimResult: store.ClaimResult{Decision: store.DecisionExecute, Claim: claim}, Tx: t}
}
