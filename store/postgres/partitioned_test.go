package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// The partitioned layout (LayoutPartitioned): what the contract suite
// (TestContractPartitioned) cannot see, the partitions.

// partitionedTable is the table of the partitioned stores of these tests,
// beside the DELETE layout's table that fixtures may create in the schema.
const partitionedTable = "records_p"

// partitionedRetention is newPartitioned's retention unless opts gives
// one: 2-minute partitions.
const partitionedRetention = time.Hour

// newPartitioned is a migrated store of the partitioned layout in schema,
// with the background cleaner off unless opts says otherwise.
func newPartitioned(tb testing.TB, pool *pgxpool.Pool, schema string, opts postgres.Options) *postgres.Store {
	tb.Helper()
	opts.Schema, opts.Table, opts.Layout = schema, partitionedTable, postgres.LayoutPartitioned
	if opts.Retention == 0 {
		opts.Retention = partitionedRetention
	}
	return newStore(tb, pool, opts)
}

// newCountedPartitioned is newPartitioned on a pool of its own whose
// statements count counts.
func newCountedPartitioned(t *testing.T) (count *statementCounter, pool *pgxpool.Pool, schema string, s *postgres.Store) {
	count = &statementCounter{}
	pool = testenv.Pool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = count })
	schema = testenv.Schema(t, pool)
	return count, pool, schema, newPartitioned(t, pool, schema, postgres.Options{})
}

type part struct {
	name         string
	lower, upper time.Time
}

// partitionsOf lists the partitions of the partitioned table, oldest first.
func partitionsOf(tb testing.TB, pool *pgxpool.Pool, schema string) []part {
	tb.Helper()
	return partsOf(tb, pool, schema, partitionedTable)
}

func run(tb testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	tb.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
}

// dropAllPartitions leaves the table with no partition at all.
func dropAllPartitions(tb testing.TB, pool *pgxpool.Pool, schema string) {
	tb.Helper()
	for _, p := range partitionsOf(tb, pool, schema) {
		run(tb, pool, "DROP TABLE "+pgx.Identifier{schema, p.name}.Sanitize())
	}
}

// addPartition creates the partition name for [lower, upper).
func addPartition(tb testing.TB, pool *pgxpool.Pool, schema, name string, lower, upper time.Time) {
	tb.Helper()
	addPartitionOf(tb, pool, schema, partitionedTable, name, lower, upper)
}

// addPartitionOf creates the partition name of schema.tbl for [lower, upper).
func addPartitionOf(tb testing.TB, pool *pgxpool.Pool, schema, tbl, name string, lower, upper time.Time) {
	tb.Helper()
	run(tb, pool, fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')",
		pgx.Identifier{schema, name}.Sanitize(), table(schema, tbl),
		lower.UTC().Format(time.RFC3339Nano), upper.UTC().Format(time.RFC3339Nano)))
	run(tb, pool, "CREATE UNIQUE INDEX ON "+pgx.Identifier{schema, name}.Sanitize()+" (scope, key)") // as the store's partitions have
}

// dbNow is now() of the database.
func dbNow(tb testing.TB, pool *pgxpool.Pool) time.Time {
	tb.Helper()
	var now time.Time
	if err := pool.QueryRow(context.Background(), "SELECT now()").Scan(&now); err != nil {
		tb.Fatal(err)
	}
	return now
}

// rowsOf returns the partitions that hold a row of (scope, key), one entry
// per row.
func rowsOf(tb testing.TB, pool *pgxpool.Pool, schema, scope, key string) []string {
	tb.Helper()
	return texts(tb, pool, "SELECT tableoid::regclass::text FROM "+table(schema, partitionedTable)+
		" WHERE scope = $1 AND key = $2", scope, key)
}

