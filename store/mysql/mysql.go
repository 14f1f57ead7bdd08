package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	driver "github.com/go-sql-driver/mysql"

	"github.com/oncemill/oncemill/internal/configerr"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/cleanupmetrics"
	"github.com/oncemill/oncemill/store/internal/gate"
)

// Store is a store.Store on a MySQL or MariaDB table, shared by every
// worker that points at it, and a store.Transactional: it can write the
// record inside the handler's own transaction. It is safe for concurrent
// use. Create it with New, create its table with Migrate, and stop it with
// Close.
type Store struct {
	db    *sql.DB
	opts  Options
	names names
	sql   statements
	gate  gate.Gate

	closeOnce   sync.Once
	stopCleaner context.CancelFunc
	cleanerDone chan struct{}
	cleanupMu   sync.Mutex // one pass at a time within this process
	metrics     *cleanupmetrics.Metrics
}

var (
	_ store.Store         = (*Store)(nil)
	_ store.Admin         = (*Store)(nil)
	_ store.Transactional = (*Store)(nil)
)

// New returns a store over db (a database/sql pool of
// github.com/go-sql-driver/mysql) configured by opts. It does no I/O: call
// Migrate once (from any number of workers) before the first claim. The
// pool stays the caller's: Close does not close it.
//
// Size the pool for the handlers in flight: in the one-transaction mode
// each holds one connection for its transaction; in the lease mode each
// takes one for a statement or a short transaction at a time. Add one for
// the cleaner.
func New(db *sql.DB, opts Options) (*Store, error) {
	if db == nil {
		return nil, configerr.New("db", "nil; pass a *sql.DB from sql.Open(\"mysql\", dsn)")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	n := newNames(opts.Table)
	s := &Store{db: db, opts: opts, names: n, sql: newStatements(n, leaseWait(opts.StatementTimeout)), gate: gate.Gate{Store: "mysql", Timeout: opts.StatementTimeout}}
	if s.metrics, err = cleanupmetrics.Register(opts.MeterProvider, "github.com/oncemill/oncemill/store/mysql", opts.Table, s.cleanupLag, s.gate.Closed, opts.Logger); err != nil {
		return nil, fmt.Errorf("oncemill: mysql: %w", err)
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

// Close stops the background cleaner and waits for it, refuses new
// operations, and waits for those under way (each is bounded by
// Options.StatementTimeout). Afterwards every operation returns store.ErrClosed; a one-transaction
// claim taken before Close can still commit or roll back. Close is
// idempotent and does not close the pool.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		// The cleaner first: its pass would fail on the closed gate.
		if s.stopCleaner != nil {
			s.stopCleaner()
			<-s.cleanerDone
		}
		s.gate.Close()
		s.metrics.Close()
	})
	return nil
}

// Server errors the store tells apart.
const (
	errDupKey          = 1062
	errLockWaitTimeout = 1205
	errDeadlock        = 1213
)

// errNumber is the server's error number of err, or 0.
func errNumber(err error) uint16 {
	var me *driver.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// wrap gives err the store's context. Every error it makes is retryable
// (it wraps no store sentinel): a lock wait that timed out (1205) or a
// deadlock (1213) says the row was busy, not that the request is wrong.
func wrap(op string, err error) error {
	switch errNumber(err) {
	case errLockWaitTimeout:
		return fmt.Errorf("oncemill: mysql: %s: another transaction held the row past innodb_lock_wait_timeout; try again: %w", op, err)
	case errDeadlock:
		return fmt.Errorf("oncemill: mysql: %s: chosen as a deadlock victim; try again: %w", op, err)
	}
	return fmt.Errorf("oncemill: mysql: %s: %w", op, err)
}

func invalid(op, format string, args ...any) error {
	return fmt.Errorf("oncemill: mysql: %s: %w: %s", op, store.ErrInvalidRequest, fmt.Sprintf(format, args...))
}

func leaseLost(op string, l store.Claim) error {
	return fmt.Errorf("oncemill: mysql: %s %q/%q with token %d: %w", op, l.Scope, l.Key, l.Token, store.ErrLeaseLost)
}

// Widths of the columns that hold text deciding nothing (cut to fit) and
// of the fingerprint (refused when longer).
const (
	maxFingerprintLen  = 255
	maxErrorKindLen    = 256
	maxErrorMessageLen = 16 << 10
	maxMessageUUIDLen  = 1024
)

// checkID validates the scope and key of any operation. The length limits
// apply where records are created (checkNewID): a record stored under
// other options can still be read, finished and deleted.
func checkID(op, scope, key string) error {
	if key == "" {
		return invalid(op, "empty key")
	}
	if len(scope) > store.MaxScopeLen || len(key) > maxKeyLenLimit {
		return invalid(op, "scope or key longer than the table holds")
	}
	return nil
}

// checkNewID validates the scope, key and fingerprint of a claim.
func (s *Store) checkNewID(op, scope, key, fingerprint string) error {
	if len(key) > s.opts.MaxKeyLen {
		return invalid(op, "key is %d bytes, longer than MaxKeyLen %d; hash long keys with keygen.StorableKey", len(key), s.opts.MaxKeyLen)
	}
	if len(scope) > store.MaxScopeLen {
		return invalid(op, "scope is %d bytes, longer than store.MaxScopeLen %d", len(scope), store.MaxScopeLen)
	}
	if len(fingerprint) > maxFingerprintLen {
		return invalid(op, "fingerprint is %d bytes, longer than %d", len(fingerprint), maxFingerprintLen)
	}
	return checkID(op, scope, key)
}

// storable cuts a text that decides nothing (an error text, a message
// UUID) at a UTF-8 boundary after max bytes: refusing it would leave the
// outcome unrecorded.
func storable(v string, max int) string {
	if len(v) <= max {
		return v
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return strings.Clone(v[:cut])
}

// us is d in whole microseconds, rounded up so that a positive duration
// never becomes zero.
func us(d time.Duration) int64 { return int64((d + time.Microsecond - 1) / time.Microsecond) }

// leaseWait is how long the lease mode's statements wait for a row lock:
// half the statement timeout in whole seconds, at least 1, so that a busy
// row is told apart from a stalled server where the timeout allows.
func leaseWait(timeout time.Duration) int64 { return max(int64(timeout/time.Second)/2, 1) }

// waitSecs is a claim's wait as innodb_lock_wait_timeout takes it: whole
// seconds, to the nearest. Below half a second it is 0, which MariaDB
// takes as no wait at all (a policy that does not wait asks 1 ms).
func waitSecs(d time.Duration) int64 { return int64((d + time.Second/2) / time.Second) }
