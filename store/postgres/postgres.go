package postgres

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/configerr"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/requests"
)

// Store is a store.Store on a PostgreSQL table, shared by every worker that
// points at it, and a store.Transactional: it can write the record inside
// the handler's own transaction. It is safe for concurrent use. Create it
// with New, create its table with Migrate, and stop it with Close.
type Store struct {
	pool  *pgxpool.Pool
	opts  Options
	names names
	sql   statements

	mu        sync.RWMutex // guards closed against new operations
	closed    bool
	closeOnce sync.Once
	inflight  sync.WaitGroup // operations that got in before Close

	cleanupKey   int64
	stopCleaner  context.CancelFunc
	cleanerDone  chan struct{}
	telemetry    *telemetry
	cleanupMu    sync.Mutex // one pass at a time within this process
	claimRetries int        // bound on statement runs per claim (READ COMMITTED corner)
	wm           watermarkStatements

	// The partitioned layout's: the partition width, the advisory lock key
	// of partition creation, and when each partition read by the cleaner
	// may be dropped at the earliest (guarded by cleanupMu).
	width        time.Duration
	partitionKey int64
	partNext     map[string]time.Time
	// keyFilters is what claims consult (keyfilters.go); nil until the
	// cleaner first loads the filters.
	keyFilters atomic.Pointer[keyFilters]
	// beginReadCommitted is set by the first one-transaction claim that
	// found its transaction at another level than read committed (the
	// server's default: sqlReadCommitted): from then on every claim's BEGIN
	// names read committed (txOptions).
	beginReadCommitted atomic.Bool

	// reruns counts claims that a statement left unanswered (the READ
	// COMMITTED corner) and that ran again; for tests.
	reruns atomic.Int64
}

var (
	_ store.Store           = (*Store)(nil)
	_ store.Admin           = (*Store)(nil)
	_ store.Transactional   = (*Store)(nil)
	_ store.KafkaWatermarks = (*Store)(nil)
)

// New returns a store over pool configured by opts. It does no I/O: call
// Migrate once (from any number of workers) before the first ClaimLease. The pool
// stays the caller's: Close does not close it.
//
// Size the pool for the handlers in flight: in the one-transaction mode each
// holds one connection for its transaction and needs no other; in the lease
// mode each takes one for a statement at a time. Add one for the cleaner.
func New(pool *pgxpool.Pool, opts Options) (*Store, error) {
	if pool == nil {
		return nil, configerr.New("pool", "nil; pass a *pgxpool.Pool from pgxpool.New")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	n := newNames(opts.Schema, opts.Table)
	s := &Store{
		pool:         pool,
		opts:         opts,
		names:        n,
		sql:          newStatements(n, opts.AsyncBegin, opts.Layout),
		wm:           newWatermarkStatements(n),
		cleanupKey:   lockKey("cleanup", n),
		claimRetries: 10,
		width:        cmp.Or(opts.width, partitionWidth(opts.Retention)),
		partitionKey: lockKey("partitions", n),
		partNext:     map[string]time.Time{},
	}
	if s.telemetry, err = newTelemetry(s); err != nil {
		return nil, err
	}
	if opts.CleanupInterval > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		s.stopCleaner = cancel
		s.cleanerDone = make(chan struct{})
		go s.cleaner(ctx, opts.CleanupInterval)
	}
	return s, nil
}

// Limits implements store.Store and store.Transactional: Options.MaxKeyLen
// and Options.MaxResultBytes.
func (s *Store) Limits() store.Limits {
	return store.Limits{MaxKeyLen: s.opts.MaxKeyLen, MaxResultBytes: s.opts.MaxResultBytes}
}

// Close refuses new operations, waits for those already under way (each is
// bounded by Options.StatementTimeout), stops the background cleaner, and
// waits for it. Afterwards every operation returns store.ErrClosed; a
// one-transaction claim taken before Close can still commit or roll back.
// Close is idempotent and does not close the pool.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.inflight.Wait()
		if s.stopCleaner != nil {
			s.stopCleaner()
			<-s.cleanerDone
		}
		s.telemetry.close()
	})
	return nil
}

func (s *Store) isClosed() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.closed
}

// enter admits one operation: it refuses once Close has begun, and bounds
// ctx by Options.StatementTimeout plus extra (a wait the operation is
// allowed on top). Call leave with the returned cancel when done.
func (s *Store) enter(ctx context.Context, op string, extra time.Duration) (context.Context, context.CancelFunc, error) {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return ctx, nil, fmt.Errorf("oncemill: postgres: %s: %w", op, store.ErrClosed)
	}
	s.inflight.Add(1)
	s.mu.RUnlock()
	ctx, cancel := context.WithTimeout(ctx, s.opts.StatementTimeout+extra)
	return ctx, cancel, nil
}