// texts runs sql, a query of one text column, and returns its rows.
func texts(tb testing.TB, pool *pgxpool.Pool, sql string, args ...any) []string {
	tb.Helper()
	rows, err := pool.Query(context.Background(), sql, args...)
	if err != nil {
		tb.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// insertOld puts a row of (scope, key) in the partition that covers
// claimedAt: status, attempt and token as given, expired and past its
// purge time unless live.
func insertOld(tb testing.TB, pool *pgxpool.Pool, schema, scope, key string, status store.Status, attempt int, claimedAt time.Time, live bool) {
	tb.Helper()
	expires := "now() - interval '1 hour'"
	if live {
		expires = "now() + interval '1 hour'"
	}
	run(tb, pool, `INSERT INTO `+table(schema, partitionedTable)+` (scope, key, status, token, attempt,
		created_at, updated_at, expires_at, purge_at, claimed_at)
		VALUES ($1, $2, $3, 1, $4, $5, $5, `+expires+`, now() - interval '1 hour', $5)`, scope, key, int16(status), attempt, claimedAt)
}

// The same key claimed from 8 connections at the moment the table has no
// partition for now (the claims and the cleaner's upkeep create it) and the
// key's previous record, expired, sits in an old partition that the same
// upkeep drops: one execution, one record, and the old partition gone.
func TestPartitionedOneExecutionAsPartitionsTurnOver(t *testing.T) {
	t.Parallel()
	for _, deferred := range []bool{false, true} {
		t.Run(fmt.Sprintf("deferred=%v", deferred), func(t *testing.T) {
			t.Parallel()
			testPartitionedOneExecutionAsPartitionsTurnOver(t, deferred)
		})
	}
}

func testPartitionedOneExecutionAsPartitionsTurnOver(t *testing.T, deferred bool) {
	pool := testenv.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 12 })
	schema := testenv.Schema(t, pool)
	s := newPartitioned(t, pool, schema, postgres.Options{})
	ledger := pgx.Identifier{schema, "ledger"}.Sanitize()
	run(t, pool, "CREATE TABLE "+ledger+" (id bigserial PRIMARY KEY, message_uuid text NOT NULL)")
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
		time.Sleep(5 * time.Millisecond)
		return nil, err
	})
	for round := range 5 {
		key := fmt.Sprintf("turnover-%d", round)
		dropAllPartitions(t, pool, schema)
		// The previous partition, long past, with the key's expired success.
		lower := dbNow(t, pool).Truncate(time.Hour).Add(-time.Duration(3+round) * time.Hour)
		old := fmt.Sprintf("old_%d", round)
		addPartition(t, pool, schema, old, lower, lower.Add(time.Hour))
		insertOld(t, pool, schema, "ledger", key, store.StatusSucceeded, 1, lower.Add(time.Minute), false)

		start := make(chan struct{})
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				<-start
				if _, err := h(message.NewMessage(key, []byte("pay"))); err != nil {
					t.Errorf("round %d: delivery: %v", round, err)
				}
			})
		}
		wg.Go(func() {
			<-start
			if _, _, err := s.CleanupPass(t.Context()); err != nil {
				t.Errorf("round %d: upkeep: %v", round, err)
			}
		})
		before := executed.Load()
		close(start)
		wg.Wait()
		var n int
		if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+ledger+" WHERE message_uuid = $1", key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 || executed.Load()-before != 1 {
			t.Fatalf("round %d: %d ledger rows, %d executions; want 1, 1", round, n, executed.Load()-before)
		}
		if rows := rowsOf(t, pool, schema, "ledger", key); len(rows) != 1 || strings.Contains(rows[0], old) {
			t.Fatalf("round %d: the key's rows are in %v; want one, outside %s", round, rows, old)
		}
		// The old partition goes by the next pass at the latest (a drop
		// that met a claim's lock gives up and is tried again).
		if _, _, err := s.CleanupPass(t.Context()); err != nil {
			t.Fatal(err)
		}
		now := dbNow(t, pool)
		covered := false
		for _, p := range partitionsOf(t, pool, schema) {
			if p.name == old {
				t.Fatalf("round %d: partition %s is still there", round, old)
			}
			covered = covered || !p.lower.After(now) && p.upper.After(now)
		}
		if !covered {
			t.Fatalf("round %d: no partition covers now: %v", round, partitionsOf(t, pool, schema))
		}
	}
}

// 64 deliveries of one key over 8 connections, half of them after a
// partition boundary that falls while the first one's transaction is open:
// one business row, 63 replays. The deliveries after the boundary find the
// record in the partition before it.
func TestPartitioned64DeliveriesOfOneKeyAcrossABoundary(t *testing.T) {
	t.Parallel()
	for _, deferred := range []bool{false, true} {
		t.Run(fmt.Sprintf("deferred=%v", deferred), func(t *testing.T) {
			t.Parallel()
			testPartitioned64DeliveriesOfOneKeyAcrossABoundary(t, deferred)
		})
	}
}

// boundaryFixture is a partitioned table whose only partitions are
// "before" and "after" a boundary, a ledger table, and a store on a pool of
// 8 connections, its cleaner off and the partitions loaded as its first
// pass would load them: no filter, so "before", the oldest, is open and a
// new key is claimed in one statement until the boundary.
type boundaryFixture struct {
	pool           *pgxpool.Pool
	schema, ledger string
	boundary       time.Time
	s              *postgres.Store
}

