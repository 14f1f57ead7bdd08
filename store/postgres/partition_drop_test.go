package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// Dropping a partition of the partitioned layout (dropPartition): DETACH
// … CONCURRENTLY, then DROP of the detached table, so that no claim waits.

// fillOld creates the partition name for [lower, lower+1h) holding n rows
// of scope, claimed at lower, expired and past their purge time.
func fillOld(tb testing.TB, pool *pgxpool.Pool, schema, name, scope string, lower time.Time, n int) {
	tb.Helper()
	fillPartition(tb, pool, schema, partitionedTable, name, scope, lower, n, dbNow(tb, pool).Add(-time.Minute))
}

// fillPartition creates the partition name of schema.tbl for [lower,
// lower+1h) holding n rows of scope, claimed at lower, expired and past
// their purge time at goes.
func fillPartition(tb testing.TB, pool *pgxpool.Pool, schema, tbl, name, scope string, lower time.Time, n int, goes time.Time) {
	tb.Helper()
	addPartitionOf(tb, pool, schema, tbl, name, lower, lower.Add(time.Hour))
	run(tb, pool, `INSERT INTO `+table(schema, tbl)+` (scope, key, status, token, attempt,
		created_at, updated_at, expires_at, purge_at, claimed_at, result)
		SELECT $1, 'old-' || i, 2, i, 1, $2, $2, $4, $4, $2, '\x00112233445566778899'
		FROM generate_series(1, $3) i`, scope, lower, n, goes)
}

