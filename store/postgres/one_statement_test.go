package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// unkeyedPartitions lists the partitions of s's table that have no unique
// index on (scope, key), as the store reads them.
func unkeyedPartitions(tb testing.TB, s *postgres.Store) []string {
	tb.Helper()
	names, err := s.UnkeyedPartitions(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	return names
}

// Once the key filters are loaded and leave only the partition of now to
// look a new key up in, a new key is claimed in one statement sent with
// BEGIN, without the lock's statement of its own: up front and deferred.
// A key the partition holds is not taken by it: the claim goes on under
// the lock and replays the record.
func TestPartitionedNewKeyInOneStatement(t *testing.T) {
	t.Parallel()
	count, pool, schema, s := newCountedPartitioned(t)
	ctx := t.Context()
	req := func(key string, deferrable bool) store.TxRequest {
		return store.TxRequest{Scope: "s", Key: key, SuccessTTL: time.Hour, Wait: 5 * time.Second, Deferrable: deferrable}
	}
	// claim claims key and commits the transaction with one statement of
	// the handler's in it, and returns what the claim and the statement
	// sent, the COMMIT left out.
	claim := func(key string, deferrable bool, want store.Decision) statementCounts {
		t.Helper()
		before := count.load()
		res, err := s.ClaimInTx(ctx, req(key, deferrable))
		if err != nil || res.Decision != want {
			t.Fatalf("claim of %q (deferred %v) = %+v, %v; want %v", key, deferrable, res.ClaimResult, err, want)
		}
		if res.Tx == nil {
			return count.load().minus(before)
		}
		tx, _ := postgres.TxFromContext(res.Tx.Context(ctx))
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		sent := count.load().minus(before)
		if err := res.Tx.Commit(ctx, nil); err != nil {
			t.Fatal(err)
		}
		return sent
	}
	claim("warm", false, store.DecisionExecute) // prepares the statements
	// Before the filters are loaded, a new key is looked up everywhere,
	// after the lock: BEGIN, the lock, the insert.
	if got := claim("before", false, store.DecisionExecute); got.statements != 4 || got.roundTrips != 2 {
		t.Fatalf("claim up front before the filters loaded sent %+v; want 4 statements (BEGIN, lock, insert, the handler's) in 2 round trips", got)
	}
	if err := s.RefreshKeyFilters(ctx); err != nil {
		t.Fatal(err)
	}
	claim("warm-2", false, store.DecisionExecute)
	claim("warm-3", true, store.DecisionExecute)
	if got := claim("up-front", false, store.DecisionExecute); got.statements != 3 || got.roundTrips != 2 {
		t.Fatalf("claim up front sent %+v; want 3 statements (BEGIN, the claim, the handler's) in 2 round trips", got)
	}
	if got := claim("deferred", true, store.DecisionExecute); got.statements != 3 || got.roundTrips != 1 {
		t.Fatalf("deferred claim sent %+v; want 3 statements (BEGIN, the claim, the handler's) in 1 round trip", got)
	}
	// A key with a row in the partition: not taken in one statement; the
	// lock and the claim under it replay it, one more round trip, and the
	// transaction is rolled back.
	if got := claim("up-front", false, store.DecisionReplay); got.statements != 5 || got.roundTrips != 3 {
		t.Fatalf("claim of a recorded key sent %+v; want 5 statements (BEGIN, the claim; the lock, the claim under it; ROLLBACK) in 3 round trips", got)
	}
	for _, key := range []string{"before", "up-front", "deferred"} {
		if rows := rowsOf(t, pool, schema, "s", key); len(rows) != 1 {
			t.Fatalf("key %q has rows in %v; want one", key, rows)
		}
	}
	if parts := unkeyedPartitions(t, s); len(parts) != 0 {
		t.Fatalf("partitions without a unique index on (scope, key): %v", parts)
	}
}

// Claims of new keys from 8 connections around a partition boundary, each
// key claimed by 4 deliveries sent a few milliseconds apart across it:
// before the boundary the claims take a new key in one statement in the
// partition of now, after it they lock first and look the key up in both
// partitions (the filters still leave the closed one open). A claim of
// either form that comes after the other's commit finds its row, so each
// key runs once and has one row, in both modes.
func TestPartitionedNewKeysClaimedAcrossABoundary(t *testing.T) {
	t.Parallel()
	for _, deferred := range []bool{false, true} {
		t.Run(fmt.Sprintf("deferred=%v", deferred), func(t *testing.T) {
			t.Parallel()
			testPartitionedNewKeysClaimedAcrossABoundary(t, deferred)
		})
	}
}

func testPartitionedNewKeysClaimedAcrossABoundary(t *testing.T, deferred bool) {
	f := newBoundaryFixture(t, 1500*time.Millisecond)
	pool, schema, ledger, boundary, s := f.pool, f.schema, f.ledger, f.boundary, f.s
	var executed atomic.Int64
	r, err := receiver.NewTransactional(s).WithDeferredClaim(deferred).WithScope("ledger").WithEventHandler(func(e pipeline.Event) {
		if e.Outcome == pipeline.OutcomeExecuted {
			executed.Add(1)
		}
	}).Build()
	if err != nil {
		t.Fatal(err)
	}
	h := r.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := postgres.TxFromContext(msg.Context())
		_, err := tx.Exec(msg.Context(), "INSERT INTO "+ledger+" (message_uuid) VALUES ($1)", msg.UUID)
		time.Sleep(time.Millisecond)
		return nil, err
	})
	const keys, copies = 120, 4
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	start := time.Now().Add(time.Until(boundary) - 200*time.Millisecond) // the clocks share a machine
	for k := range keys {
		for c := range copies {
			// The k-th key's deliveries leave at start + 2k ms + c*10 ms:
			// those of keys 85 to 100 straddle the boundary, and keys
			// fall on both sides of it unless the deliveries run late by
			// most of 200 ms.
			at := start.Add(time.Duration(2*k)*time.Millisecond + time.Duration(c)*10*time.Millisecond)
			wg.Go(func() {
				time.Sleep(time.Until(at))
				sem <- struct{}{}
				defer func() { <-sem }()
				if _, err := h(message.NewMessage(fmt.Sprintf("key-%d", k), []byte("pay"))); err != nil {
					t.Errorf("delivery of key-%d: %v", k, err)
				}
			})
		}
	}
	wg.Wait()
	var rows, distinct int
	if err := pool.QueryRow(t.Context(), "SELECT count(*), count(DISTINCT message_uuid) FROM "+ledger).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != keys || distinct != keys || executed.Load() != keys {
		t.Fatalf("%d ledger rows of %d keys, %d executions; want %d of each", rows, distinct, executed.Load(), keys)
	}
	perPartition := map[string]int{}
	for k := range keys {
		rs := rowsOf(t, pool, schema, "ledger", fmt.Sprintf("key-%d", k))
		if len(rs) != 1 {
			t.Fatalf("key-%d has records in %v; want one", k, rs)
		}
		perPartition[rs[0]]++
	}
	if len(perPartition) != 2 {
		t.Fatalf("records per partition %v; want keys on both sides of the boundary", perPartition)
	}
}

