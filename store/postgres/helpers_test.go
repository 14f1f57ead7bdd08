package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store/postgres"
)

// newStore builds a migrated store in a fresh schema with the background
// cleaner off, unless opts says otherwise.
func newStore(tb testing.TB, pool *pgxpool.Pool, opts postgres.Options) *postgres.Store {
	tb.Helper()
	return newStoreAt(tb, pool, opts, postgres.SchemaVersion)
}

// newStoreAt is newStore with the migrations up to version applied, and no
// further: a table as an older build left it.
func newStoreAt(tb testing.TB, pool *pgxpool.Pool, opts postgres.Options, version int) *postgres.Store {
	tb.Helper()
	if opts.Schema == "" {
		opts.Schema = testenv.Schema(tb, pool)
	}
	if opts.CleanupInterval == 0 {
		opts.CleanupInterval = -1
	}
	s, err := postgres.New(pool, opts)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.MigrateTo(ctx, version); err != nil {
		tb.Fatalf("Migrate to version %d: %v", version, err)
	}
	return s
}

// table is the quoted table of opts.
func table(schema, tbl string) string {
	if tbl == "" {
		tbl = postgres.DefaultTable
	}
	return pgx.Identifier{schema, tbl}.Sanitize()
}

// advance moves every stored time of the table d earlier, which the store
// cannot tell apart from d passing on the database clock.
func advance(tb testing.TB, pool *pgxpool.Pool, qualified string, d time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET
		purge_at = purge_at - $1 * interval '1 microsecond',
		expires_at = expires_at - $1 * interval '1 microsecond',
		created_at = created_at - $1 * interval '1 microsecond',
		updated_at = updated_at - $1 * interval '1 microsecond',
		retry_at = retry_at - $1 * interval '1 microsecond'`, qualified), d.Microseconds())
	if err != nil {
		tb.Fatalf("advancing the clock by %v: %v", d, err)
	}
}

// waitForLockWait waits until a statement naming schema waits for a lock.
func waitForLockWait(tb testing.TB, pool *pgxpool.Pool, schema string) {
	tb.Helper()
	testenv.WaitFor(tb, 30*time.Second, "a statement to wait for a row lock", func() bool {
		var n int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, schema).Scan(&n)
		return err == nil && n > 0
	})
}
func lockRow(t *testing.T, pool *pgxpool.Pool, schema, scope, key string) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) }) //nolint:errcheck
	if _, err := tx.Exec(t.Context(), "SELECT 1 FROM "+table(schema, "")+" WHERE scope = $1 AND key = $2 FOR UPDATE", scope, key); err != nil {
		t.Fatal(err)
	}
	return tx
}