// While the store's own cleaner drops partitions of 20k rows each, 8
// connections claim new keys without a pause, half in the lease mode and
// half in the one-transaction mode (holding their transactions open for a
// few milliseconds, which a DROP TABLE of an attached partition would wait
// for while every claim queued behind it). No claim waits for a lock on the
// table or a partition (a sampler of pg_locks sees none), none takes longer
// than a generous bound, every claim executes, and no key has two rows.
func TestPartitionedDropBlocksNoClaim(t *testing.T) {
	t.Parallel()
	admin := testenv.Pool(t)
	schema := testenv.Schema(t, admin)
	// One-minute partitions, the cleaner every 100 ms.
	newPartitioned(t, admin, schema, postgres.Options{Retention: 24 * time.Minute})
	now := dbNow(t, admin)
	base := now.Truncate(time.Hour).Add(-6 * time.Hour)
	const oldParts, perPart = 4, 20000
	for i := range oldParts {
		fillOld(t, admin, schema, fmt.Sprintf("old_%d", i), "old", base.Add(time.Duration(i)*time.Hour), perPart)
	}
	// Partitions far enough ahead that the cleaner creates none meanwhile:
	// this measures drops (creation: TestPartitionedCreationWaitsForNoTransaction).
	dropAllCurrent := func() {
		for _, p := range partitionsOf(t, admin, schema) {
			if !strings.HasPrefix(p.name, "old_") {
				run(t, admin, "DROP TABLE "+pgx.Identifier{schema, p.name}.Sanitize())
			}
		}
	}
	dropAllCurrent()
	addPartition(t, admin, schema, "current", now.Add(-time.Hour), now.Add(2*time.Hour))

	pool := testenv.Pool(t, func(c *pgxpool.Config) {
		c.MaxConns = 12
		c.ConnConfig.RuntimeParams["application_name"] = "claims"
	})
	s, err := postgres.New(pool, postgres.Options{Schema: schema, Table: partitionedTable, Layout: postgres.LayoutPartitioned,
		Retention: 24 * time.Minute, CleanupInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })

	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	var (
		wg       sync.WaitGroup
		claims   atomic.Int64
		slowest  atomic.Int64 // nanoseconds
		waits    atomic.Int64
		waitSeen atomic.Value
	)
	record := func(d time.Duration) {
		for {
			old := slowest.Load()
			if int64(d) <= old || slowest.CompareAndSwap(old, int64(d)) {
				return
			}
		}
	}
	for w := range 8 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				key := fmt.Sprintf("k-%d-%d", w, i)
				start := time.Now()
				if w%2 == 0 {
					res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "new", Key: key, LeaseDuration: time.Minute, Retain: time.Minute})
					if err == nil && res.Decision == store.DecisionExecute {
						err = s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Minute})
					} else if err == nil {
						err = fmt.Errorf("decision %v for a new key", res.Decision)
					}
					if err != nil && ctx.Err() == nil {
						t.Errorf("lease claim of %s: %v", key, err)
						return
					}
				} else {
					res, err := s.ClaimInTx(ctx, store.TxRequest{Scope: "new", Key: key, SuccessTTL: time.Minute, Wait: 5 * time.Second})
					if err == nil && res.Decision != store.DecisionExecute {
						err = fmt.Errorf("decision %v for a new key", res.Decision)
					}
					if err == nil {
						time.Sleep(5 * time.Millisecond) // the handler
						err = res.Tx.Commit(ctx, nil)
					}
					if err != nil && ctx.Err() == nil {
						t.Errorf("one-transaction claim of %s: %v", key, err)
						return
					}
				}
				if ctx.Err() == nil {
					claims.Add(1)
					record(time.Since(start))
				}
			}
		})
	}
	// The sampler: a statement of the store waiting for a lock on the table or
	// one of its partitions in the modes of claims, completions and commits
	// (ROW SHARE, ROW EXCLUSIVE; the cleaner takes others).
	wg.Go(func() {
		for ctx.Err() == nil {
			var n int
			var what *string
			err := admin.QueryRow(ctx, `SELECT count(*), min(l.mode || ' on ' || l.relation::regclass::text || ' by ' || a.query || ' blocked by ' || coalesce((SELECT string_agg(b.query, ' | ') FROM pg_stat_activity b WHERE b.pid = ANY (pg_blocking_pids(l.pid))), '?'))
				FROM pg_locks l JOIN pg_class c ON c.oid = l.relation JOIN pg_stat_activity a ON a.pid = l.pid
				WHERE NOT l.granted AND l.locktype = 'relation' AND c.relnamespace = to_regnamespace($1)::oid
					AND a.application_name = 'claims' AND l.mode IN ('RowShareLock', 'RowExclusiveLock')`, schema).Scan(&n, &what)
			if err == nil && n > 0 {
				waits.Add(int64(n))
				waitSeen.Store(*what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	testenv.WaitFor(t, 2*time.Minute, "the cleaner to drop the old partitions", func() bool {
		for _, p := range partitionsOf(t, admin, schema) {
			if strings.HasPrefix(p.name, "old_") {
				return false
			}
		}
		return true
	})
	time.Sleep(200 * time.Millisecond) // claims after the last drop
	stop()
	wg.Wait()

	if n := waits.Load(); n > 0 {
		t.Errorf("claims waited for a lock on the table %d times (%v), while partitions were dropped", n, waitSeen.Load())
	}
	const bound = 2 * time.Second
	if d := time.Duration(slowest.Load()); d > bound {
		t.Errorf("the slowest claim took %v while partitions were dropped; want at most %v", d, bound)
	}
	var rows, keys int64
	if err := admin.QueryRow(t.Context(), "SELECT count(*), count(DISTINCT (scope, key)) FROM "+table(schema, partitionedTable)+
		" WHERE scope = 'new'").Scan(&rows, &keys); err != nil {
		t.Fatal(err)
	}
	if rows != keys || rows < claims.Load() || claims.Load() == 0 {
		t.Fatalf("%d claims, %d rows of %d keys; want one row per key, every claim stored", claims.Load(), rows, keys)
	}
	var left int
	if err := admin.QueryRow(t.Context(), "SELECT count(*) FROM pg_class WHERE relname LIKE 'old_%' AND relnamespace = to_regnamespace($1)::oid AND relkind = 'r'",
		schema).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d detached tables left behind, %v", left, err)
	}
	t.Logf("%d claims while %d partitions of %d rows went; the slowest took %v", claims.Load(), oldParts, perPart, time.Duration(slowest.Load()))
}

// A one-transaction claim that moves an aged row out of a partition whose
// rows may all go, and stays open while a cleanup pass runs: the pass waits
// for it (its transaction began before the pass) before it reads the
// partition, so what the claim commits is kept, in the current partition,
// and the emptied partition goes. Rolled back instead, the row stays in the
// partition, which goes with it.
func TestPartitionedDropWaitsForAClaimMovingARowOut(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newPartitioned(t, pool, schema, postgres.Options{})
	for i, commit := range []bool{true, false} {
		key := fmt.Sprintf("moving-%v", commit)
		lower := dbNow(t, pool).Truncate(time.Hour).Add(-time.Duration(3+i) * time.Hour)
		old := fmt.Sprintf("moving_%d", i)
		addPartition(t, pool, schema, old, lower, lower.Add(time.Hour))
		insertOld(t, pool, schema, "s", key, store.StatusRetryable, 2, lower.Add(time.Minute), false)
		res, err := s.ClaimInTx(t.Context(), store.TxRequest{Scope: "s", Key: key, SuccessTTL: time.Hour, Wait: time.Second})
		if err != nil || res.Decision != store.DecisionExecute {
			t.Fatalf("ClaimInTx = %+v, %v", res.ClaimResult, err)
		}
		passed := make(chan error, 1)
		go func() {
			_, _, err := s.CleanupPass(t.Context())
			passed <- err
		}()
		select {
		case err := <-passed:
			t.Fatalf("the pass ended (%v) while a transaction older than it was open", err)
		case <-time.After(500 * time.Millisecond):
		}
		if commit {
			err = res.Tx.Commit(t.Context(), []byte("done"))
		} else {
			err = res.Tx.Rollback(t.Context())
		}
		if err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-passed:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the pass did not end after the transaction did")
		}
		for _, p := range partitionsOf(t, pool, schema) {
			if p.name == old {
				t.Fatalf("partition %s is still there", old)
			}
		}
		rec, err := s.Get(t.Context(), "s", key)
		switch {
		case commit && (err != nil || rec.Status != store.StatusSucceeded || string(rec.Result) != "done"):
			t.Fatalf("after the commit Get = %+v, %v; want the success", rec, err)
		case !commit && !errors.Is(err, store.ErrNotFound):
			t.Fatalf("after the rollback Get = %+v, %v; want not found (the row went with its partition)", rec, err)
		}
	}
}

// Complete and Release on the partitioned layout refuse a lease that is
// expired and past its purge time, as if the DELETE layout's cleanup had
// removed it: so no write makes a row of a partition being dropped live
// again. A lease that is expired but not yet past its purge time can still
// be completed.
func TestPartitionedCompleteRefusesARowPastItsPurgeTime(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newPartitioned(t, pool, schema, postgres.Options{})
	qualified := table(schema, partitionedTable)
	claim := func(key string) store.Claim {
		res, err := s.ClaimLease(t.Context(), store.LeaseRequest{Scope: "s", Key: key, LeaseDuration: time.Minute, Retain: time.Hour})
		if err != nil || res.Decision != store.DecisionExecute {
			t.Fatalf("ClaimLease = %+v, %v", res, err)
		}
		return res.Claim
	}
	done := store.Completion{Status: store.StatusSucceeded, TTL: time.Hour}
	gone, released, late := claim("gone"), claim("released"), claim("late")
	run(t, pool, "UPDATE "+qualified+" SET expires_at = now() - interval '1 second', purge_at = now() - interval '1 second' WHERE key IN ('gone', 'released')")
	run(t, pool, "UPDATE "+qualified+" SET expires_at = now() - interval '1 second' WHERE key = 'late'")
	if err := s.Complete(t.Context(), gone, done); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Complete of a lease past its purge time = %v; want ErrLeaseLost", err)
	}
	if err := s.Release(t.Context(), released, store.Completion{Status: store.StatusRetryable, TTL: time.Hour}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Release of a lease past its purge time = %v; want ErrLeaseLost", err)
	}
	if err := s.Complete(t.Context(), late, done); err != nil {
		t.Fatalf("Complete of an expired lease before its purge time = %v; want it stored", err)
	}
}

// A detach that was interrupted leaves the partition detaching, and a
// table detached but not dropped stays out of the table: the next pass
// finishes the one (DETACH … FINALIZE) and drops both, counting their rows;
// Partitions lists neither as the table's once they are detached.
func TestPartitionedUpkeepFinishesAnInterruptedDrop(t *testing.T) {
	t.Parallel()
	admin := testenv.Pool(t)
	schema := testenv.Schema(t, admin)
	s := newPartitioned(t, admin, schema, postgres.Options{})
	lower := dbNow(t, admin).Truncate(time.Hour).Add(-5 * time.Hour)
	fillOld(t, admin, schema, "pending", "s", lower, 3)
	fillOld(t, admin, schema, "leftover", "s", lower.Add(time.Hour), 2)
	// The leftover: marked and detached by a pass that ended before its
	// DROP.
	marker := "oncemill: detached from " + schema + "." + partitionedTable + " by the partition upkeep; dropped by its next pass"
	run(t, admin, fmt.Sprintf("COMMENT ON TABLE %s IS '%s'", pgx.Identifier{schema, "leftover"}.Sanitize(), marker))
	run(t, admin, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s", table(schema, partitionedTable), pgx.Identifier{schema, "leftover"}.Sanitize()))
	// The detaching one: a DETACH … CONCURRENTLY cancelled while it waits
	// for a transaction that reads the table.
	tx, err := admin.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck
	if _, err := tx.Exec(t.Context(), "SELECT count(*) FROM "+table(schema, partitionedTable)); err != nil {
		t.Fatal(err)
	}
	// The server ends it (statement_timeout), so that it is over before
	// the transaction is.
	conn, err := admin.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(t.Context(), "SET statement_timeout = 1000"); err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(t.Context(), fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s CONCURRENTLY",
		table(schema, partitionedTable), pgx.Identifier{schema, "pending"}.Sanitize()))
	if err == nil || !strings.Contains(err.Error(), "statement timeout") {
		t.Fatalf("the detach = %v; want it cancelled by the statement timeout while a transaction that sees the partition is open", err)
	}
	if _, err := conn.Exec(t.Context(), "RESET statement_timeout"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	var pending bool
	if err := admin.QueryRow(t.Context(), "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = to_regclass($1)",
		pgx.Identifier{schema, "pending"}.Sanitize()).Scan(&pending); err != nil || !pending {
		t.Fatalf("the partition is not left detaching: %v, %v", pending, err)
	}
	parts, err := s.Partitions(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		if p.Name == "leftover" {
			t.Fatalf("Partitions lists the detached table: %+v", parts)
		}
	}
	if removed, _, err := s.CleanupPass(t.Context()); err != nil || removed != 5 {
		t.Fatalf("pass = %d, %v; want both tables' 5 rows removed", removed, err)
	}
	var left int
	if err := admin.QueryRow(t.Context(), "SELECT count(*) FROM pg_class WHERE relname IN ('pending', 'leftover') AND relnamespace = to_regnamespace($1)::oid",
		schema).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d of the tables are left, %v", left, err)
	}
}

// DeleteExpired on the partitioned layout drops the partitions whose rows
// may all go, as the cleaner's pass does, returning their rows (more than
// its limit: a partition goes whole) and deleting none; only when no
// partition can go does it delete up to limit expired rows from those that
// stay. Live records stay either way.
func TestPartitionedDeleteExpiredDropsPartitions(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newPartitioned(t, pool, schema, postgres.Options{})
	lower := dbNow(t, pool).Truncate(time.Hour).Add(-4 * time.Hour)
	fillOld(t, pool, schema, "old", "s", lower, 7)
	for _, key := range []string{"expired-1", "expired-2", "live"} {
		if _, err := s.ClaimLease(t.Context(), store.LeaseRequest{Scope: "s", Key: key, LeaseDuration: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	run(t, pool, "UPDATE "+table(schema, partitionedTable)+" SET expires_at = now() - interval '1 second', purge_at = now() - interval '1 second' WHERE key LIKE 'expired-%'")

	if n, err := s.DeleteExpired(t.Context(), 1); err != nil || n != 7 {
		t.Fatalf("DeleteExpired(1) with a partition that may go = %d, %v; want its 7 rows", n, err)
	}
	for _, p := range partitionsOf(t, pool, schema) {
		if p.name == "old" {
			t.Fatal("the partition is still there")
		}
	}
	if got := len(rowsOf(t, pool, schema, "s", "expired-1")) + len(rowsOf(t, pool, schema, "s", "expired-2")); got != 2 {
		t.Fatalf("%d of the 2 expired rows in the current partition are left; want both (a drop deletes no row)", got)
	}
	for i, want := range []int{1, 1, 0} {
		if n, err := s.DeleteExpired(t.Context(), 1); err != nil || n != want {
			t.Fatalf("DeleteExpired(1) #%d with no partition to drop = %d, %v; want %d", i+1, n, err, want)
		}
	}
	if rec, err := s.Get(t.Context(), "s", "live"); err != nil || rec.Status != store.StatusInProgress {
		t.Fatalf("Get(live) = %+v, %v; want the live lease", rec, err)
	}
}

// Creating a partition does not wait for the transactions open on the
// table: with a one-transaction claim open (its handler at work), a pass
// creates the partitions ahead within a few seconds, and another claim
// goes through meanwhile. (CREATE TABLE … PARTITION OF locks the table
// ACCESS EXCLUSIVE: it would wait for the open claim, and every new claim
// behind it.)
func TestPartitionedCreationWaitsForNoTransaction(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newPartitioned(t, pool, schema, postgres.Options{}) // 2-minute partitions
	dropAllPartitions(t, pool, schema)
	now := dbNow(t, pool)
	addPartition(t, pool, schema, "now", now.Add(-time.Hour), now.Add(time.Minute))
	open, err := s.ClaimInTx(t.Context(), store.TxRequest{Scope: "s", Key: "open", SuccessTTL: time.Hour, Wait: time.Second})
	if err != nil || open.Decision != store.DecisionExecute {
		t.Fatalf("ClaimInTx = %+v, %v", open.ClaimResult, err)
	}
	defer open.Tx.Rollback(context.Background()) //nolint:errcheck
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, _, err := s.CleanupPass(ctx); err != nil {
		t.Fatalf("a pass with a claim's transaction open: %v; want the partitions ahead created without waiting for it", err)
	}
	var ahead bool
	for _, p := range partitionsOf(t, pool, schema) {
		ahead = ahead || p.lower.Equal(now.Add(time.Minute))
	}
	if !ahead {
		t.Fatalf("no partition was created after the current one: %+v", partitionsOf(t, pool, schema))
	}
	if res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "other", LeaseDuration: time.Minute}); err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("ClaimLease while the claim is open = %+v, %v", res, err)
	}
	if err := open.Tx.Commit(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(t.Context(), "s", "open"); err != nil || rec.Status != store.StatusSucceeded {
		t.Fatalf("Get(open) = %+v, %v", rec, err)
	}
}