func newBoundaryFixture(t *testing.T, in time.Duration) *boundaryFixture {
	t.Helper()
	f := &boundaryFixture{pool: testenv.Pool(t)}
	small := testenv.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 8 })
	// Every connection dialled before the boundary is set: a first claim
	// that dials (slowly, under -race on a loaded machine) would land
	// after it.
	warm(t, small, 8)
	f.schema = testenv.Schema(t, f.pool)
	newPartitioned(t, f.pool, f.schema, postgres.Options{})
	dropAllPartitions(t, f.pool, f.schema)
	f.boundary = dbNow(t, f.pool).Add(in)
	addPartition(t, f.pool, f.schema, "before", f.boundary.Add(-time.Hour), f.boundary)
	addPartition(t, f.pool, f.schema, "after", f.boundary, f.boundary.Add(time.Hour))
	f.ledger = pgx.Identifier{f.schema, "ledger"}.Sanitize()
	run(t, f.pool, "CREATE TABLE "+f.ledger+" (id bigserial PRIMARY KEY, message_uuid text NOT NULL)")

	s, err := postgres.New(small, postgres.Options{Schema: f.schema, Table: partitionedTable, Layout: postgres.LayoutPartitioned, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.RefreshKeyFilters(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.s = s
	return f
}

func testPartitioned64DeliveriesOfOneKeyAcrossABoundary(t *testing.T, deferred bool) {
	f := newBoundaryFixture(t, 1500*time.Millisecond)
	pool, schema, ledger, boundary, s := f.pool, f.schema, f.ledger, f.boundary, f.s
	var replays, executed atomic.Int64
	r, err := receiver.NewTransactional(s).WithDeferredClaim(deferred).WithScope("ledger").WithEventHandler(func(e pipeline.Event) {
		switch e.Outcome {
		case pipeline.OutcomeReplayed:
			replays.Add(1)
		case pipeline.OutcomeExecuted:
			executed.Add(1)
		}
	}).Build()
	if err != nil {
		t.Fatal(err)
	}
	h := r.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := postgres.TxFromContext(msg.Context())
		_, err := tx.Exec(msg.Context(), "INSERT INTO "+ledger+" (message_uuid) VALUES ($1)", msg.UUID)
		time.Sleep(500 * time.Millisecond) // commits after the boundary
		return nil, err
	})
	var wg sync.WaitGroup
	deliver := func() {
		wg.Go(func() {
			if _, err := h(message.NewMessage("one-key", []byte("pay 100"))); err != nil {
				t.Errorf("delivery: %v", err)
			}
		})
	}
	// The first 32 claim 300 ms before the boundary (the clocks share a
	// machine; the setup above takes its time under -race) and commit
	// after it.
	time.Sleep(time.Until(boundary) - 300*time.Millisecond)
	for range 32 {
		deliver()
	}
	time.Sleep(time.Until(boundary) + 100*time.Millisecond)
	if now := dbNow(t, pool); !now.After(boundary) {
		t.Fatalf("the database clock %v is not past the boundary %v", now, boundary)
	}
	for range 32 {
		deliver()
	}
	wg.Wait()
	var n int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+ledger+" WHERE message_uuid = 'one-key'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 || executed.Load() != 1 || replays.Load() != 63 {
		t.Fatalf("%d ledger rows, %d executed, %d replays; want 1, 1, 63", n, executed.Load(), replays.Load())
	}
	if rows := rowsOf(t, pool, schema, "ledger", "one-key"); len(rows) != 1 || !strings.HasSuffix(rows[0], "before") {
		t.Fatalf("the key's rows are in %v; want one, in the partition before the boundary", rows)
	}
}

// A key claimed again after its partition aged keeps its attempt count
// (a retry after a release, a takeover of an expired lease, a retry after a
// recorded rollback), moves to the current partition, and its old
// partition, empty now, is dropped while the record lives on.
func TestPartitionedRetryOfAnAgedKeyKeepsItsAttemptCount(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newPartitioned(t, pool, schema, postgres.Options{})
	lease := store.LeaseRequest{LeaseDuration: time.Minute, Retain: time.Hour}
	for i, tt := range []struct {
		name   string
		status store.Status
		live   bool
		tx     bool
	}{
		{"released", store.StatusRetryable, true, false},
		{"expired lease", store.StatusInProgress, false, false},
		{"recorded rollback", store.StatusRetryable, true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			key := "aged-" + tt.name
			lower := dbNow(t, pool).Truncate(time.Hour).Add(-time.Duration(3+i) * time.Hour)
			old := fmt.Sprintf("aged_%d", i)
			addPartition(t, pool, schema, old, lower, lower.Add(time.Hour))
			insertOld(t, pool, schema, "s", key, tt.status, 3, lower.Add(time.Minute), tt.live)
			// The worker sees the partition made by hand below its open one
			// as its cleaner's next pass would.
			if err := s.RefreshKeyFilters(t.Context()); err != nil {
				t.Fatal(err)
			}
			if tt.tx {
				// The rolled-back attempt 3 is recorded on the aged row,
				// which moves; the next claim is attempt 4.
				if err := s.RecordRollback(t.Context(), store.Claim{Scope: "s", Key: key, Token: 2, Attempt: 3}, "",
					store.Completion{Status: store.StatusRetryable, TTL: time.Hour}); err != nil {
					t.Fatalf("RecordRollback: %v", err)
				}
				if rows := rowsOf(t, pool, schema, "s", key); len(rows) != 1 || strings.Contains(rows[0], old) {
					t.Fatalf("after RecordRollback the key's rows are in %v; want one, moved out of %s", rows, old)
				}
				res, err := s.ClaimInTx(t.Context(), store.TxRequest{Scope: "s", Key: key, SuccessTTL: time.Hour, Wait: time.Second})
				if err != nil || res.Decision != store.DecisionExecute || res.Claim.Attempt != 4 {
					t.Fatalf("ClaimInTx = %+v, %v; want Execute at attempt 4", res.ClaimResult, err)
				}
				if err := res.Tx.Commit(t.Context(), nil); err != nil {
					t.Fatal(err)
				}
			} else {
				lease.Scope, lease.Key = "s", key
				res, err := s.ClaimLease(t.Context(), lease)
				if err != nil || res.Decision != store.DecisionExecute || res.Claim.Attempt != 4 || res.Takeover != (tt.status == store.StatusInProgress) {
					t.Fatalf("ClaimLease = %+v, %v; want Execute at attempt 4", res, err)
				}
				if res.Claim.Token <= 1 {
					t.Fatalf("token %d did not rise above the old record's 1", res.Claim.Token)
				}
			}
			if rows := rowsOf(t, pool, schema, "s", key); len(rows) != 1 || strings.Contains(rows[0], old) {
				t.Fatalf("the key's rows are in %v; want one, moved out of %s", rows, old)
			}
			if _, _, err := s.CleanupPass(t.Context()); err != nil {
				t.Fatal(err)
			}
			for _, p := range partitionsOf(t, pool, schema) {
				if p.name == old {
					t.Fatalf("the emptied partition %s is still there", old)
				}
			}
			if rec, err := s.Get(t.Context(), "s", key); err != nil || rec.Attempt != 4 {
				t.Fatalf("Get = attempt %d, %v; want the record at attempt 4", rec.Attempt, err)
			}
		})
	}
}

