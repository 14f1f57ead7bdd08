package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/cleanupmetrics"
	"github.com/oncemill/oncemill/store/internal/gate"
	"github.com/oncemill/oncemill/store/postgres/internal/claimtx"
	"github.com/oncemill/oncemill/store/postgres/internal/pgerr"
)

// Store is a store.Store on a PostgreSQL table, shared by every worker that
// points at it, and a store.Transactional: it can write the record inside
// the handler's own transaction. It is safe for concurrent use. Create it
// with New, create its table with Migrate, and stop it with Close.
type Store struct {
	pool   *pgxpool.Pool
	opts   Options
	names  names
	sql    statements
	layout layout
	gate   gate.Gate
	// txc is what every one-transaction claim shares.
	txc claimtx.Config

	closeOnce    sync.Once
	cleanupKey   int64
	stopCleaner  context.CancelFunc
	cleanerDone  chan struct{}
	metrics      *cleanupmetrics.Metrics
	cleanupMu    sync.Mutex // one pass at a time within this process
	claimRetries int        // bound on statement runs per claim (READ COMMITTED corner)

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
		s.gate.Close()
		if s.stopCleaner != nil {
			s.stopCleaner()
			<-s.cleanerDone
		}
		s.metrics.Close()
	})
	return nil
}

// wrap is pgerr.Wrap, and a hint for a table of the other layout: a
// partitioned table has no unique index for ON CONFLICT to use.
func wrap(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P10" { // no unique index for ON CONFLICT
		return fmt.Errorf("oncemill: postgres: %s: %w (the table has the partitioned layout: %s)", op, err, setPartitioned)
	}
	return pgerr.Wrap(op, err)
}

// checkID validates the scope and key of any operation: what a text column
// cannot hold is refused before it reaches a statement. The length limits
// apply where records are created (checkNewID): a record stored under
// other options can still be read, finished and deleted.
func (s *Store) checkID(op, scope, key string) error {
	if key == "" {
		return pgerr.Invalid(op, "empty key")
	}
	if err := pgerr.CheckText(op, "scope", scope); err != nil {
		return err
	}
	return pgerr.CheckText(op, "key", key)
}

// checkNewID validates the scope, key and fingerprint of a claim.
func (s *Store) checkNewID(op, scope, key, fingerprint string) error {
	if err := pgerr.CheckText(op, "fingerprint", fingerprint); err != nil {
		return err
	}
	if len(key) > s.opts.MaxKeyLen {
		return pgerr.Invalid(op, "key is %d bytes, longer than MaxKeyLen %d; hash long keys with keygen.StorableKey", len(key), s.opts.MaxKeyLen)
	}
	if len(scope) > store.MaxScopeLen {
		return pgerr.Invalid(op, "scope is %d bytes, longer than store.MaxScopeLen %d", len(scope), store.MaxScopeLen)
	}
	return s.checkID(op, scope, key)
}

// micros rounds d up to whole microseconds, PostgreSQL's time resolution, so
// that a positive duration never becomes zero.
func micros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}
