package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/requests"
	"github.com/oncemill/oncemill/store/postgres/internal/guardtx"
	"github.com/oncemill/oncemill/store/postgres/internal/lazytx"
)

// The one-transaction mode (store.Transactional). Claim sends BEGIN and the
// claim statement in one round trip; the handler then works in that
// transaction; Commit sends COMMIT, preceded in the same round trip by a
// statement that stores the produced messages when there are some. A
// message costs the round trips and the one commit of a plain transaction.

// ErrTxOwned is returned by Commit and Rollback of the transaction a
// handler finds with TxFromContext: the stage ends it, committing when the
// handler returns nil and rolling back when it returns an error.
var ErrTxOwned = errors.New("oncemill: postgres: the handler's transaction is committed or rolled back by oncemill: return nil to commit, an error to roll back")

// errAborted: a statement of the handler failed, and the handler went on to
// return nil; the transaction can only roll back.
var errAborted = fmt.Errorf("the transaction was aborted by an earlier error of the handler's statements, so it rolled back: %w", pgx.ErrTxCommitRollback)

// lockNotAvailable is lock_timeout's SQLSTATE: the claim waited its bound
// for another delivery's transaction.
const lockNotAvailable = "55P03"

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
	req.MessageUUID = storableText(req.MessageUUID, maxMessageUUIDLen)
	ctx, cancel, err := s.enter(ctx, "claim", req.Wait)
	if err != nil {
		return store.TxResult{}, err
	}
	defer s.leave(cancel)
	purge := max(claimTTL(req.SuccessTTL), req.Retain)
	waitMS := max(req.Wait.Milliseconds(), 1) // lock_timeout 0 would mean no bound
	h := keyHash(req.Scope, req.Key)
	// A claim that waited for another delivery's transaction and then did
	// not take the key finds its row committed after the statement's
	// snapshot: the statement leaves it undecided, and it runs again in a
	// new transaction (sql.go). So a second run, or a lock timeout, is what
	// contention looks like here. A claim that finds no partition for now
	// creates it (ensured, up to partitionEnsures times), and one that
	// names a partition that is gone loads the key filters again
	// (refreshed, once). One whose transaction is not at read committed
	// in the partitioned layout begins again, naming it
	// (namedReadCommitted, once; beginReadCommitted).
	var ensured int
	var refreshed, namedReadCommitted bool
	for runs := 1; ; runs++ {
		// Before the transaction begins, so that time since started bounds
		// the transaction's age at its commit (claimTTL).
		started := time.Now()
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			return store.TxResult{}, wrap("claim", err)
		}
		if req.Deferrable {
			return s.claimDeferred(conn, req, purge, started), nil
		}
		claim := s.claimTx
		if s.opts.Layout == LayoutPartitioned {
			claim = s.claimTxPartitioned
		}
		res, tx, err := claim(ctx, conn, req, purge, waitMS, h)
		if err == nil && res.Decision == store.DecisionExecute {
			t := &claimTx{s: s, conn: conn, scope: req.Scope, key: req.Key, ttl: req.SuccessTTL, started: started}
			t.handler = newHandlerTx(tx, t, true)
			return store.TxResult{ClaimResult: res, Tx: t}, nil
		}
		// Nothing to keep: end the transaction and give the connection back.
		rollback(ctx, conn)
		if again, err := s.ensureOnNoPartition(ctx, err, &ensured); err != nil {
			return store.TxResult{}, err
		} else if again {
			continue
		}
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == lockNotAvailable:
			return store.TxResult{ClaimResult: store.ClaimResult{Decision: store.DecisionHeld}, Contended: true}, nil
		case isNotReadCommitted(err) && !namedReadCommitted:
			// The server's default isolation is not read committed: this
			// claim, and every one after it, names it in its BEGIN.
			s.beginReadCommitted.Store(true)
			namedReadCommitted = true
			continue
		case isUndefinedTable(err) && s.opts.Layout == LayoutPartitioned && !refreshed:
			// The partition of now that the claim in one statement names
			// is gone (dropped by hand): the key filters are stale.
			if err := s.refreshKeyFilters(ctx); err != nil {
				return store.TxResult{}, wrap("claim", err)
			}
			refreshed = true
			continue
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

