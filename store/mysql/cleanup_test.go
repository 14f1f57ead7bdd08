package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/oncemill/oncemill/internal/teltest"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/mysql"
)

// expired writes n succeeded records in scope that expire in a minute, and
// a live one, and moves the clock past the expiry.
func expired(t *testing.T, db *sql.DB, s *mysql.Store, scope string, n int) {
	t.Helper()
	for i := range n + 1 {
		key, ttl := fmt.Sprint("k", i), time.Minute
		if i == n {
			key, ttl = "live", 24*time.Hour
		}
		res, err := s.ClaimLease(t.Context(), store.LeaseRequest{Scope: scope, Key: key, LeaseDuration: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(t.Context(), res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: ttl}); err != nil {
			t.Fatal(err)
		}
	}
	advance(t, db, "", 2*time.Minute)
}

func rows(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM oncemill_records").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A pass deletes in batches of CleanupBatch until none is left, and keeps
// the live records.
func TestCleanupPassRemovesEveryExpiredRecordInBatches(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	s := newStore(t, db, mysql.Options{CleanupBatch: 3})
	expired(t, db, s, "s", 10)
	removed, ran, err := s.CleanupPass(t.Context())
	if err != nil || !ran || removed != 10 {
		t.Fatalf("CleanupPass = %d, %v, %v; want 10 removed as the leader", removed, ran, err)
	}
	if n := rows(t, db); n != 1 {
		t.Fatalf("%d rows left, want the live one", n)
	}
	if _, err := s.Get(t.Context(), "s", "live"); err != nil {
		t.Fatalf("the live record: %v", err)
	}
}

// One cleaner runs at a time across the workers: a pass that finds the
// lock held by another session does nothing.
func TestCleanupRunsUnderOneLeader(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	s := newStore(t, db, mysql.Options{})
	expired(t, db, s, "s", 4)
	conn, err := db.Conn(t.Context()) // another worker's session
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var got int
	if err := conn.QueryRowContext(t.Context(), "SELECT GET_LOCK("+s.CleanupLock()+", 0)").Scan(&got); err != nil || got != 1 {
		t.Fatalf("taking the cleaner's lock = %d, %v", got, err)
	}
	if removed, ran, err := s.CleanupPass(t.Context()); err != nil || ran || removed != 0 {
		t.Fatalf("CleanupPass while another worker leads = %d, %v, %v; want nothing done", removed, ran, err)
	}
	if _, err := conn.ExecContext(t.Context(), "DO RELEASE_LOCK("+s.CleanupLock()+")"); err != nil {
		t.Fatal(err)
	}
	if removed, ran, err := s.CleanupPass(t.Context()); err != nil || !ran || removed != 4 {
		t.Fatalf("CleanupPass once the lock is free = %d, %v, %v; want 4 removed", removed, ran, err)
	}
}

// Cleanup never waits for a row an open transaction holds: it removes the
// others and leaves that one for a later pass.
func TestCleanupSkipsRowsATransactionHolds(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	s := newStore(t, db, mysql.Options{StatementTimeout: 10 * time.Second})
	expired(t, db, s, "s", 3)
	tx, err := db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	if _, err := tx.ExecContext(t.Context(), "SELECT 1 FROM oncemill_records WHERE scope = 's' AND `key` = 'k0' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	n, err := s.DeleteExpired(t.Context(), 100)
	if err != nil || n != 2 {
		t.Fatalf("DeleteExpired beside a held row = %d, %v; want the 2 others", n, err)
	}
	if waited := time.Since(start); waited >= time.Second {
		t.Fatalf("DeleteExpired took %v: it waited for the held row (innodb_lock_wait_timeout is whole seconds)", waited)
	}
	tx.Rollback() //nolint:errcheck
	if n, err := s.DeleteExpired(t.Context(), 100); err != nil || n != 1 {
		t.Fatalf("DeleteExpired once the row is free = %d, %v; want 1", n, err)
	}
}

// The background cleaner removes expired records by itself, and Close
// stops it: afterwards nothing runs, and operations say the store is closed.
func TestBackgroundCleanerStopsOnClose(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	s := newStore(t, db, mysql.Options{CleanupInterval: 20 * time.Millisecond})
	expired(t, db, s, "s", 5)
	testenv.WaitFor(t, 30*time.Second, "the background cleaner to remove the expired records", func() bool { return rows(t, db) == 1 })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteExpired(context.Background(), 10); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("DeleteExpired after Close = %v, want ErrClosed", err)
	}
	if _, err := s.ClaimLease(context.Background(), store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: time.Second}); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("ClaimLease after Close = %v, want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
}

// The store exports the PostgreSQL store's cleanup metrics, by the same
// names: the lag of the oldest removable record, and the records removed.
func TestCleanupLagMetric(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	k := teltest.New(t)
	s := newStore(t, db, mysql.Options{MeterProvider: k.MeterProvider})
	observe := func() (lag float64, deleted int64) {
		t.Helper()
		ms := k.Metrics(t)
		lag = -1
		for table, v := range teltest.Gauge[float64](t, ms, "oncemill.store.cleanup.lag", "oncemill.store.table") {
			if table != mysql.DefaultTable {
				t.Errorf("oncemill.store.cleanup.lag for table %q, want %q", table, mysql.DefaultTable)
			}
			lag = v
		}
		return lag, teltest.Sums(t, ms, "oncemill.store.cleanup.deleted", "oncemill.store.table")[mysql.DefaultTable]
	}

	if lag, _ := observe(); lag != 0 {
		t.Fatalf("lag with an empty table = %v, want 0", lag)
	}
	expired(t, db, s, "s", 3) // purgeable since about 119 s, by the server clock
	if lag, _ := observe(); lag < 115 || lag > 180 {
		t.Fatalf("lag after the records' purge time passed 119 s ago = %.0fs, want about 119 s", lag)
	}
	if removed, _, err := s.CleanupPass(t.Context()); err != nil || removed != 3 {
		t.Fatalf("CleanupPass = %d, %v", removed, err)
	}
	if lag, deleted := observe(); lag != 0 || deleted != 3 {
		t.Fatalf("after cleanup: lag %v, deleted %d; want 0 and 3", lag, deleted)
	}
	s.Close()
	if lag, _ := observe(); lag != -1 {
		t.Fatalf("a closed store reported a lag of %v; want no observation", lag)
	}
}