// A partition whose rows are not all past their purge time and expired
// stays; once they are, the next pass drops it and counts its rows.
func TestPartitionedDropWaitsForEveryRow(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newPartitioned(t, pool, schema, postgres.Options{})
	lower := dbNow(t, pool).Truncate(time.Hour).Add(-3 * time.Hour)
	addPartition(t, pool, schema, "old", lower, lower.Add(time.Hour))
	insertOld(t, pool, schema, "s", "dead", store.StatusSucceeded, 1, lower.Add(time.Minute), false)
	insertOld(t, pool, schema, "s", "live", store.StatusSucceeded, 1, lower.Add(2*time.Minute), true)
	if removed, _, err := s.CleanupPass(t.Context()); err != nil || removed != 0 {
		t.Fatalf("pass = %d, %v; want nothing removed while a row lives", removed, err)
	}
	if rec, err := s.Get(t.Context(), "s", "live"); err != nil || rec.Status != store.StatusSucceeded {
		t.Fatalf("Get(live) = %v, %v", rec.Status, err)
	}
	run(t, pool, "UPDATE "+table(schema, partitionedTable)+" SET expires_at = now() - interval '1 second' WHERE key = 'live'")
	// A fresh store: the first one remembers when the live row was due.
	s2 := newPartitioned(t, pool, schema, postgres.Options{})
	if removed, _, err := s2.CleanupPass(t.Context()); err != nil || removed != 2 {
		t.Fatalf("pass = %d, %v; want the partition's 2 rows removed", removed, err)
	}
	for _, p := range partitionsOf(t, pool, schema) {
		if p.name == "old" {
			t.Fatal("the partition is still there")
		}
	}
}

// A worker whose table has no partition for now creates it: a claim does,
// and so does the background cleaner as it starts.
func TestPartitionedWorkerCreatesThePartitionForNow(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newPartitioned(t, pool, schema, postgres.Options{})
	dropAllPartitions(t, pool, schema)
	res, err := s.ClaimLease(t.Context(), store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: time.Minute})
	if err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("ClaimLease with no partition = %+v, %v; want Execute", res, err)
	}
	if len(partitionsOf(t, pool, schema)) == 0 {
		t.Fatal("no partition was created")
	}

	dropAllPartitions(t, pool, schema)
	newPartitioned(t, pool, schema, postgres.Options{CleanupInterval: time.Hour})
	testenv.WaitFor(t, 30*time.Second, "the cleaner to create the partition for now", func() bool {
		now := dbNow(t, pool)
		for _, p := range partitionsOf(t, pool, schema) {
			if !p.lower.After(now) && p.upper.After(now) {
				return true
			}
		}
		return false
	})
}

// A role that may not create partitions gets an error naming the grants
// it lacks, and no partition is made.
func TestPartitionedMissingPrivilegeIsNamed(t *testing.T) {
	t.Parallel()
	admin := testenv.Pool(t)
	schema := testenv.Schema(t, admin)
	newPartitioned(t, admin, schema, postgres.Options{})
	dropAllPartitions(t, admin, schema)
	role := schema + "_worker"
	run(t, admin, "CREATE ROLE "+pgx.Identifier{role}.Sanitize())
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP OWNED BY "+pgx.Identifier{role}.Sanitize())
		_, _ = admin.Exec(context.Background(), "DROP ROLE "+pgx.Identifier{role}.Sanitize())
	})
	run(t, admin, fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s", pgx.Identifier{schema}.Sanitize(), pgx.Identifier{role}.Sanitize()))
	run(t, admin, fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %s", table(schema, partitionedTable), pgx.Identifier{role}.Sanitize()))
	run(t, admin, fmt.Sprintf("GRANT USAGE ON %s TO %s", pgx.Identifier{schema, partitionedTable + "_token_seq"}.Sanitize(), pgx.Identifier{role}.Sanitize()))
	worker := testenv.Pool(t, func(c *pgxpool.Config) {
		c.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, "SET ROLE "+pgx.Identifier{role}.Sanitize())
			return err
		}
	})
	s, err := postgres.New(worker, postgres.Options{Schema: schema, Table: partitionedTable, Layout: postgres.LayoutPartitioned, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	_, err = s.ClaimLease(t.Context(), store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: time.Minute})
	if err == nil || !strings.Contains(err.Error(), "must own table") || !strings.Contains(err.Error(), "GRANT CREATE ON SCHEMA") {
		t.Fatalf("ClaimLease by a role that may not create partitions = %v; want an error naming the grants", err)
	}
	if n := len(partitionsOf(t, admin, schema)); n != 0 {
		t.Fatalf("%d partitions were created", n)
	}
}