// txOptions begin a one-transaction claim's transaction: Options.TxOptions,
// at read committed once the partitioned layout found the server's default
// is not (beginReadCommitted).
func (s *Store) txOptions() pgx.TxOptions {
	opts := s.opts.TxOptions
	if s.beginReadCommitted.Load() {
		opts.IsoLevel = pgx.ReadCommitted
	}
	return opts
}

// isNotReadCommitted tells whether err is sqlPartLockTx's failure in a
// transaction that is not at read committed.
func isNotReadCommitted(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, notReadCommittedMarker)
}

// claimTx begins the transaction and claims the key in it: BEGIN and
// sqlClaimNew in one round trip (pgx.Batch.BeginTx), which takes a new key
// without waiting; for a key that has a row, or is held, sqlClaim decides
// in a second round trip, waiting for the holder up to the claim's bound.
func (s *Store) claimTx(ctx context.Context, conn *pgxpool.Conn, req store.TxRequest, purge time.Duration, waitMS int64, h uint64) (store.ClaimResult, pgx.Tx, error) {
	lock := claimLockKey(h)
	b := &pgx.Batch{}
	b.BeginTx(s.txOptions())
	queueNewKey(b, s.sql.claimNew, true, &req, purge, lock)
	br := conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return store.ClaimResult{}, nil, err
	}
	res, tx, taken, err := takeNewKey(br, nil, req)
	if taken || err != nil {
		return res, tx, err
	}
	res, err = s.claimStatement(ctx, tx, s.sql.claim, req.Scope, req.Key, req.Fingerprint,
		micros(claimTTL(req.SuccessTTL)), micros(purge), req.MessageUUID, waitMS, lock)
	return res, tx, err
}

// claimTxPartitioned is claimTx in the partitioned layout. While the key
// filters leave only the keyed partition of now to look a new key up in,
// the first round trip is BEGIN and sqlPartClaimNewCurrent, as the DELETE
// layout's; for a key it does not take, the key's advisory lock (waiting
// up to waitMS) and sqlPartClaim decide in a second. Otherwise it is
// BEGIN, the lock and sqlPartClaimNew, which takes a new key, looked up in
// the partitions the key filters cannot rule out; for a key that has a
// row, sqlPartClaim decides in a second round trip, under the lock.
func (s *Store) claimTxPartitioned(ctx context.Context, conn *pgxpool.Conn, req store.TxRequest, purge time.Duration, waitMS int64, h uint64) (store.ClaimResult, pgx.Tx, error) {
	lock := claimLockKey(h)
	claims := s.keyFilters.Load().claimsFor(h, &s.sql.part)
	oneStatement := claims.inOneStatement(time.Now())
	b := &pgx.Batch{}
	b.BeginTx(s.txOptions())
	if oneStatement {
		queueNewKey(b, claims.newCurrent, true, &req, purge, lock)
	} else {
		b.Queue(s.sql.partLockTx, waitMS, lock)
		queueNewKey(b, claims.new, false, &req, purge, lock)
	}
	br := conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return store.ClaimResult{}, nil, err
	}
	var err error
	if !oneStatement {
		_, err = br.Exec() // the lock
	}
	res, tx, taken, err := takeNewKey(br, err, req)
	if taken || err != nil {
		return res, tx, err
	}
	args := []any{req.Scope, req.Key, req.Fingerprint, micros(claimTTL(req.SuccessTTL)), micros(purge), req.MessageUUID, micros(s.width)}
	if !oneStatement {
		res, err = s.claimStatement(ctx, tx, claims.tx, args...)
		return res, tx, err
	}
	b = &pgx.Batch{}
	b.Queue(s.sql.partLockTx, waitMS, lock)
	b.Queue(claims.tx, args...)
	br = tx.SendBatch(ctx, b)
	res, err = s.batchClaim(br, req.Scope, req.Key)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return res, tx, err
}

