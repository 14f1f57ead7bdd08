package testenv

import (
	"cmp"
	"context"
	"crypto/rand"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The development and CI services, which the ONCEMILL_* variables override.
const (
	DefaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/test"
	DefaultRedisAddr   = "127.0.0.1:6379"
)

// What to run when a service is down.
const (
	StartPostgres = "pg_ctlcluster --skip-systemctl-redirect 15 main start (or set ONCEMILL_POSTGRES_DSN)"
	StartRedis    = `redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no (or set ONCEMILL_REDIS_ADDR)`
)

// PostgresDSN is ONCEMILL_POSTGRES_DSN, or DefaultPostgresDSN when it is
// unset or empty.
func PostgresDSN() string { return cmp.Or(os.Getenv("ONCEMILL_POSTGRES_DSN"), DefaultPostgresDSN) }

// RedisAddr is ONCEMILL_REDIS_ADDR, or DefaultRedisAddr when it is unset or
// empty.
func RedisAddr() string { return cmp.Or(os.Getenv("ONCEMILL_REDIS_ADDR"), DefaultRedisAddr) }

// Redact is the URL s with its password hidden, for a failure message.
func Redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(an unparsable URL)"
	}
	return u.Redacted()
}

// Pool connects to the test PostgreSQL (PostgresDSN), applying configure to
// the pool's configuration first, and closes the pool when the test ends. An
// unreachable database fails the test, saying how to start it: it is never
// skipped.
func Pool(tb testing.TB, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	dsn := PostgresDSN()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		tb.Fatalf("parsing ONCEMILL_POSTGRES_DSN %s: %v", Redact(dsn), err)
	}
	for _, c := range configure {
		if c != nil {
			c(cfg)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		if err = pool.Ping(ctx); err != nil {
			pool.Close()
		}
	}
	if err != nil {
		tb.Fatalf("PostgreSQL at %s is unreachable: %v; start it with: %s", Redact(dsn), err, StartPostgres)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// Schema names a schema for this test alone (oncemill_test_<random>), so
// that parallel tests, packages and runs never meet, and drops it with
// everything in it when the test ends. It does not create the schema: the
// store's Migrate does, or the test.
func Schema(tb testing.TB, pool *pgxpool.Pool) string {
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

// WaitFor polls cond every millisecond until it holds, and fails the test
// ("timed out after <within> waiting for <what>") if it still does not
// after within. The limit guards against a hang; it never judges speed: a
// slow machine only waits longer, so make it generous.
func WaitFor(tb testing.TB, within time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(time.Millisecond)
	}
}
