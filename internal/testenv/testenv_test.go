package testenv_test

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/oncemill/oncemill/internal/testenv"
)

func TestAddressesDefaultWhenUnset(t *testing.T) {
	t.Setenv("ONCEMILL_POSTGRES_DSN", "")
	t.Setenv("ONCEMILL_REDIS_ADDR", "")
	if got := testenv.PostgresDSN(); got != "postgres://postgres@127.0.0.1:5432/test" {
		t.Errorf("PostgresDSN() = %q", got)
	}
	if got := testenv.RedisAddr(); got != "127.0.0.1:6379" {
		t.Errorf("RedisAddr() = %q", got)
	}
	t.Setenv("ONCEMILL_POSTGRES_DSN", "postgres://u:secret@db:5433/x")
	t.Setenv("ONCEMILL_REDIS_ADDR", "cache:6380")
	if got := testenv.PostgresDSN(); got != "postgres://u:secret@db:5433/x" {
		t.Errorf("PostgresDSN() = %q", got)
	}
	if got := testenv.RedisAddr(); got != "cache:6380" {
		t.Errorf("RedisAddr() = %q", got)
	}
	if got := testenv.Redact(testenv.PostgresDSN()); got != "postgres://u:xxxxx@db:5433/x" {
		t.Errorf("Redact = %q: the password must not show", got)
	}
}

func TestWaitFor(t *testing.T) {
	t.Parallel()
	n := 0
	testenv.WaitFor(t, 10*time.Second, "the third poll", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("cond called %d times, want 3", n)
	}
}

func TestPoolAndSchema(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	var exists bool
	if err := pool.QueryRow(t.Context(), "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists); err != nil || exists {
		t.Fatalf("schema %s exists before anyone creates it: %v, %v", schema, exists, err)
	}
	if _, err := pool.Exec(t.Context(), "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
}

func TestLogsKeepEveryLine(t *testing.T) {
	logs, logger := testenv.NewLogs()
	boom := errors.New("boom")
	logger.Info("hello", "key", "k1")
	logger.Error("failed", "error", boom)
	if all := logs.All(); len(all) != 2 {
		t.Fatalf("%d lines, want 2", len(all))
	}
	errs := logs.At(slog.LevelError)
	if len(errs) != 1 || errs[0].Msg != "failed" || !errors.Is(errs[0].Err(), boom) {
		t.Fatalf("error lines %+v, want one carrying boom", errs)
	}
	if infos := logs.At(slog.LevelInfo); len(infos) != 1 || infos[0].Attrs["key"] != "k1" || infos[0].Err() != nil {
		t.Fatalf("info lines %+v", infos)
	}
}