// Migration 6 keys every partition of a table made before it by (scope,
// key), its own made by hand included, and drops the table's primary key;
// the records stay and claims go on, a new key in one statement.
func TestPartitionedMigrationKeysEveryPartition(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	opts := postgres.Options{Schema: schema, Table: partitionedTable, Layout: postgres.LayoutPartitioned, Retention: time.Hour, CleanupInterval: -1}
	s := newStoreAt(t, pool, opts, 5)
	ctx := t.Context()
	// The table as version 5 made it: a primary key (scope, key,
	// claimed_at), and on each partition its index alone.
	dropAllPartitions(t, pool, schema)
	run(t, pool, "ALTER TABLE "+table(schema, partitionedTable)+" ADD PRIMARY KEY (scope, key, claimed_at)")
	now := dbNow(t, pool)
	lower := now.Truncate(time.Hour)
	run(t, pool, fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')", pgx.Identifier{schema, "v5_now"}.Sanitize(),
		table(schema, partitionedTable), lower.UTC().Format(time.RFC3339), lower.Add(time.Hour).UTC().Format(time.RFC3339)))
	run(t, pool, fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')", pgx.Identifier{schema, "v5_old"}.Sanitize(),
		table(schema, partitionedTable), lower.Add(-time.Hour).UTC().Format(time.RFC3339), lower.UTC().Format(time.RFC3339)))
	insertOld(t, pool, schema, "s", "old", store.StatusSucceeded, 1, lower.Add(-time.Minute), true)
	if got := unkeyedPartitions(t, s); len(got) != 2 {
		t.Fatalf("unkeyed partitions at version 5: %v; want both", got)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if got := unkeyedPartitions(t, s); len(got) != 0 {
		t.Fatalf("partitions without a unique index on (scope, key) after Migrate: %v", got)
	}
	var pkeys int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_constraint WHERE conrelid = to_regclass($1) AND contype = 'p'", table(schema, partitionedTable)).Scan(&pkeys); err != nil {
		t.Fatal(err)
	}
	if pkeys != 0 {
		t.Fatalf("the table still has its primary key")
	}
	if err := s.RefreshKeyFilters(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := s.ClaimInTx(ctx, store.TxRequest{Scope: "s", Key: "old", SuccessTTL: time.Hour, Wait: time.Second})
	if err != nil || res.Decision != store.DecisionReplay {
		t.Fatalf("claim of a key recorded before the migration = %+v, %v; want its replay", res.ClaimResult, err)
	}
	res, err = s.ClaimInTx(ctx, store.TxRequest{Scope: "s", Key: "new", SuccessTTL: time.Hour, Wait: time.Second})
	if err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("claim of a new key = %+v, %v", res.ClaimResult, err)
	}
	if err := res.Tx.Commit(ctx, nil); err != nil {
		t.Fatal(err)
	}
	// A second row of a key in one partition is refused by its index.
	_, err = pool.Exec(ctx, "INSERT INTO "+table(schema, partitionedTable)+` (scope, key, status, token, attempt, created_at, updated_at, expires_at, purge_at, claimed_at)
		VALUES ('s', 'new', 2, 99, 1, now(), now(), now(), now(), clock_timestamp())`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("a second row of a key in its partition = %v; want a unique violation", err)
	}
}

