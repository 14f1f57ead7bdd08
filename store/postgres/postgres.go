package postgres

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/store"
)

// Store is a store.Store on a PostgreSQL table, shared by every worker that
// points at it. It is safe for concurrent use. Create it with New, create
// its table with Migrate, and stop it with Close.
type Store struct {
	pool  *pgxpool.Pool
	opts  Options
	names names
	sql   statements

	begins    *batcher[store.BeginRequest, store.BeginResult]
	completes *batcher[completeReq, struct{}]

	mu        sync.RWMutex // guards closed against new requests
	closed    bool
	closeOnce sync.Once
	inflight  sync.WaitGroup // Begins and Completes that got in before Close

	cleanupKey   int64
	stopCleaner  context.CancelFunc
	cleanerDone  chan struct{}
	telemetry    *telemetry
	cleanupMu    sync.Mutex // one pass at a time within this process
	beginRetries int        // bound on statement runs per Begin (READ COMMITTED corner)

	// reruns counts Begins that a statement left unanswered (the READ
	// COMMITTED corner) and that ran again; for tests.
	reruns atomic.Int64
}

var (
	_ store.Store       = (*Store)(nil)
	_ store.KeyLimiter  = (*Store)(nil)
	_ store.TxCompleter = (*Store)(nil)
)

// completeReq is one Complete waiting for a coalesced statement.
type completeReq struct {
	lease store.Lease
	out   store.Outcome
}

// New returns a store over pool configured by opts. It does no I/O: call
// Migrate once (from any number of workers) before the first Begin. The pool
// stays the caller's: Close does not close it.
//
// Size the pool for the handlers that run transactions (each holds a
// connection while it runs), plus 2×BatchWorkers for the coalesced
// statements, plus one for the cleaner.
func New(pool *pgxpool.Pool, opts Options) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pool is nil; pass a *pgxpool.Pool from pgxpool.New", ErrInvalidOptions)
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
		sql:          newStatements(n, opts.AsyncBegin),
		cleanupKey:   lockKey("cleanup", n),
		beginRetries: 10,
	}
	if s.telemetry, err = newTelemetry(s); err != nil {
		return nil, err
	}
	s.begins = newBatcher(opts.BatchWorkers, opts.MaxBatch, s.runBegins)
	s.completes = newBatcher(opts.BatchWorkers, opts.MaxBatch, s.runCompletes)
	if opts.CleanupInterval > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		s.stopCleaner = cancel
		s.cleanerDone = make(chan struct{})
		go s.cleaner(ctx, opts.CleanupInterval)
	}
	return s, nil
}

// MaxKeyLen implements store.KeyLimiter.
func (s *Store) MaxKeyLen() int { return s.opts.MaxKeyLen }

// Close refuses new operations, waits for the Begins and Completes already
// accepted (queued ones included) to finish, stops the background cleaner,
// and waits for it. Afterwards every operation returns store.ErrClosed.
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

func (s *Store) closedErr(op string) error {
	return fmt.Errorf("postgres: %s: %w", op, store.ErrClosed)
}

func (s *Store) checkOpen(op string) error {
	if s.isClosed() {
		return s.closedErr(op)
	}
	return nil
}

// wrap adds the operation to a database error, and a hint when the table is
// missing.
func wrap(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return fmt.Errorf("postgres: %s: %w (run Store.Migrate first)", op, err)
	}
	return fmt.Errorf("postgres: %s: %w", op, err)
}

// maxStatementRetries bounds how often a coalesced statement that failed as
// a whole is run again.
const maxStatementRetries = 3

// retryable reports errors after which a statement certainly did not take
// effect and may run again: a deadlock or serialization failure rolled it
// back, or nothing was sent at all.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "40P01" || pgErr.Code == "40001"
	}
	return pgconn.SafeToRetry(err)
}

func invalid(op, format string, args ...any) error {
	return fmt.Errorf("postgres: %s: %s: %w", op, fmt.Sprintf(format, args...), store.ErrInvalidRequest)
}