func (s *Store) leave(cancel context.CancelFunc) {
	cancel()
	s.inflight.Done()
}

// wrap adds the operation to a database error, and a hint when the table is
// missing or older than this build (a column a later migration adds).
func wrap(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return fmt.Errorf("oncemill: postgres: %s: %w (run Store.Migrate first)", op, err)
	}
	if errors.As(err, &pgErr) && pgErr.Code == "42703" { // undefined_column
		return fmt.Errorf("oncemill: postgres: %s: %w (the table is at an older schema version than this build: run Store.Migrate, or \"oncemill migrate\")", op, err)
	}
	if errors.As(err, &pgErr) && isNoPartition(err) {
		return fmt.Errorf("oncemill: postgres: %s: %w (%s; no partition covers it though the partitions from now on were created: "+
			"the server's clock should lie in one, \"oncemill stats\" lists them)", op, err, pgErr.Detail)
	}
	if errors.As(err, &pgErr) && pgErr.Code == "42P10" { // no unique index for ON CONFLICT
		return fmt.Errorf("oncemill: postgres: %s: %w (the table has the partitioned layout: set Options.Layout = postgres.LayoutPartitioned)", op, err)
	}
	return fmt.Errorf("oncemill: postgres: %s: %w", op, err)
}

// maxErrorKindLen bounds a stored error kind, which names a kind, in bytes.
const maxErrorKindLen = 256

func invalid(op, format string, args ...any) error {
	return fmt.Errorf("oncemill: postgres: %s: %s: %w", op, fmt.Sprintf(format, args...), store.ErrInvalidRequest)
}

// checkText refuses what a PostgreSQL text column cannot hold: a NUL byte,
// or bytes that are not UTF-8. Checked before a request joins a batch, so a
// bad one cannot fail the statement of others.
func checkText(op, field, v string) error {
	if strings.IndexByte(v, 0) >= 0 {
		return invalid(op, "%s contains a NUL byte, which PostgreSQL text cannot store (the idempotency stage hashes such keys with keygen.StorableKey before they reach a store)", field)
	}
	if !utf8.ValidString(v) {
		return invalid(op, "%s is not valid UTF-8, which PostgreSQL text requires (the idempotency stage hashes such keys with keygen.StorableKey before they reach a store)", field)
	}
	return nil
}

// checkID validates the scope and key of any operation: what a text column
// cannot hold is refused before it reaches a statement. The length limits
// apply where records are created (checkNewID): a record stored under
// other options can still be read, finished and deleted.
func (s *Store) checkID(op, scope, key string) error {
	if key == "" {
		return invalid(op, "empty key")
	}
	if err := checkText(op, "scope", scope); err != nil {
		return err
	}
	return checkText(op, "key", key)
}

// checkNewID validates the scope, key and fingerprint of a claim.
func (s *Store) checkNewID(op, scope, key, fingerprint string) error {
	if err := checkText(op, "fingerprint", fingerprint); err != nil {
		return err
	}
	if len(key) > s.opts.MaxKeyLen {
		return invalid(op, "key is %d bytes, longer than MaxKeyLen %d; hash long keys with keygen.StorableKey", len(key), s.opts.MaxKeyLen)
	}
	if len(scope) > store.MaxScopeLen {
		return invalid(op, "scope is %d bytes, longer than store.MaxScopeLen %d", len(scope), store.MaxScopeLen)
	}
	return s.checkID(op, scope, key)
}

