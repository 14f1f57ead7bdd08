package integration

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/store/postgres"
)

// storeKind is one idempotency store and the ledger beside it, where the
// worker books its effects.
type storeKind struct {
	name string
	// workerArgs select the store in the example worker, in namespace ns
	// (a PostgreSQL schema, a Redis key prefix).
	workerArgs func(ns string) []string
	// ledger returns the charges per payment_id booked in ns under scope.
	ledger func(t *testing.T, ns, scope string) map[string]int
	// cleanup removes ns.
	cleanup func(t *testing.T, ns string)
	// layout is the PostgreSQL table's layout where a test builds the store
	// itself (TestStoreFaultsPartitioned).
	layout postgres.Layout
	// lease runs the PostgreSQL store in the lease mode, not the
	// one-transaction mode, where a test builds the receiver itself
	// (TestStoreFaultsPartitioned).
	lease bool
	// deferred sends the one-transaction mode's claim with the handler's
	// first statement (WithDeferredClaim), where a test builds the
	// receiver itself (TestStoreFaultsDeferred).
	deferred bool
}

var storeKinds = []storeKind{
	{
		name: "postgres",
		workerArgs: func(ns string) []string {
			// With --store=postgres the worker runs oncemill in the
			// one-transaction mode: the ledger row and the record commit in
			// one transaction.
			return []string{"--store=postgres", "--postgres-dsn=" + env.postgresDSN, "--postgres-schema=" + ns}
		},
		ledger: func(t *testing.T, ns, scope string) map[string]int {
			return ledgerCounts(t, pgPool(t), ns, scope)
		},
		cleanup: func(t *testing.T, ns string) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := pgPool(t).Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{ns}.Sanitize()+" CASCADE"); err != nil {
				t.Logf("dropping schema %s: %v", ns, err)
			}
		},
	},
	{
		name: "redis",
		workerArgs: func(ns string) []string {
			return []string{"--store=redis", "--redis-addr=" + env.redisAddr, "--redis-prefix=" + ns}
		},
		ledger: func(t *testing.T, ns, scope string) map[string]int {
			// The worker's ledger: one hash per scope, payment_id -> charges.
			m, err := redisClient(t).HGetAll(context.Background(), fmt.Sprintf("%s:ledger:{%s}", ns, scope)).Result()
			if err != nil {
				t.Fatalf("reading the ledger hash: %v", err)
			}
			out := map[string]int{}
			for id, v := range m {
				n, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("ledger %s=%q: %v", id, v, err)
				}
				out[id] = n
			}
			return out
		},
		cleanup: func(t *testing.T, ns string) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			rdb := redisClient(t)
			iter := rdb.Scan(ctx, 0, ns+":*", 1000).Iterator()
			for iter.Next(ctx) {
				rdb.Del(ctx, iter.Val())
			}
		},
	},
}

// One pool and one client for all tests, opened on first use.
var (
	pgOnce    = sync.OnceValues(func() (*pgxpool.Pool, error) { return pgxpool.New(context.Background(), env.postgresDSN) })
	redisOnce = sync.OnceValues(func() (*redis.Client, error) {
		return redis.NewClient(&redis.Options{Addr: env.redisAddr}), nil
	})
)

func pgPool(t *testing.T) *pgxpool.Pool {
	p, err := pgOnce()
	must(t, err)
	return p
}

func redisClient(t *testing.T) *redis.Client {
	c, err := redisOnce()
	must(t, err)
	return c
}