// queueNewKey queues sql, an insert of a new key's record, with its
// arguments: $6 the key's lock (lock) and $7 the message UUID when the
// statement takes the lock itself (locks: sqlClaimNew,
// sqlPartClaimNewCurrent and their deferred forms), $6 the message UUID when
// the lock was taken before it (sqlPartClaimNew).
func queueNewKey(b *pgx.Batch, sql string, locks bool, req *store.TxRequest, purge time.Duration, lock int32) {
	if locks {
		b.Queue(sql, req.Scope, req.Key, req.Fingerprint, micros(claimTTL(req.SuccessTTL)), micros(purge), lock, req.MessageUUID)
		return
	}
	b.Queue(sql, req.Scope, req.Key, req.Fingerprint, micros(claimTTL(req.SuccessTTL)), micros(purge), req.MessageUUID)
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

// rollback ends whatever transaction conn is in and releases it. A
// connection that cannot roll back is closed, so the pool never hands out
// one in a transaction.
func rollback(ctx context.Context, conn *pgxpool.Conn) {
	if conn.Conn().PgConn().TxStatus() != 'I' {
		if _, err := conn.Exec(ctx, "rollback"); err != nil {
			_ = conn.Conn().Close(ctx)
		}
	}
	conn.Release()
}

// RecordRollback implements store.Transactional.
func (s *Store) RecordRollback(ctx context.Context, lease store.Claim, fingerprint string, out store.Completion) error {
	if out.Status != store.StatusCachedFailure && out.Status != store.StatusRetryable {
		return invalid("record rollback", "outcome status must be failed or retryable, not %v", out.Status)
	}
	if out.TTL <= 0 {
		return invalid("record rollback", "outcome TTL %v must be positive", out.TTL)
	}
	if err := s.checkNewID("record rollback", lease.Scope, lease.Key, fingerprint); err != nil {
		return err
	}
	ctx, cancel, err := s.enter(ctx, "record rollback", 0)
	if err != nil {
		return err
	}
	defer s.leave(cancel)
	if s.opts.Layout == LayoutPartitioned {
		return s.recordRollbackPartitioned(ctx, lease, fingerprint, out)
	}
	tag, err := s.pool.Exec(ctx, s.sql.recordRollback, lease.Scope, lease.Key, fingerprint, int16(out.Status), lease.Token, lease.Attempt,
		micros(out.TTL), storableText(string(out.ErrorKind), maxErrorKindLen), storableText(out.ErrorMessage, maxErrorMessageLen), micros(out.TTL),
		claimLockKey(keyHash(lease.Scope, lease.Key)), storableText(lease.MessageUUID, maxMessageUUIDLen))
	if err != nil {
		return wrap("record rollback", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("oncemill: postgres: record rollback %q/%q: another delivery claimed or finished the key: %w", lease.Scope, lease.Key, store.ErrLeaseLost)
	}
	return nil
}

// recordRollbackPartitioned is RecordRollback in the partitioned layout:
// the key's advisory lock without waiting, then the write, in one
// transaction at read committed whatever the server's default, so that
// the write's lookup sees what the key's last holder committed before the
// lock was granted (sql_partitioned.go). A failure is rare, so its BEGIN
// names the level from the first, where a claim's names it only when the
// default is another (beginReadCommitted).
func (s *Store) recordRollbackPartitioned(ctx context.Context, lease store.Claim, fingerprint string, out store.Completion) error {
	h := keyHash(lease.Scope, lease.Key)
	ensured := 0
	for {
		var n int64
		err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
			var locked bool
			if err := tx.QueryRow(ctx, s.sql.partTryLock, claimLockKey(h)).Scan(&locked); err != nil || !locked {
				return err
			}
			return tx.QueryRow(ctx, s.keyFilters.Load().claimsFor(h, &s.sql.part).rollback, lease.Scope, lease.Key, fingerprint, int16(out.Status), lease.Token, lease.Attempt,
				micros(out.TTL), storableText(string(out.ErrorKind), maxErrorKindLen), storableText(out.ErrorMessage, maxErrorMessageLen), micros(out.TTL),
				micros(s.width), storableText(lease.MessageUUID, maxMessageUUIDLen)).Scan(&n)
		})
		if again, err := s.ensureOnNoPartition(ctx, err, &ensured); err != nil {
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

// claimTx is an open one-transaction claim: store.Tx.
type claimTx struct {
	s          *Store
	conn       *pgxpool.Conn
	scope, key string
	ttl        time.Duration
	started    time.Time
	handler    *handlerTx
	// wm is set for the watermark mode's claim (watermark.go): Commit
	// writes the produced messages into the partition's row.
	wm *wmCommit
	// lazy is set for the watermark mode's fast path (watermark_fast.go):
	// the handler's transaction, begun with its first statement; Commit
	// claims the offset.
	lazy *lazytx.Tx
	// deferred is the key mode's deferred claim, lazy's prelude: a field,
	// so that it takes no allocation of its own.
	deferred deferredClaim
	// ended is set before the last round trip, so that the handler's
	// pgx.Tx, and what it made, refuse to touch the connection, which goes
	// back to the pool.
	ended bool
}

var _ store.Tx = (*claimTx)(nil)

type txKey struct{}

// Context implements store.Tx: ctx carrying the handler's pgx.Tx.
func (t *claimTx) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, txKey{}, pgx.Tx(t.handler))
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

// Commit implements store.Tx. It writes the produced messages, and the
// expiry when the transaction outran the expiry's slack, in the commit's
// round trip; otherwise it sends COMMIT alone.
func (t *claimTx) Commit(ctx context.Context, result []byte) error {
	if t.ended {
		return fmt.Errorf("oncemill: postgres: commit: %w", pgx.ErrTxClosed)
	}
	t.ended = true
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.s.opts.StatementTimeout)
	defer cancel()
	if len(result) > t.s.opts.MaxResultBytes {
		rollback(ctx, t.conn)
		return invalid("commit", "result is %d bytes, more than MaxResultBytes %d; raise Options.MaxResultBytes or lower policy.MaxResultBytes", len(result), t.s.opts.MaxResultBytes)
	}
	if t.wm != nil && t.lazy != nil {
		return t.commitFast(ctx, result)
	}
	if t.lazy != nil { // a deferred claim: BEGIN and the claim, unless the handler's first statement took them
		err := t.lazy.Start(ctx)
		if err == nil {
			err = t.lazy.Broken()
		}
		if err != nil {
			rollback(ctx, t.conn)
			if refused := t.lazy.Refused(); refused != nil {
				return refused
			}
			return wrap("commit", err)
		}
	}
	if t.conn.Conn().PgConn().TxStatus() == 'E' {
		rollback(ctx, t.conn)
		return wrap("commit", errAborted)
	}
	var tag pgconn.CommandTag
	var err error
	if stmt, args := t.resultStatement(result); stmt != "" {
		b := &pgx.Batch{}
		b.Queue(stmt, args...)
		b.Queue("commit")
		br := t.conn.SendBatch(ctx, b)
		if _, err = br.Exec(); err == nil {
			tag, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	} else {
		tag, err = t.conn.Exec(ctx, "commit")
	}
	if err == nil && tag.String() != "COMMIT" {
		err = errAborted // COMMIT of an aborted transaction rolls back
	}
	rollback(ctx, t.conn) // a no-op after a commit; releases the connection
	if err != nil {
		return wrap("commit", err)
	}
	if t.wm != nil { // the next message of the partition may take the fast path
		t.wm.cache.put(wmPart(t.wm.pos), wmKnown{next: t.wm.pos.Offset + 1, token: t.wm.token})
	}
	return nil
}

// resultStatement is the statement Commit sends before COMMIT, if any: the
// produced messages, and in the key mode the expiry when the transaction
// outran its slack.
func (t *claimTx) resultStatement(result []byte) (string, []any) {
	switch {
	case t.wm != nil && result != nil:
		return t.s.wm.commitResult, []any{t.wm.group, t.wm.pos.Topic, t.wm.pos.Partition, result}
	case t.wm == nil && (result != nil || time.Since(t.started) > expirySlack(t.ttl)):
		return t.s.sql.commitResult, []any{t.scope, t.key, result, micros(t.ttl)}
	}
	return "", nil
}

// Rollback implements store.Tx.
func (t *claimTx) Rollback(ctx context.Context) error {
	if t.ended {
		return nil
	}
	t.ended = true
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.s.opts.StatementTimeout)
	defer cancel()
	if t.lazy != nil && t.lazy.Settle() != nil {
		_ = t.conn.Conn().Close(ctx) // a batch left mid-way: the connection cannot be trusted
	}
	if t.lazy != nil && t.wm == nil && !t.lazy.Begun() {
		// A deferred claim the handler sent no statement with: whether its
		// failure is the key's, or a duplicate's, only the claim can tell.
		_ = t.lazy.Start(ctx)
	}
	rollback(ctx, t.conn)
	if t.lazy != nil {
		return t.lazy.Refused() // a deferred claim that did not take the key
	}
	return nil
}

// TxFromContext returns the transaction the handler runs in, in the
// one-transaction mode (receiver.NewTransactional). Do the handler's
// database writes on it: they commit together with the record of the
// message's success, or not at all. Its Commit and Rollback return
// ErrTxOwned: the stage ends it. ok is false outside that mode.
func TxFromContext(ctx context.Context) (tx pgx.Tx, ok bool) {
	tx, ok = ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// handlerTx is the pgx.Tx a handler gets in the one-transaction mode: pgx's
// own transaction from Claim's batch, which the stage commits or rolls back
// on the connection directly (so that the completion can share COMMIT's
// round trip). At the top level it refuses to end the transaction itself;
// its savepoints (Begin) are handlerTx values too. Once the stage has ended
// the transaction, every call fails with pgx.ErrTxClosed: the connection is
// back in the pool (guardtx).
type handlerTx struct {
	guardtx.Tx
	owner *claimTx
	top   bool
}

var _ pgx.Tx = (*handlerTx)(nil)

func newHandlerTx(tx pgx.Tx, owner *claimTx, top bool) *handlerTx {
	return &handlerTx{Tx: guardtx.Tx{Tx: tx, Ended: &owner.ended}, owner: owner, top: top}
}

// Begin starts a pseudo nested transaction (a savepoint), as pgx.Tx does.
func (h *handlerTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := h.Check(); err != nil {
		return nil, err
	}
	tx, err := h.Tx.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return newHandlerTx(tx, h.owner, false), nil
}

// Commit of the top level refuses: the stage commits when the handler
// returns nil. A savepoint is released.
func (h *handlerTx) Commit(ctx context.Context) error {
	if h.top {
		return ErrTxOwned
	}
	if err := h.Check(); err != nil {
		return err
	}
	return h.Tx.Tx.Commit(ctx)
}

// Rollback of the top level refuses: the stage rolls back when the handler
// returns an error, so a deferred tx.Rollback(ctx) in the handler is
// harmless. A savepoint is rolled back to.
func (h *handlerTx) Rollback(ctx context.Context) error {
	if h.top {
		return ErrTxOwned
	}
	if err := h.Check(); err != nil {
		return err
	}
	return h.Tx.Tx.Rollback(ctx)
}
