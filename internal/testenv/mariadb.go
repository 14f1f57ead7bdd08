package testenv

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// DefaultMariaDBDSN is the development and CI MariaDB (a go-sql-driver
// DSN), which ONCEMILL_MARIADB_DSN overrides.
const DefaultMariaDBDSN = "root@tcp(127.0.0.1:3306)/test"

// StartMariaDB is what to run when MariaDB is down.
const StartMariaDB = "start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd (or set ONCEMILL_MARIADB_DSN)"

// MariaDBDSN is ONCEMILL_MARIADB_DSN, or DefaultMariaDBDSN when it is unset
// or empty.
func MariaDBDSN() string { return cmp.Or(os.Getenv("ONCEMILL_MARIADB_DSN"), DefaultMariaDBDSN) }

// MariaDBDatabase creates a database for this test alone
// (oncemill_test_<random>), so that parallel tests, packages and runs never
// meet, drops it with everything in it when the test ends, and returns the
// DSN of MariaDBDSN pointing at it. An unreachable server fails the test,
// saying how to start it: it is never skipped.
func MariaDBDatabase(tb testing.TB) string {
	tb.Helper()
	cfg, err := mysql.ParseDSN(MariaDBDSN())
	if err != nil {
		tb.Fatalf("parsing ONCEMILL_MARIADB_DSN: %v", err)
	}
	admin := MariaDB(tb, cfg.FormatDSN())
	name := "oncemill_test_" + strings.ToLower(rand.Text()[:12])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		tb.Fatalf("creating test database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			tb.Errorf("dropping test database %s: %v", name, err)
		}
	})
	cfg.DBName = name
	return cfg.FormatDSN()
}

// MariaDB opens a pool on dsn, checks that the server answers, and closes
// the pool when the test ends. An unreachable server fails the test,
// saying how to start it.
func MariaDB(tb testing.TB, dsn string) *sql.DB {
	tb.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		tb.Fatalf("opening MariaDB: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		tb.Fatalf("MariaDB is unreachable: %v; start it with: %s", err, StartMariaDB)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}