// micros rounds d up to whole microseconds, PostgreSQL's time resolution, so
// that a positive duration never becomes zero.
func micros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// ClaimLease implements store.Store: one statement, in a transaction of its own.
func (s *Store) ClaimLease(ctx context.Context, req store.LeaseRequest) (store.ClaimResult, error) {
	if err := requests.ValidateLease(req); err != nil {
		return store.ClaimResult{}, fmt.Errorf("oncemill: postgres: begin: %w", err)
	}
	if err := s.checkNewID("begin", req.Scope, req.Key, req.Fingerprint); err != nil {
		return store.ClaimResult{}, err
	}
	req.MessageUUID = storableText(req.MessageUUID, maxMessageUUIDLen)
	ctx, cancel, err := s.enter(ctx, "begin", 0)
	if err != nil {
		return store.ClaimResult{}, err
	}
	defer s.leave(cancel)
	ensured := 0
	for runs := 1; ; runs++ {
		var res store.ClaimResult
		if s.opts.Layout == LayoutPartitioned {
			res, err = s.claimLeasePartitioned(ctx, req)
			if again, err := s.ensureOnNoPartition(ctx, err, &ensured); err != nil {
				return store.ClaimResult{}, err
			} else if again {
				continue
			}
		} else {
			res, err = s.claimStatement(ctx, s.pool, s.sql.begin, req.Scope, req.Key, req.Fingerprint,
				micros(req.LeaseDuration), micros(req.LeaseDuration+req.Retain), req.MessageUUID)
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
func (s *Store) claimStatement(ctx context.Context, q querier, sql string, args ...any) (store.ClaimResult, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return store.ClaimResult{}, err
	}
	return s.scanClaim(rows, args[0].(string), args[1].(string))
}

// claimLeasePartitioned is ClaimLease's statement in the partitioned
// layout: BEGIN, the key's advisory lock, the claim and COMMIT in one
// batch (one round trip).
func (s *Store) claimLeasePartitioned(ctx context.Context, req store.LeaseRequest) (store.ClaimResult, error) {
	b := &pgx.Batch{}
	// At read committed whatever the server's default, so that the claim's
	// snapshot is taken after the lock is granted.
	// (A plain query, not Batch.BeginTx: the pool takes the connection back
	// when the batch is closed.)
	b.Queue("begin isolation level read committed")
	h := keyHash(req.Scope, req.Key)
	b.Queue(s.sql.partLockLease, claimLockKey(h))
	b.Queue(s.keyFilters.Load().claimsFor(h, &s.sql.part).lease, req.Scope, req.Key, req.Fingerprint,
		micros(req.LeaseDuration), micros(req.LeaseDuration+req.Retain), req.MessageUUID, micros(s.width))
	b.Queue("commit")
	br := s.pool.SendBatch(ctx, b)
	_, err := br.Exec()
	var res store.ClaimResult
	if err == nil {
		res, err = s.batchClaim(br, req.Scope, req.Key)
	}
	if err == nil {
		var tag pgconn.CommandTag
		if tag, err = br.Exec(); err == nil && tag.String() != "COMMIT" {
			err = fmt.Errorf("the claim's transaction ended with %s, not COMMIT", tag)
		}
	}
	// An error leaves the transaction open: the pool closes such a
	// connection as it takes it back.
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return store.ClaimResult{}, err
	}
	return res, nil
}

// batchClaim reads the results of a batch's lock statement and the claim
// after it.
func (s *Store) batchClaim(br pgx.BatchResults, scope, key string) (store.ClaimResult, error) {
	if _, err := br.Exec(); err != nil {
		return store.ClaimResult{}, err
	}
	rows, err := br.Query()
	if err != nil {
		return store.ClaimResult{}, err
	}
	return s.scanClaim(rows, scope, key)
}

// scanClaim reads the answer of a claim statement: the decision, or
// decision 0 when the statement left the key undecided.
func (s *Store) scanClaim(rows pgx.Rows, scope, key string) (store.ClaimResult, error) {
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
		rec              = &store.Record{Scope: scope, Key: key}
		dest             = []any{&decision, &rec.Fingerprint, &status, &rec.Token, &attempt, &takenOver,
			&rec.Result, &kind, &rec.ErrorMessage, &rec.CreatedAt, &rec.UpdatedAt, &rec.ExpiresAt, &rec.MessageUUID}
	)
	if len(rows.FieldDescriptions()) > len(dest) {
		dest = append(dest, nil) // the claim form's lock_timeout restore
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
	return store.ClaimResult{Decision: store.Decision(decision), Record: rec}, nil
}

// Complete implements store.Store.
func (s *Store) Complete(ctx context.Context, lease store.Claim, out store.Completion) error {
	out, err := s.checkComplete("complete", lease, out)
	if err != nil {
		return err
	}
	ctx, cancel, err := s.enter(ctx, "complete", 0)
	if err != nil {
		return err
	}
	defer s.leave(cancel)
	tag, err := s.pool.Exec(ctx, s.sql.complete, lease.Scope, lease.Key, lease.Token,
		int16(out.Status), out.Result, string(out.ErrorKind), out.ErrorMessage, micros(out.TTL))
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
		return out, invalid(op, "result is %d bytes, more than MaxResultBytes %d; raise Options.MaxResultBytes or lower policy.MaxResultBytes", len(out.Result), s.opts.MaxResultBytes)
	}
	out.Result = bytes.Clone(out.Result)
	out.ErrorKind = store.ErrorKind(storableText(string(out.ErrorKind), maxErrorKindLen))
	out.ErrorMessage = storableText(out.ErrorMessage, maxErrorMessageLen)
	return out, nil
}

// maxMessageUUIDLen bounds a stored message UUID in bytes. Like error
// texts, a UUID is made to fit (storableText) rather than refused: it
// decides nothing, and refusing it would refuse the delivery.
const maxMessageUUIDLen = 1024