// Migrate of a partitioned table with the DELETE layout refuses, saying
// which layout to set, and so does the first claim of such a store.
func TestPartitionedMigrateRefusesTheDeleteLayout(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	newPartitioned(t, pool, schema, postgres.Options{})
	d, err := postgres.New(pool, postgres.Options{Schema: schema, Table: partitionedTable, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.Migrate(t.Context()); err == nil || !strings.Contains(err.Error(), "LayoutPartitioned") {
		t.Fatalf("Migrate of a partitioned table with the DELETE layout = %v; want a refusal naming the layout", err)
	}
	_, err = d.ClaimLease(t.Context(), store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: time.Minute})
	if err == nil || !strings.Contains(err.Error(), "LayoutPartitioned") {
		t.Fatalf("ClaimLease of the DELETE layout on a partitioned table = %v; want an error naming the layout", err)
	}
	if v, err := d.AppliedVersion(t.Context()); err != nil || v != postgres.SchemaVersion {
		t.Fatalf("AppliedVersion of the partitioned table = %d, %v; want %d", v, err, postgres.SchemaVersion)
	}
}

// Migrate with the partitioned layout converts a table of the DELETE
// layout (from schema version 2, so the missing migration runs first): the
// old table becomes one partition, its records keep deciding (a success
// replays, a released key carries its attempt count on, tokens rise), new
// keys go to new partitions, and the old partition is dropped whole once
// its last row may go, the token sequence surviving it.
func TestPartitionedMigrateConvertsADeleteLayoutTable(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	opts := postgres.Options{Schema: schema, Table: partitionedTable, CleanupInterval: -1}
	old := newStoreAt(t, pool, opts, 2)
	if err := old.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	lease := func(key string) store.LeaseRequest {
		return store.LeaseRequest{Scope: "s", Key: key, LeaseDuration: time.Minute, Retain: time.Hour}
	}
	done, err := old.ClaimLease(t.Context(), lease("done"))
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Complete(t.Context(), done.Claim, store.Completion{Status: store.StatusSucceeded, Result: []byte("r"), TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	retry, err := old.ClaimLease(t.Context(), lease("retry"))
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Release(t.Context(), retry.Claim, store.Completion{Status: store.StatusRetryable, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	paused, err := old.ClaimLease(t.Context(), lease("paused"))
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Release(t.Context(), paused.Claim, store.Completion{Status: store.StatusRetryable, TTL: time.Hour, RetryAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}

	// One-second partitions: a closed partition is read, for its key filter
	// or its drop, a sixtieth of a width after its range ends, and dropped
	// a width after it at the earliest (when every row has aged).
	opts.Layout = postgres.LayoutPartitioned
	s := newStore(t, pool, postgres.WithPartitionWidth(opts, time.Second)) // converts
	if len(partitionsOf(t, pool, schema)) < 2 {
		t.Fatalf("partitions after the conversion: %v; want the old table and the current ones", partitionsOf(t, pool, schema))
	}
	if parts, err := s.Partitions(t.Context()); err != nil || len(parts) == 0 || !parts[0].From.IsZero() || parts[0].Rows != 3 {
		t.Fatalf("Partitions after the conversion = %+v, %v; want first the old table, from the zero time, with its 3 rows", parts, err)
	}
	if res, err := s.ClaimLease(t.Context(), lease("paused")); err != nil || res.Decision != store.DecisionHeld || res.RetryIn <= 59*time.Minute {
		t.Fatalf("ClaimLease of a key held back before the conversion = %+v, %v; want Held for about an hour", res, err)
	}
	if res, err := s.ClaimLease(t.Context(), lease("done")); err != nil || res.Decision != store.DecisionReplay || string(res.Record.Result) != "r" {
		t.Fatalf("ClaimLease of a success stored before the conversion = %+v, %v; want its replay", res, err)
	}
	res, err := s.ClaimLease(t.Context(), lease("retry"))
	if err != nil || res.Decision != store.DecisionExecute || res.Claim.Attempt != 2 || res.Claim.Token <= retry.Claim.Token {
		t.Fatalf("ClaimLease of a key released before the conversion = %+v, %v; want Execute at attempt 2 with a higher token than %d", res, err, retry.Claim.Token)
	}
	fresh, err := s.ClaimLease(t.Context(), lease("new"))
	if err != nil || fresh.Decision != store.DecisionExecute {
		t.Fatalf("ClaimLease of a new key = %+v, %v", fresh, err)
	}
	if rows := rowsOf(t, pool, schema, "s", "new"); len(rows) != 1 || strings.Contains(rows[0], "delete_layout") {
		t.Fatalf("the new key's rows are in %v; want one, in a new partition", rows)
	}

	// Everything in the old partition may go: it is dropped whole (by the
	// first pass a width after the conversion ended its range), and the
	// tokens go on rising.
	run(t, pool, "UPDATE "+table(schema, partitionedTable)+" SET expires_at = now() - interval '1 second', purge_at = now() - interval '1 second', claimed_at = claimed_at - interval '1 day' WHERE key <> 'new'")
	time.Sleep(1100 * time.Millisecond)
	if _, _, err := s.CleanupPass(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, p := range partitionsOf(t, pool, schema) {
		if strings.Contains(p.name, "delete_layout") {
			t.Fatalf("the old table's partition %s is still there", p.name)
		}
	}
	again, err := s.ClaimLease(t.Context(), lease("after"))
	if err != nil || again.Decision != store.DecisionExecute || again.Claim.Token <= fresh.Claim.Token {
		t.Fatalf("ClaimLease after the old partition went = %+v, %v; want Execute with a token above %d", again, err, fresh.Claim.Token)
	}
}

// On a server whose default isolation is repeatable read, where a
// transaction's snapshot is taken by its first statement (before the key's
// lock is granted), claims of one key from 8 connections still execute it
// once, in every mode: the store claims at read committed. The first
// one-transaction claims find the default and begin again, and every claim
// after them names read committed in its BEGIN.
func TestPartitionedClaimsAtReadCommittedWhateverTheDefault(t *testing.T) {
	t.Parallel()
	admin := testenv.Pool(t)
	schema := testenv.Schema(t, admin)
	newPartitioned(t, admin, schema, postgres.Options{})
	begins := &beginCapture{}
	pool := testenv.Pool(t, func(c *pgxpool.Config) {
		c.MaxConns = 8
		c.ConnConfig.Tracer = begins
		c.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, "SET default_transaction_isolation = 'repeatable read'")
			return err
		}
	})
	s, err := postgres.New(pool, postgres.Options{Schema: schema, Table: partitionedTable, Layout: postgres.LayoutPartitioned, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	for round := range 10 {
		for _, mode := range []string{"lease", "tx", "deferred"} {
			key := fmt.Sprintf("%s-%d", mode, round)
			var executed atomic.Int64
			start := make(chan struct{})
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					<-start
					if mode == "lease" {
						res, err := s.ClaimLease(t.Context(), store.LeaseRequest{Scope: "s", Key: key, LeaseDuration: time.Minute})
						if err != nil {
							t.Errorf("ClaimLease: %v", err)
						} else if res.Decision == store.DecisionExecute {
							executed.Add(1)
						}
						return
					}
					// A deferred claim that its commit refuses is claimed
					// again up front, as the stage does.
					for _, deferred := range []bool{mode == "deferred", false} {
						res, err := s.ClaimInTx(t.Context(), store.TxRequest{Scope: "s", Key: key, SuccessTTL: time.Minute, Wait: 5 * time.Second, Deferrable: deferred})
						if err != nil {
							t.Errorf("ClaimInTx: %v", err)
							return
						}
						if res.Decision != store.DecisionExecute {
							return
						}
						time.Sleep(5 * time.Millisecond)
						err = res.Tx.Commit(t.Context(), nil)
						if err == nil {
							executed.Add(1)
							return
						}
						if !deferred || !errors.Is(err, store.ErrLeaseLost) {
							t.Errorf("Commit: %v", err)
							return
						}
					}
				})
			}
			close(start)
			wg.Wait()
			if n := executed.Load(); n != 1 {
				t.Fatalf("%s round %d: %d executions; want 1", mode, round, n)
			}
			if rows := rowsOf(t, admin, schema, "s", key); len(rows) != 1 {
				t.Fatalf("%s round %d: %d rows of the key; want 1", mode, round, len(rows))
			}
		}
	}
	// Every claim now names read committed in its BEGIN, and so does the
	// record of a rolled-back attempt.
	begins.reset()
	claimAndCommit(t, s, "after")
	res, err := s.ClaimInTx(t.Context(), store.TxRequest{Scope: "s", Key: "rolled-back", SuccessTTL: time.Minute, Wait: time.Second})
	if err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("ClaimInTx = %+v, %v; want Execute", res.ClaimResult, err)
	}
	if err := res.Tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordRollback(t.Context(), res.Claim, "", store.Completion{Status: store.StatusRetryable, TTL: time.Minute}); err != nil {
		t.Fatalf("RecordRollback: %v", err)
	}
	const named = "begin isolation level read committed"
	if got := begins.all(); len(got) != 4 || slices.ContainsFunc(got, func(b string) bool { return b != named }) {
		t.Fatalf("the BEGINs of two claims after the first found the default, a third and its RecordRollback: %q; want four of %q", got, named)
	}
}

// claimAndCommit claims key+"-up-front" up front and key+"-deferred"
// deferred, and commits each.
func claimAndCommit(t *testing.T, s *postgres.Store, key string) {
	t.Helper()
	for _, deferred := range []bool{false, true} {
		res, err := s.ClaimInTx(t.Context(), store.TxRequest{Scope: "s", Key: fmt.Sprint(key, "-", deferred), SuccessTTL: time.Minute, Wait: time.Second, Deferrable: deferred})
		if err != nil || res.Decision != store.DecisionExecute {
			t.Fatalf("ClaimInTx = %+v, %v; want Execute", res.ClaimResult, err)
		}
		if err := res.Tx.Commit(t.Context(), nil); err != nil {
			t.Fatalf("Commit: %v", err)
		}
	}
}

// On a server whose default isolation is read committed, a one-transaction
// claim's BEGIN names none: a BEGIN that names one makes the server set,
// and at the commit reset, a setting in every transaction.
func TestPartitionedBeginNamesNoIsolationAtTheDefault(t *testing.T) {
	t.Parallel()
	admin := testenv.Pool(t)
	schema := testenv.Schema(t, admin)
	newPartitioned(t, admin, schema, postgres.Options{})
	begins := &beginCapture{}
	pool := testenv.Pool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = begins })
	s, err := postgres.New(pool, postgres.Options{Schema: schema, Table: partitionedTable, Layout: postgres.LayoutPartitioned, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	claimAndCommit(t, s, "k")
	if got := begins.all(); len(got) != 2 || got[0] != "begin" || got[1] != "begin" {
		t.Fatalf("the BEGINs of two claims: %q; want two of %q", got, "begin")
	}
}

// beginCapture records every BEGIN its pool sends, in a batch or alone.
type beginCapture struct {
	mu     sync.Mutex
	begins []string
}

func (c *beginCapture) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *beginCapture) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.record(d.SQL)
}

func (c *beginCapture) record(sql string) {
	if strings.HasPrefix(sql, "begin") {
		c.mu.Lock()
		c.begins = append(c.begins, sql)
		c.mu.Unlock()
	}
}

func (*beginCapture) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *beginCapture) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.record(d.SQL)
	return ctx
}

