package postgres_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/store/postgres"
)

// defaultDSN is the development and CI database.
const defaultDSN = "postgres://postgres@127.0.0.1:5432/test"

// dsn is ONCEMILL_POSTGRES_DSN or the default.
func dsn() string {
	if v := os.Getenv("ONCEMILL_POSTGRES_DSN"); v != "" {
		return v
	}
	return defaultDSN
}

// startHint is what to run when the database is down. These tests never
// skip: an unreachable database fails the run.
const startHint = "start it with: pg_ctlcluster --skip-systemctl-redirect 15 main start (or set ONCEMILL_POSTGRES_DSN)"

// newPool connects to the test database, failing the test if it cannot.
func newPool(tb testing.TB, configure func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(dsn())
	if err != nil {
		tb.Fatalf("parsing ONCEMILL_POSTGRES_DSN %q: %v", dsn(), err)
	}
	if configure != nil {
		configure(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		tb.Fatalf("PostgreSQL at %q is unreachable: %v; %s", dsn(), err, startHint)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// newSchema returns the name of a schema for this test alone, dropped when
// the test ends, so parallel packages and runs never meet. Migrate creates it.
func newSchema(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	name := "oncemill_test_" + strings.ToLower(rand.Text()[:12])
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			tb.Errorf("dropping test schema %s: %v", name, err)
		}
	})
	return name
}

// newStore builds a migrated store in a fresh schema with the background
// cleaner off, unless opts says otherwise.
func newStore(tb testing.TB, pool *pgxpool.Pool, opts postgres.Options) *postgres.Store {
	tb.Helper()
	if opts.Schema == "" {
		opts.Schema = newSchema(tb, pool)
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
	if err := s.Migrate(ctx); err != nil {
		tb.Fatalf("Migrate: %v", err)
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
		updated_at = updated_at - $1 * interval '1 microsecond'`, qualified), d.Microseconds())
	if err != nil {
		tb.Fatalf("advancing the clock by %v: %v", d, err)
	}
}

// waitFor polls cond until it holds, failing the test after 30 s.
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitForLockWait waits until a statement naming schema waits for a lock.
func waitForLockWait(tb testing.TB, pool *pgxpool.Pool, schema string) {
	tb.Helper()
	waitFor(tb, "a statement to wait for a row lock", func() bool {
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
