package mysql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store/mysql"
)

// testDB is a pool on a database of the test's own, dropped after it.
func testDB(tb testing.TB) *sql.DB {
	tb.Helper()
	return testenv.MariaDB(tb, testenv.MariaDBDatabase(tb))
}

// newStore builds a migrated store with the background cleaner off, unless
// opts says otherwise.
func newStore(tb testing.TB, db *sql.DB, opts mysql.Options) *mysql.Store {
	tb.Helper()
	if opts.CleanupInterval == 0 {
		opts.CleanupInterval = -1
	}
	s, err := mysql.New(db, opts)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Migrate(ctx); err != nil {
		tb.Fatalf("Migrate: %v", err)
	}
	return s
}

// advance moves every stored time of table d earlier, which the store
// cannot tell apart from d passing on the server clock.
func advance(tb testing.TB, db *sql.DB, table string, d time.Duration) {
	tb.Helper()
	if table == "" {
		table = mysql.DefaultTable
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := d.Microseconds()
	_, err := db.ExecContext(ctx, "UPDATE `"+table+"` SET "+
		"expires_at = expires_at - INTERVAL ? MICROSECOND, purge_at = purge_at - INTERVAL ? MICROSECOND, "+
		"created_at = created_at - INTERVAL ? MICROSECOND, updated_at = updated_at - INTERVAL ? MICROSECOND, "+
		"retry_at = retry_at - INTERVAL ? MICROSECOND", n, n, n, n, n)
	if err != nil {
		tb.Fatalf("advancing the clock by %v: %v", d, err)
	}
}