// The statement that takes a new key in one statement inserts only when it
// gets the key's lock without waiting, the partition holds no row of the
// key, and the clock is before the upper bound it was rendered with: a
// claim whose partition of now ended after the worker chose the statement
// inserts nothing, and goes on under the lock.
func TestPartitionedNewKeyInOneStatementGuards(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newPartitioned(t, pool, schema, postgres.Options{})
	dropAllPartitions(t, pool, schema)
	now := dbNow(t, pool)
	addPartition(t, pool, schema, "now", now.Add(-time.Hour), now.Add(time.Hour))
	ctx := t.Context()
	claim := func(ctx context.Context, q pgx.Tx, key string, until time.Time) (int64, error) {
		var token int64
		err := q.QueryRow(ctx, s.NewKeyInOneStatement("now", now.Add(-time.Hour), until), "s", key, "", int64(time.Hour/time.Microsecond),
			int64(time.Hour/time.Microsecond), postgres.ClaimLockKey("s", key), "uuid-"+key).Scan(&token)
		return token, err
	}
	inTx := func(f func(tx pgx.Tx) error) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, pool, f); err != nil {
			t.Fatal(err)
		}
	}
	inTx(func(tx pgx.Tx) error {
		_, err := claim(ctx, tx, "new", now.Add(time.Hour))
		return err
	})
	if rows := rowsOf(t, pool, schema, "s", "new"); len(rows) != 1 {
		t.Fatalf("a new key's rows: %v; want one", rows)
	}
	inTx(func(tx pgx.Tx) error {
		if _, err := claim(ctx, tx, "new", now.Add(time.Hour)); !errors.Is(err, pgx.ErrNoRows) {
			t.Errorf("a key with a row in the partition: %v; want no row", err)
		}
		if _, err := claim(ctx, tx, "late", dbNow(t, pool).Add(-time.Millisecond)); !errors.Is(err, pgx.ErrNoRows) {
			t.Errorf("past the upper bound: %v; want no row", err)
		}
		return nil
	})
	if rows := rowsOf(t, pool, schema, "s", "late"); len(rows) != 0 {
		t.Fatalf("a claim past the upper bound inserted %v", rows)
	}
	// Another transaction holds the key's lock, its row not committed: the
	// claim gives up at once, before its insert would wait on that row.
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // the test's end
	if _, err := claim(ctx, holder, "held", now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	quick, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err = pgx.BeginFunc(quick, pool, func(tx pgx.Tx) error {
		_, err := claim(quick, tx, "held", now.Add(time.Hour))
		return err
	})
	if !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("a key whose lock another transaction holds: %v; want no row at once", err)
	}
}