// storableText makes an error text fit a text column: NUL bytes and invalid
// UTF-8 become U+FFFD, and it is cut at a character boundary after max
// bytes. Error texts describe a failure; refusing one would leave the
// failure unrecorded.
func storableText(v string, max int) string {
	if strings.IndexByte(v, 0) >= 0 {
		v = strings.ReplaceAll(v, "\x00", "\uFFFD")
	}
	if !utf8.ValidString(v) {
		v = strings.ToValidUTF8(v, "\uFFFD")
	}
	if len(v) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(v[cut]) {
			cut--
		}
		v = v[:cut]
	}
	return v
}

func leaseLost(op string, l store.Claim) error {
	return fmt.Errorf("oncemill: postgres: %s %q/%q with token %d: %w", op, l.Scope, l.Key, l.Token, store.ErrLeaseLost)
}

// Release implements store.Store. With keep <= 0 the record is removed.
func (s *Store) Release(ctx context.Context, lease store.Claim, keep time.Duration) error {
	if err := s.checkID("release", lease.Scope, lease.Key); err != nil {
		return err
	}
	ctx, cancel, err := s.enter(ctx, "release", 0)
	if err != nil {
		return err
	}
	defer s.leave(cancel)
	var tag pgconn.CommandTag
	if keep <= 0 {
		tag, err = s.pool.Exec(ctx, s.sql.releaseDelete, lease.Scope, lease.Key, lease.Token)
	} else {
		tag, err = s.pool.Exec(ctx, s.sql.release, lease.Scope, lease.Key, lease.Token, micros(keep))
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
		return store.Claim{}, invalid("extend", "duration %v must be positive", d)
	}
	if err := s.checkID("extend", lease.Scope, lease.Key); err != nil {
		return store.Claim{}, err
	}
	ctx, cancel, err := s.enter(ctx, "extend", 0)
	if err != nil {
		return store.Claim{}, err
	}
	defer s.leave(cancel)
	var attempt int32
	var expires time.Time
	err = s.pool.QueryRow(ctx, s.sql.extend, lease.Scope, lease.Key, lease.Token, micros(d)).Scan(&attempt, &expires)
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

// Get implements store.Store. An in-progress record whose lease has expired
// is not returned, like any other expired record. A one-transaction claim
// is invisible until its commit.
func (s *Store) Get(ctx context.Context, scope, key string) (store.Record, error) {
	if err := s.checkID("get", scope, key); err != nil {
		return store.Record{}, err
	}
	ctx, cancel, err := s.enter(ctx, "get", 0)
	if err != nil {
		return store.Record{}, err
	}
	defer s.leave(cancel)
	rec, err := scanRecord(s.pool.QueryRow(ctx, s.sql.get, scope, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Record{}, fmt.Errorf("oncemill: postgres: get %q/%q: %w", scope, key, store.ErrNotFound)
	}
	if err != nil {
		return store.Record{}, wrap("get", err)
	}
	return rec, nil
}

// scanRecord reads a row of recordColumns.
func scanRecord(row pgx.Row) (store.Record, error) {
	var (
		rec     store.Record
		status  int16
		attempt int32
		kind    string
	)
	err := row.Scan(&rec.Scope, &rec.Key, &rec.Fingerprint, &status, &rec.Token, &attempt,
		&rec.Result, &kind, &rec.ErrorMessage, &rec.CreatedAt, &rec.UpdatedAt, &rec.ExpiresAt, &rec.MessageUUID)
	rec.Status, rec.Attempt, rec.ErrorKind = store.Status(status), int(attempt), store.ErrorKind(kind)
	if rec.Status == store.StatusInProgress {
		rec.LeaseExpiresAt = rec.ExpiresAt
	}
	return rec, err
}

// Delete implements store.Admin: one statement, which deletes the row only
// under token and says why it did not.
func (s *Store) Delete(ctx context.Context, scope, key string, token int64) error {
	if err := s.checkID("delete", scope, key); err != nil {
		return err
	}
	ctx, cancel, err := s.enter(ctx, "delete", 0)
	if err != nil {
		return err
	}
	defer s.leave(cancel)
	var deleted, exists bool
	if err := s.pool.QueryRow(ctx, s.sql.del, scope, key, token).Scan(&deleted, &exists); err != nil {
		return wrap("delete", err)
	}
	switch {
	case deleted:
		return nil
	case exists:
		return fmt.Errorf("oncemill: postgres: delete %q/%q with token %d: the record has another token now: %w", scope, key, token, store.ErrLeaseLost)
	}
	return fmt.Errorf("oncemill: postgres: delete %q/%q: %w", scope, key, store.ErrNotFound)
}