// checkText refuses what a PostgreSQL text column cannot hold: a NUL byte,
// or bytes that are not UTF-8. Checked before a request joins a batch, so a
// bad one cannot fail the statement of others.
func checkText(op, field, v string) error {
	if strings.IndexByte(v, 0) >= 0 {
		return invalid(op, "%s contains a NUL byte, which PostgreSQL text cannot store; hash such keys (keygen.Limit) or remove the byte", field)
	}
	if !utf8.ValidString(v) {
		return invalid(op, "%s is not valid UTF-8, which PostgreSQL text requires; hash such keys (keygen.Limit) or encode them", field)
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

// checkNewID validates the scope and key of a Begin.
func (s *Store) checkNewID(op, scope, key string) error {
	if len(key) > s.opts.MaxKeyLen {
		return invalid(op, "key is %d bytes, longer than MaxKeyLen %d; hash long keys with keygen.Limit", len(key), s.opts.MaxKeyLen)
	}
	if len(scope) > MaxScopeLen {
		return invalid(op, "scope is %d bytes, longer than %d", len(scope), MaxScopeLen)
	}
	return s.checkID(op, scope, key)
}

// micros rounds d up to whole microseconds, PostgreSQL's time resolution, so
// that a positive duration never becomes zero.
func micros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// Begin implements store.Store. Concurrent Begins share statements (see
// batcher); each gets its own answer.
func (s *Store) Begin(ctx context.Context, req store.BeginRequest) (store.BeginResult, error) {
	if err := req.Validate(); err != nil {
		return store.BeginResult{}, fmt.Errorf("postgres: begin: %w", err)
	}
	if err := s.checkNewID("begin", req.Scope, req.Key); err != nil {
		return store.BeginResult{}, err
	}
	if err := checkText("begin", "fingerprint", req.Fingerprint); err != nil {
		return store.BeginResult{}, err
	}
	return do(s, s.begins, ctx, "begin", req)
}

type scopeKey struct{ scope, key string }

func compareSK(a, b scopeKey) int {
	if c := cmp.Compare(a.scope, b.scope); c != 0 {
		return c
	}
	return cmp.Compare(a.key, b.key)
}

// nextRound picks from pending calls the next statement's share: the first
// pending call of each (scope, key), sorted by (scope, key). The rest wait
// for a later statement, in their order of arrival: one statement cannot
// upsert a row twice, and a later request of the same key must see the
// earlier one's effect, exactly as if they had arrived one after another.
func nextRound[Req, Res any](pending []*call[Req, Res], id func(Req) scopeKey, seen map[scopeKey]struct{}, round []*call[Req, Res]) []*call[Req, Res] {
	clear(seen)
	round = round[:0]
	for _, c := range pending {
		k := id(c.req)
		if _, dup := seen[k]; dup {
			continue
		}
		seen[k] = struct{}{}
		round = append(round, c)
	}
	slices.SortFunc(round, func(a, b *call[Req, Res]) int { return compareSK(id(a.req), id(b.req)) })
	return round
}

func beginID(r store.BeginRequest) scopeKey { return scopeKey{r.Scope, r.Key} }

// runBegins answers a batch of Begins, in as few statements as the rules
// allow: usually one.
func (s *Store) runBegins(ctx context.Context, calls []*call[store.BeginRequest, store.BeginResult]) {
	pending := calls
	seen := make(map[scopeKey]struct{}, len(calls))
	var round []*call[store.BeginRequest, store.BeginResult]
	failures := 0
	for len(pending) > 0 {
		round = nextRound(pending, beginID, seen, round)
		s.telemetry.batch(ctx, opBegin, len(round))
		if err := s.beginStatement(ctx, round); err != nil {
			if retryable(err) && failures < maxStatementRetries && ctx.Err() == nil {
				failures++
				continue // rolled back as a whole: run the round again
			}
			for _, c := range pending {
				c.finish(store.BeginResult{}, wrap("begin", err))
			}
			return
		}
		// Keep what is left, in order: unanswered calls of this round
		// (bounded retries) and later calls of a key already in it.
		rest := pending[:0]
		for _, c := range pending {
			select {
			case <-c.done:
				continue
			default:
			}
			if c.retries > s.beginRetries {
				c.finish(store.BeginResult{}, fmt.Errorf("postgres: begin %q/%q: the record kept changing under %d statements in a row; try again", c.req.Scope, c.req.Key, c.retries))
				continue
			}
			rest = append(rest, c)
		}
		pending = rest
	}
}

// beginStatement runs sqlBegin for one round of distinct keys and finishes
// every call it has an answer for, once the statement has committed. A call
// without an answer gets its retries counted and stays pending.
func (s *Store) beginStatement(ctx context.Context, round []*call[store.BeginRequest, store.BeginResult]) error {
	n := len(round)
	scopes := make([]string, n)
	keys := make([]string, n)
	fps := make([]string, n)
	leases := make([]int64, n)
	for i, c := range round {
		scopes[i], keys[i], fps[i], leases[i] = c.req.Scope, c.req.Key, c.req.Fingerprint, micros(c.req.Lease)
	}
	rows, err := s.pool.Query(ctx, s.sql.begin, scopes, keys, fps, leases)
	if err != nil {
		return err
	}
	answers := make([]store.BeginResult, n)
	var (
		ord                     int64
		decision, status        int16
		fingerprint, kind, msg  string
		token                   int64
		attempt                 int32
		takenOver               bool
		leaseExpires            *time.Time
		result                  []byte
		created, updated, expir time.Time
	)
	for rows.Next() {
		result = nil
		if err := rows.Scan(&ord, &decision, &fingerprint, &status, &token, &attempt, &takenOver,
			&leaseExpires, &result, &kind, &msg, &created, &updated, &expir); err != nil {
			rows.Close()
			return err
		}
		i := int(ord) - 1
		if i < 0 || i >= n || answers[i].Decision != 0 {
			rows.Close()
			return fmt.Errorf("begin statement returned ordinal %d for %d requests", ord, n)
		}
		if decision == 0 {
			continue // the snapshot saw an older version: run again
		}
		req := round[i].req
		if store.Decision(decision) == store.Execute {
			answers[i] = store.BeginResult{
				Decision: store.Execute,
				Takeover: takenOver,
				Lease: store.Lease{
					Scope:     req.Scope,
					Key:       req.Key,
					Token:     token,
					Attempt:   int(attempt),
					ExpiresAt: *leaseExpires,
				},
			}
			continue
		}
		rec := &store.Record{
			Scope:        req.Scope,
			Key:          req.Key,
			Fingerprint:  fingerprint,
			Status:       store.Status(status),
			Token:        token,
			Attempt:      int(attempt),
			Result:       result,
			ErrorKind:    kind,
			ErrorMessage: msg,
			CreatedAt:    created,
			UpdatedAt:    updated,
			ExpiresAt:    expir,
		}
		if rec.Status == store.StatusInProgress && leaseExpires != nil {
			rec.LeaseExpiresAt = *leaseExpires
		}
		answers[i] = store.BeginResult{Decision: store.Decision(decision), Record: rec}
	}
	// Close reads up to the end of the statement's implicit transaction:
	// only a statement that committed may hand out its answers.
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for i, c := range round {
		if answers[i].Decision == 0 {
			c.retries++
			s.reruns.Add(1)
			continue
		}
		c.finish(answers[i], nil)
	}
	return nil
}

// Complete implements store.Store. Concurrent Completes share statements.
func (s *Store) Complete(ctx context.Context, lease store.Lease, out store.Outcome) error {
	out, err := s.checkComplete("complete", lease, out)
	if err != nil {
		return err
	}
	_, err = do(s, s.completes, ctx, "complete", completeReq{lease: lease, out: out})
	return err
}

// checkComplete validates a Complete and returns the outcome as stored: the
// result copied, the error text made storable.
func (s *Store) checkComplete(op string, lease store.Lease, out store.Outcome) (store.Outcome, error) {
	if err := out.Validate(); err != nil {
		return out, fmt.Errorf("postgres: %s: %w", op, err)
	}
	if err := s.checkID(op, lease.Scope, lease.Key); err != nil {
		return out, err
	}
	if len(out.Result) > s.opts.MaxResultBytes {
		return out, invalid(op, "result is %d bytes, more than MaxResultBytes %d; raise Options.MaxResultBytes or lower policy.MaxResultBytes", len(out.Result), s.opts.MaxResultBytes)
	}
	out.Result = bytes.Clone(out.Result)
	out.ErrorKind = storableText(out.ErrorKind, 256)
	out.ErrorMessage = storableText(out.ErrorMessage, MaxErrorMessageLen)
	return out, nil
}

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

func completeID(r completeReq) scopeKey { return scopeKey{r.lease.Scope, r.lease.Key} }

func (s *Store) runCompletes(ctx context.Context, calls []*call[completeReq, struct{}]) {
	pending := calls
	seen := make(map[scopeKey]struct{}, len(calls))
	var round []*call[completeReq, struct{}]
	failures := 0
	for len(pending) > 0 {
		round = nextRound(pending, completeID, seen, round)
		s.telemetry.batch(ctx, opComplete, len(round))
		applied, err := s.completeStatement(ctx, s.pool, round)
		if err != nil {
			if retryable(err) && failures < maxStatementRetries && ctx.Err() == nil {
				failures++
				continue
			}
			for _, c := range pending {
				c.finish(struct{}{}, wrap("complete", err))
			}
			return
		}
		for i, c := range round {
			if applied[i] {
				c.finish(struct{}{}, nil)
			} else {
				c.finish(struct{}{}, leaseLost("complete", c.req.lease))
			}
		}
		rest := pending[:0]
		for _, c := range pending {
			select {
			case <-c.done:
			default:
				rest = append(rest, c)
			}
		}
		pending = rest
	}
}

func leaseLost(op string, l store.Lease) error {
	return fmt.Errorf("postgres: %s %q/%q with token %d: %w", op, l.Scope, l.Key, l.Token, store.ErrLeaseLost)
}

// querier is what runs a statement: the pool, or the handler's transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// completeStatement runs sqlComplete for distinct keys and reports which
// requests it applied.
func (s *Store) completeStatement(ctx context.Context, q querier, round []*call[completeReq, struct{}]) ([]bool, error) {
	n := len(round)
	var (
		scopes   = make([]string, n)
		keys     = make([]string, n)
		tokens   = make([]int64, n)
		statuses = make([]int16, n)
		results  = make([][]byte, n)
		kinds    = make([]string, n)
		msgs     = make([]string, n)
		ttls     = make([]int64, n)
	)
	for i, c := range round {
		l, o := c.req.lease, c.req.out
		scopes[i], keys[i], tokens[i] = l.Scope, l.Key, l.Token
		statuses[i], results[i], kinds[i], msgs[i], ttls[i] = int16(o.Status), o.Result, o.ErrorKind, o.ErrorMessage, micros(o.TTL)
	}
	rows, err := q.Query(ctx, s.sql.complete, scopes, keys, tokens, statuses, results, kinds, msgs, ttls)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	applied := make([]bool, n)
	var ord int64
	for rows.Next() {
		if err := rows.Scan(&ord); err != nil {
			return nil, err
		}
		if ord < 1 || int(ord) > n {
			return nil, fmt.Errorf("complete statement returned ordinal %d for %d requests", ord, n)
		}
		applied[ord-1] = true
	}
	rows.Close() // up to the end of the statement's transaction
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return applied, nil
}

// Release implements store.Store. With keep <= 0 the record is removed.
func (s *Store) Release(ctx context.Context, lease store.Lease, keep time.Duration) error {
	if err := s.checkID("release", lease.Scope, lease.Key); err != nil {
		return err
	}
	if err := s.checkOpen("release"); err != nil {
		return err
	}
	var (
		tag pgconn.CommandTag
		err error
	)
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
func (s *Store) Extend(ctx context.Context, lease store.Lease, d time.Duration) (store.Lease, error) {
	if d <= 0 {
		return store.Lease{}, invalid("extend", "duration %v must be positive", d)
	}
	if err := s.checkID("extend", lease.Scope, lease.Key); err != nil {
		return store.Lease{}, err
	}
	if err := s.checkOpen("extend"); err != nil {
		return store.Lease{}, err
	}
	var attempt int32
	var expires time.Time
	err := s.pool.QueryRow(ctx, s.sql.extend, lease.Scope, lease.Key, lease.Token, micros(d)).Scan(&attempt, &expires)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Lease{}, fmt.Errorf("postgres: extend %q/%q with token %d: the lease was taken over, finished, or expired: %w",
			lease.Scope, lease.Key, lease.Token, store.ErrLeaseLost)
	}
	if err != nil {
		return store.Lease{}, wrap("extend", err)
	}
	lease.Attempt = int(attempt)
	lease.ExpiresAt = expires
	return lease, nil
}

// Get implements store.Store. An in-progress record whose lease has expired
// is not returned, like any other expired record.
func (s *Store) Get(ctx context.Context, scope, key string) (store.Record, error) {
	if err := s.checkID("get", scope, key); err != nil {
		return store.Record{}, err
	}
	if err := s.checkOpen("get"); err != nil {
		return store.Record{}, err
	}
	rec := store.Record{Scope: scope, Key: key}
	var (
		status       int16
		attempt      int32
		leaseExpires *time.Time
	)
	err := s.pool.QueryRow(ctx, s.sql.get, scope, key).Scan(&rec.Fingerprint, &status, &rec.Token, &attempt, &leaseExpires,
		&rec.Result, &rec.ErrorKind, &rec.ErrorMessage, &rec.CreatedAt, &rec.UpdatedAt, &rec.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Record{}, fmt.Errorf("postgres: get %q/%q: %w", scope, key, store.ErrNotFound)
	}
	if err != nil {
		return store.Record{}, wrap("get", err)
	}
	rec.Status, rec.Attempt = store.Status(status), int(attempt)
	if rec.Status == store.StatusInProgress && leaseExpires != nil {
		rec.LeaseExpiresAt = *leaseExpires
	}
	return rec, nil
}

// Delete implements store.Store.
func (s *Store) Delete(ctx context.Context, scope, key string) error {
	if err := s.checkID("delete", scope, key); err != nil {
		return err
	}
	if err := s.checkOpen("delete"); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, s.sql.del, scope, key); err != nil {
		return wrap("delete", err)
	}
	return nil
}
