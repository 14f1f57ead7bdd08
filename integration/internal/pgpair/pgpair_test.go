package pgpair_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/integration/internal/pgpair"
)

// A pool on the pair's multi-host connection string writes to the primary,
// fails while there is none, and writes to the promoted standby, without
// being reopened; a write committed before the kill of a synchronous pair
// is on the new primary.
func TestFailover(t *testing.T) {
	for _, sync := range []bool{true, false} {
		t.Run(map[bool]string{true: "sync", false: "async"}[sync], func(t *testing.T) {
			p := pgpair.Start(t, pgpair.Options{Sync: sync, Latency: 5 * time.Millisecond})
			ctx := context.Background()
			pool, err := pgxpool.New(ctx, p.DSN())
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			if _, err := pool.Exec(ctx, "CREATE TABLE t (v int)"); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, "INSERT INTO t VALUES (1)"); err != nil {
				t.Fatal(err)
			}
			// An asynchronous standby may not have the table yet, and
			// would then rightly lack it after the promotion: the test is of
			// the pool finding the new primary, so it waits for the table.
			if !sync {
				waitForTable(t, p.StandbyDSN(pgpair.Database))
			}
			lag := p.KillPrimary()
			t.Logf("%+v", lag)
			if _, err := pool.Exec(ctx, "INSERT INTO t VALUES (2)"); err == nil {
				t.Fatal("a write succeeded with the primary down and the standby in recovery")
			}
			p.Promote()
			var n int
			deadline := time.Now().Add(10 * time.Second)
			for {
				_, err = pool.Exec(ctx, "INSERT INTO t VALUES (3)")
				if err == nil || time.Now().After(deadline) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if err != nil {
				t.Fatalf("writing to the promoted standby through the pool: %v", err)
			}
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM t WHERE v IN (1, 3)").Scan(&n); err != nil || n != 2 && sync {
				t.Errorf("count %d (%v), want 2: the rows before and after the failover", n, err)
			}
		})
	}
}

// waitForTable waits, up to 10 s, until the server at dsn has table t.
func waitForTable(t *testing.T, dsn string) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var there bool
		if err := conn.QueryRow(ctx, "SELECT to_regclass('t') IS NOT NULL").Scan(&there); err != nil {
			t.Fatal(err)
		}
		if there {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the standby has not replayed CREATE TABLE t after 10 s")
		}
	}
}