func (*beginCapture) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *beginCapture) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.begins = nil
}

func (c *beginCapture) all() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.begins...)
}

// The cleanup lag of the partitioned layout is how long the oldest
// partition has outlived one retention and one width past its range, read
// from the catalog: 0 with only current partitions, the overdue time with
// an old one.
func TestPartitionedCleanupLag(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newPartitioned(t, pool, schema, postgres.Options{Retention: time.Hour}) // 2-minute partitions
	if lag, err := s.CleanupLag(t.Context()); err != nil || lag != 0 {
		t.Fatalf("CleanupLag with current partitions = %v, %v; want 0", lag, err)
	}
	end := dbNow(t, pool).Truncate(time.Hour).Add(-3 * time.Hour)
	addPartition(t, pool, schema, "old", end.Add(-time.Hour), end)
	lag, err := s.CleanupLag(t.Context())
	want := dbNow(t, pool).Sub(end.Add(time.Hour + 2*time.Minute))
	if err != nil || (lag-want).Abs() > time.Minute {
		t.Fatalf("CleanupLag with a partition that ended at %v = %v, %v; want about %v", end, lag, err, want)
	}
}

// Partitions lists the partitions, oldest first, with their rows, the
// converted table's from the zero time; none for the DELETE layout.
func TestPartitionedPartitionsListed(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newPartitioned(t, pool, schema, postgres.Options{})
	for _, key := range []string{"a", "b"} {
		if _, err := s.ClaimLease(t.Context(), store.LeaseRequest{Scope: "s", Key: key, LeaseDuration: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	parts, err := s.Partitions(t.Context())
	if err != nil || len(parts) < 2 {
		t.Fatalf("Partitions = %+v, %v; want the current partition and those ahead", parts, err)
	}
	var rows int64
	now := dbNow(t, pool)
	for i, p := range parts {
		rows += p.Rows
		if !p.From.Before(p.To) || i > 0 && !parts[i-1].To.Equal(p.From) {
			t.Fatalf("partitions out of order or overlapping: %+v", parts)
		}
		if !p.From.After(now) && p.To.After(now) && p.Rows != 2 {
			t.Fatalf("the current partition %s holds %d rows; want 2", p.Name, p.Rows)
		}
	}
	if rows != 2 {
		t.Fatalf("the partitions hold %d rows; want 2", rows)
	}
	d := newStore(t, pool, postgres.Options{Schema: schema})
	if parts, err := d.Partitions(t.Context()); err != nil || len(parts) != 0 {
		t.Fatalf("Partitions of a DELETE-layout table = %+v, %v; want none", parts, err)
	}
}

// The listing reads every form of bound and index a partition may have:
// the layout's own, the MINVALUE bound of a converted table whose unique
// index names the key first, and partitions made by hand with a bound of
// another form or without a unique index on (scope, key), which no claim
// may rely on.
func TestPartitionedListingReadsEveryForm(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newPartitioned(t, pool, schema, postgres.Options{})
	qualified := table(schema, partitionedTable)
	byHand := func(name, bound string, index ...string) {
		part := pgx.Identifier{schema, name}.Sanitize()
		run(t, pool, "CREATE TABLE "+part+" (LIKE "+qualified+" INCLUDING DEFAULTS)")
		for _, ix := range index {
			run(t, pool, "CREATE UNIQUE INDEX ON "+part+" "+ix)
		}
		run(t, pool, "ALTER TABLE "+qualified+" ATTACH PARTITION "+part+" FOR VALUES "+bound)
	}
	byHand("converted", "FROM (MINVALUE) TO ('2000-01-01 00:00:00+00')", "(key, scope)")
	byHand("unbounded", "FROM ('2101-01-01 00:00:00+00') TO (MAXVALUE)", "(scope, key)")
	byHand("partial", "FROM ('2100-01-01 00:00:00+00') TO ('2100-01-02 00:00:00+00')", "(scope, key) WHERE status = 0")
	byHand("other", "FROM ('2100-01-02 00:00:00+00') TO ('2100-01-03 00:00:00+00')", "(scope, token)", "(key)")

	before := dbNow(t, pool)
	parts, err := s.Partitions(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	after := dbNow(t, pool)
	got := map[string]postgres.Partition{}
	for _, p := range parts {
		got[p.Name] = p
	}
	day := func(year int, month time.Month, d int) time.Time {
		return time.Date(year, month, d, 0, 0, 0, 0, time.UTC)
	}
	for _, want := range []postgres.Partition{
		{Name: "converted", To: day(2000, 1, 1)},
		{Name: "partial", From: day(2100, 1, 1), To: day(2100, 1, 2)},
		{Name: "other", From: day(2100, 1, 2), To: day(2100, 1, 3)},
	} {
		if p, ok := got[want.Name]; !ok || !p.From.Equal(want.From) || !p.To.Equal(want.To) {
			t.Errorf("partition %s listed as %+v (listed: %v); want [%v, %v)", want.Name, p, ok, want.From, want.To)
		}
	}
	// A bound of another form reads as from year 1 to now, as the store
	// has always read it: no claim names such a partition.
	if p, ok := got["unbounded"]; !ok || !p.From.IsZero() || p.To.Before(before) || p.To.After(after) {
		t.Errorf("partition unbounded listed as %+v (listed: %v); want from the zero time to now", p, ok)
	}
	own := 0
	for _, p := range parts {
		if strings.HasPrefix(p.Name, partitionedTable+"_p") {
			own++
		}
	}
	if own == 0 || len(parts) != own+4 {
		t.Errorf("listed %d partitions, %d of the store's own; want those and the 4 made by hand: %+v", len(parts), own, parts)
	}
	unkeyed := unkeyedPartitions(t, s)
	slices.Sort(unkeyed)
	if want := []string{"other", "partial"}; !slices.Equal(unkeyed, want) {
		t.Errorf("partitions without a unique index on (scope, key): %v; want %v", unkeyed, want)
	}
}

// A conversion interrupted after its first step (claimed_at added with the
// conversion's time as its default, the range not yet validated) is resumed
// by the next Migrate, at the time it began: the old table's partition ends
// there. Workers of the DELETE layout go on claiming in between.
func TestPartitionedConversionResumes(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	opts := postgres.Options{Schema: schema, Table: partitionedTable}
	old := newStore(t, pool, opts)
	began := dbNow(t, pool).Add(-time.Minute).Truncate(time.Microsecond)
	qualified := table(schema, partitionedTable)
	run(t, pool, fmt.Sprintf("ALTER TABLE %s ADD COLUMN claimed_at timestamptz NOT NULL DEFAULT '%s'", qualified, began.Add(-time.Microsecond).UTC().Format(time.RFC3339Nano)))
	run(t, pool, fmt.Sprintf("ALTER TABLE %s ADD CONSTRAINT %s CHECK (claimed_at < '%s') NOT VALID", qualified,
		pgx.Identifier{partitionedTable + "_claim_range"}.Sanitize(), began.UTC().Format(time.RFC3339Nano)))
	res, err := old.ClaimLease(t.Context(), store.LeaseRequest{Scope: "s", Key: "between", LeaseDuration: time.Minute})
	if err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("ClaimLease of the DELETE layout during the conversion = %+v, %v", res, err)
	}

	opts.Layout = postgres.LayoutPartitioned
	s := newStore(t, pool, opts)
	parts, err := s.Partitions(t.Context())
	if err != nil || len(parts) == 0 || !parts[0].From.IsZero() || !parts[0].To.Equal(began) || parts[0].Rows != 1 {
		t.Fatalf("Partitions = %+v, %v; want first the old table, up to %v, with its row", parts, err, began)
	}
	if res, err := s.ClaimLease(t.Context(), store.LeaseRequest{Scope: "s", Key: "between", LeaseDuration: time.Minute}); err != nil || res.Decision != store.DecisionHeld {
		t.Fatalf("ClaimLease of the key leased during the conversion = %+v, %v; want Held", res, err)
	}
}

// A pass of the cleaner with nothing to do (the partitions reach far
// enough ahead, none may go, every closed one has its filter) reads the
// catalog once, and the names of the key filters once, for the upkeep and
// for loading the filters alike: four statements with the leader's lock
// and its release, where the loading of the filters used to read both
// again (six), and each step of the upkeep the catalog (twelve). A pass
// takes CPU from the claims on the same server.
func TestPartitionedIdlePassStatements(t *testing.T) {
	t.Parallel()
	count, pool, schema, s := newCountedPartitioned(t)
	ctx := t.Context()
	if _, _, err := s.CleanupPass(ctx); err != nil { // prepares what a pass sends
		t.Fatal(err)
	}
	parts := len(partitionsOf(t, pool, schema))
	before := count.load()
	if removed, ran, err := s.CleanupPass(ctx); err != nil || !ran || removed != 0 {
		t.Fatalf("CleanupPass = %d, %v, %v; want 0, true, nil", removed, ran, err)
	}
	if got := count.load().minus(before); got.statements != 4 {
		t.Fatalf("an idle pass sent %+v; want 4 statements (the lock, the list, the filters' names, the unlock)", got)
	}
	if now := len(partitionsOf(t, pool, schema)); now != parts {
		t.Fatalf("an idle pass changed the partitions from %d to %d", parts, now)
	}
}
