package pgpair_test

import (
	"context"
	"testing"
	"time"

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
