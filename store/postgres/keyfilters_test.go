package postgres_test

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// The key filters of closed partitions: a claim of a key that a closed
// partition holds still finds it (a replay, not a second execution), a new
// key is looked up in the open partitions only, and a dropped partition's
// filter goes with it.
func TestPartitionedKeyFilters(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newPartitioned(t, pool, schema, postgres.Options{})
	ctx := t.Context()
	now := dbNow(t, pool)
	// Three closed partitions: two with a live success, one whose every
	// row may go.
	lower := now.Truncate(time.Hour).Add(-4 * time.Hour)
	for i, name := range []string{"closed_live", "closed_dead", "closed_kept"} {
		addPartition(t, pool, schema, name, lower.Add(time.Duration(i)*time.Hour), lower.Add(time.Duration(i+1)*time.Hour))
	}
	insertOld(t, pool, schema, "s", "kept", store.StatusSucceeded, 1, lower.Add(time.Minute), true)
	insertOld(t, pool, schema, "s", "gone", store.StatusSucceeded, 1, lower.Add(time.Hour+time.Minute), false)
	insertOld(t, pool, schema, "s", "kept-2", store.StatusSucceeded, 1, lower.Add(2*time.Hour+time.Minute), true)
	// The store's own partitions start at now; the gap before them is not
	// a partition.
	if s.ClaimLooksEverywhere("s", "new-1") != true {
		t.Fatal("before any filter is loaded a new key must be looked up everywhere")
	}
	if got := passAndLoad(t, s, s); got != 2 { // the pass drops closed_dead, builds the others' filters
		t.Fatalf("%d key filters loaded; want 2 (closed_live, closed_kept)", got)
	}
	var stored []string
	rows, err := pool.Query(ctx, "SELECT partition FROM "+table(schema, partitionedTable+"_key_filters")+" ORDER BY lower_bound")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		stored = append(stored, n)
	}
	if fmt.Sprint(stored) != "[closed_live closed_kept]" {
		t.Fatalf("stored filters %v; want those of closed_live and closed_kept (closed_dead was dropped)", stored)
	}
	for _, key := range []string{"kept", "kept-2"} {
		if !s.ClaimLooksEverywhere("s", key) {
			t.Fatalf("no filter holds %s", key)
		}
	}
	fast := 0
	for i := range 1000 {
		if !s.ClaimLooksEverywhere("s", fmt.Sprintf("new-%d", i)) {
			fast++
		}
	}
	if fast < 950 { // 0.1% false positives per filter
		t.Fatalf("%d of 1000 new keys looked up in the open partitions only; want nearly all", fast)
	}
	res, err := s.ClaimInTx(ctx, store.TxRequest{Scope: "s", Key: "kept", SuccessTTL: time.Hour, Wait: time.Second})
	if err != nil || res.Decision != store.DecisionReplay {
		t.Fatalf("ClaimInTx(kept) = %+v, %v; want a replay of the success in closed_live", res.ClaimResult, err)
	}
	lres, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "kept-2", LeaseDuration: time.Minute})
	if err != nil || lres.Decision != store.DecisionReplay {
		t.Fatalf("ClaimLease(kept-2) = %+v, %v; want a replay of the success in closed_kept", lres, err)
	}
	lres, err = s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "new-lease", LeaseDuration: time.Minute})
	if err != nil || lres.Decision != store.DecisionExecute {
		t.Fatalf("ClaimLease(new-lease) = %+v, %v; want Execute", lres, err)
	}
	if lres, err = s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "new-lease", LeaseDuration: time.Minute}); err != nil || lres.Decision != store.DecisionHeld {
		t.Fatalf("ClaimLease(new-lease) again = %+v, %v; want Held", lres, err)
	}
	res, err = s.ClaimInTx(ctx, store.TxRequest{Scope: "s", Key: "new-0", SuccessTTL: time.Hour, Wait: time.Second})
	if err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("ClaimInTx(new-0) = %+v, %v; want Execute", res.ClaimResult, err)
	}
	if err := res.Tx.Commit(ctx, nil); err != nil {
		t.Fatal(err)
	}
	res, err = s.ClaimInTx(ctx, store.TxRequest{Scope: "s", Key: "new-0", SuccessTTL: time.Hour, Wait: time.Second})
	if err != nil || res.Decision != store.DecisionReplay {
		t.Fatalf("ClaimInTx(new-0) again = %+v, %v; want a replay", res.ClaimResult, err)
	}

	// The closed partitions' rows expire: the next pass drops them and
	// their filters, and the next refresh forgets them.
	run(t, pool, "UPDATE "+table(schema, partitionedTable)+" SET expires_at = now() - interval '1 second', purge_at = now() - interval '1 second' WHERE key IN ('kept', 'kept-2')")
	s2 := newPartitioned(t, pool, schema, postgres.Options{}) // the first remembers when kept was due
	if got := passAndLoad(t, s2, s); got != 0 {
		// The store's own partitions are not closed yet.
		t.Fatalf("%d key filters loaded after the drops; want 0", got)
	}
}

// The cleaner's leader publishes the filters its pass built, and loads
// them from the pass's own read of the catalog: its claims use a filter
// as soon as the pass that built it ends, and the pass reads the catalog
// once and no filter back.
func TestPartitionedLeaderUsesWhatItsPassBuilt(t *testing.T) {
	t.Parallel()
	stmts, pool, schema, s := newTracedPartitioned(t)
	now := dbNow(t, pool)
	lower := now.Truncate(time.Hour).Add(-2 * time.Hour)
	addPartition(t, pool, schema, "closed", lower, lower.Add(time.Hour))
	insertOld(t, pool, schema, "s", "kept", store.StatusSucceeded, 1, lower.Add(time.Minute), true)
	if _, _, err := s.CleanupPass(withPassMark(t.Context())); err != nil {
		t.Fatal(err)
	}
	if s.KeyFilters() != 1 || !s.ClaimLooksEverywhere("s", "kept") {
		t.Fatalf("after the pass that built it, the leader consults %d key filters, holding kept: %v; want closed's, which holds it", s.KeyFilters(), s.ClaimLooksEverywhere("s", "kept"))
	}
	if n := stmts.taken(); n[listStatement] != 1 || n["filter: load"] != 0 || n["filter: keys"] != 1 || n["count(*)"] != 0 || n["live rows"] != 0 {
		t.Fatalf("the pass sent %v; want the partitions listed once, closed's keys read once (no count(*), no read of its live rows apart), and no filter read back", n)
	}
}

// A closed partition is read once in its life, for its key filter, which
// read gives the time its last row may go too; when that time has come it
// is dropped unread. A leader that did not make that read (a restart, a
// change of leader) reads it once more, without its keys.
func TestPartitionedClosedPartitionReadForItsFilterAndDroppedUnread(t *testing.T) {
	t.Parallel()
	stmts, pool, schema, s := newTracedPartitioned(t)
	lower := dbNow(t, pool).Truncate(time.Hour).Add(-2 * time.Hour)
	addPartition(t, pool, schema, "closed", lower, lower.Add(time.Hour))
	insertOld(t, pool, schema, "s", "kept", store.StatusSucceeded, 1, lower.Add(time.Minute), true)
	run(t, pool, "UPDATE "+table(schema, partitionedTable)+" SET expires_at = now() + interval '8 seconds' WHERE key = 'kept'")
	pass := func(s *postgres.Store) int {
		t.Helper()
		removed, ran, err := s.CleanupPass(withPassMark(t.Context()))
		if err != nil || !ran {
			t.Fatalf("CleanupPass = ran %v, %v", ran, err)
		}
		return removed
	}
	if removed := pass(s); removed != 0 || s.KeyFilters() != 1 {
		t.Fatalf("first pass: %d rows removed, %d key filters; want none removed while kept lives, and closed's filter", removed, s.KeyFilters())
	}
	if n := stmts.taken(); n["filter: keys"] != 1 || n["live rows"] != 0 || n["filter: store"] != 1 {
		t.Fatalf("the first pass sent %v; want closed's keys read once, with no read of its live rows apart, and its filter stored", n)
	}
	pass(s)
	if n := stmts.taken(); n["filter: keys"]+n["live rows"] != 0 {
		t.Fatalf("a pass before kept expired sent %v; want no read of closed", n)
	}
	// A worker that starts now and leads reads closed once, for when it
	// may go, and not again.
	restarted := newPartitioned(t, pool, schema, postgres.Options{})
	if removed := pass(restarted); removed != 0 {
		t.Fatalf("the restarted leader's pass removed %d rows; want none while kept lives", removed)
	}
	pass(restarted)
	if n := stmts.taken(); n["filter: keys"] != 0 || n["live rows"] != 1 || n[dropStatement] != 0 {
		t.Fatalf("the restarted leader's two passes sent %v; want closed read once, without its keys, and kept", n)
	}
	var untilExpired time.Duration // by the server's clock
	if err := pool.QueryRow(t.Context(), "SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1e6)::int8 * 1000 FROM "+table(schema, partitionedTable)+" WHERE key = 'kept'").Scan(&untilExpired); err != nil {
		t.Fatal(err)
	}
	time.Sleep(untilExpired + 50*time.Millisecond)
	if removed := pass(s); removed != 1 {
		t.Fatalf("the pass after kept expired removed %d rows; want closed's 1", removed)
	}
	if n := stmts.taken(); n["filter: keys"] != 0 || n["live rows"] != 0 || n["count(*)"] != 0 || n[dropStatement] != 1 {
		t.Fatalf("the pass after kept expired sent %v; want closed dropped unread, with its filter, in one round trip", n)
	}
	if got := texts(t, pool, "SELECT partition FROM "+table(schema, partitionedTable+"_key_filters")); len(got) != 0 || s.KeyFilters() != 0 {
		t.Fatalf("key filters stored %v, loaded %d after closed was dropped; want none", got, s.KeyFilters())
	}
	if removed := pass(restarted); removed != 0 {
		t.Fatalf("the other worker's pass after the drop removed %d rows; want none", removed)
	}
}

// A closed partition whose rows may all go by the read for its key filter
// is dropped in that pass, and no filter of it is stored.
func TestPartitionedDeadPartitionGoesWithoutAFilter(t *testing.T) {
	t.Parallel()
	stmts, pool, schema, s := newTracedPartitioned(t)
	lower := dbNow(t, pool).Truncate(time.Hour).Add(-3 * time.Hour)
	addPartition(t, pool, schema, "dead", lower, lower.Add(time.Hour))
	insertOld(t, pool, schema, "s", "a", store.StatusSucceeded, 1, lower.Add(time.Minute), false)
	insertOld(t, pool, schema, "s", "b", store.StatusCachedFailure, 1, lower.Add(2*time.Minute), false)
	removed, _, err := s.CleanupPass(withPassMark(t.Context()))
	if err != nil || removed != 2 {
		t.Fatalf("CleanupPass = %d, %v; want dead's 2 rows removed", removed, err)
	}
	if n := stmts.taken(); n["filter: keys"] != 1 || n["live rows"] != 0 || n["filter: store"] != 0 || n[dropStatement] != 1 {
		t.Fatalf("the pass sent %v; want dead read once, dropped, and no filter of it stored", n)
	}
	if got := texts(t, pool, "SELECT partition FROM "+table(schema, partitionedTable+"_key_filters")); len(got) != 0 || s.KeyFilters() != 0 {
		t.Fatalf("key filters stored %v, loaded %d; want none", got, s.KeyFilters())
	}
	for _, p := range partitionsOf(t, pool, schema) {
		if p.name == "dead" {
			t.Fatal("dead is still a partition")
		}
	}
}

// Claims from 8 connections of keys whose successes live in a closed
// partition, while its key filter is built and loaded: every claim
// replays, none executes.
func TestPartitionedKeyFiltersUnderConcurrentClaims(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newPartitioned(t, pool, schema, postgres.Options{})
	ctx := t.Context()
	now := dbNow(t, pool)
	lower := now.Truncate(time.Hour).Add(-3 * time.Hour)
	addPartition(t, pool, schema, "holder", lower.Add(time.Hour), lower.Add(2*time.Hour))
	for i := range 200 {
		insertOld(t, pool, schema, "s", fmt.Sprintf("old-%d", i), store.StatusSucceeded, 1, lower.Add(time.Hour+time.Duration(i)*time.Second), true)
	}
	var executed, replayed atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for c := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("old-%d", (i*8+c)%200)
				res, err := s.ClaimInTx(ctx, store.TxRequest{Scope: "s", Key: key, SuccessTTL: time.Hour, Wait: 5 * time.Second})
				if err != nil {
					t.Error(err)
					return
				}
				switch res.Decision {
				case store.DecisionExecute:
					executed.Add(1)
					_ = res.Tx.Rollback(ctx)
				case store.DecisionReplay:
					replayed.Add(1)
				}
			}
		})
	}
	for range 5 {
		if _, _, err := s.CleanupPass(ctx); err != nil {
			t.Error(err)
		}
		if err := s.RefreshKeyFilters(ctx); err != nil {
			t.Error(err)
		}
	}
	testenv.WaitFor(t, 30*time.Second, "claims after the filters loaded", func() bool { return replayed.Load() > 400 })
	close(stop)
	wg.Wait()
	if s.KeyFilters() != 1 {
		t.Fatalf("%d key filters; want holder's", s.KeyFilters())
	}
	if n := executed.Load(); n != 0 {
		t.Fatalf("%d claims executed a key whose success lives in a filtered partition; want every one to replay", n)
	}
}

// Migration 8 drops the key filters stored in the earlier encoding (the
// store refuses to decode them, saying why), and the cleaner's leader's
// next pass builds them anew: the key of a closed partition is looked up
// everywhere again, a new key in the open partitions only.
func TestMigrationRebuildsKeyFilters(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newStoreAt(t, pool, postgres.Options{Schema: schema, Table: partitionedTable, Layout: postgres.LayoutPartitioned}, 7)
	ctx := t.Context()
	lower := dbNow(t, pool).Truncate(time.Hour).Add(-2 * time.Hour)
	addPartition(t, pool, schema, "closed", lower, lower.Add(time.Hour))
	insertOld(t, pool, schema, "s", "old", store.StatusSucceeded, 1, lower.Add(time.Minute), true)
	filters := table(schema, partitionedTable+"_key_filters")
	run(t, pool, "INSERT INTO "+filters+" (partition, lower_bound, upper_bound, keys, filter) VALUES ('closed', $1, $2, 1, '\\x0000000000000001'::bytea)",
		lower, lower.Add(time.Hour))
	if err := s.RefreshKeyFilters(ctx); err == nil || !strings.Contains(err.Error(), "decoding the key filter of closed") {
		t.Fatalf("loading a filter of the earlier encoding: %v; want it refused", err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if got := texts(t, pool, "SELECT partition FROM "+filters); len(got) != 0 {
		t.Fatalf("filters after migration 8: %v; want none", got)
	}
	if got := passAndLoad(t, s, s); got != 1 {
		t.Fatalf("%d key filters after the pass; want closed's", got)
	}
	if !s.ClaimLooksEverywhere("s", "old") || s.ClaimLooksEverywhere("s", "new") {
		t.Fatal("the rebuilt filter does not hold the closed partition's key, or holds a new one")
	}
}

// passAndLoad runs a cleanup pass of pass (whose leader builds and drops
// key filters), then loads the filters into load as its cleaner does, and
// returns how many load's claims consult.
func passAndLoad(t *testing.T, pass, load *postgres.Store) int {
	t.Helper()
	if _, _, err := pass.CleanupPass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := load.RefreshKeyFilters(t.Context()); err != nil {
		t.Fatal(err)
	}
	return load.KeyFilters()
}

// A closed partition larger than one chunk of its read is read a chunk at
// a time, and the read misses no row: its filter holds the keys of the
// first page and of the last, and its drop counts every row.
func TestPartitionedClosedPartitionReadInChunks(t *testing.T) {
	t.Parallel()
	stmts, pool, schema, s := newTracedPartitioned(t)
	lower := dbNow(t, pool).Truncate(time.Hour).Add(-3 * time.Hour)
	addPartition(t, pool, schema, "big", lower, lower.Add(time.Hour))
	const dead = 6000 // about 100 pages: several chunks
	run(t, pool, `INSERT INTO `+table(schema, partitionedTable)+` (scope, key, status, token, attempt,
		created_at, updated_at, expires_at, purge_at, claimed_at)
		SELECT 's', 'k' || i, 2, i, 1, $1, $1, now() - interval '1 hour', now() - interval '1 hour', $1
		FROM generate_series(1, `+fmt.Sprint(dead)+`) i`, lower.Add(time.Minute))
	insertOld(t, pool, schema, "s", "kept", store.StatusSucceeded, 1, lower.Add(2*time.Minute), true) // in the last page
	if removed, _, err := s.CleanupPass(withPassMark(t.Context())); err != nil || removed != 0 {
		t.Fatalf("CleanupPass = %d, %v; want nothing removed while kept lives", removed, err)
	}
	if n := stmts.taken(); n["filter: keys"] < 3 {
		t.Fatalf("the pass sent %v; want big's keys read in several chunks", n)
	}
	for _, key := range []string{"k1", "k" + fmt.Sprint(dead), "kept"} {
		if !s.ClaimLooksEverywhere("s", key) {
			t.Fatalf("big's filter does not hold %s", key)
		}
	}
	run(t, pool, "UPDATE "+table(schema, partitionedTable)+" SET expires_at = now() - interval '1 second' WHERE key = 'kept'")
	s2 := newPartitioned(t, pool, schema, postgres.Options{}) // the first remembers when kept was due
	if removed, _, err := s2.CleanupPass(withPassMark(t.Context())); err != nil || removed != dead+1 {
		t.Fatalf("CleanupPass = %d, %v; want big's %d rows removed", removed, err, dead+1)
	}
	if n := stmts.taken(); n["live rows"] < 3 || n[dropStatement] != 1 {
		t.Fatalf("the pass sent %v; want big read in several chunks and dropped", n)
	}
}

// newTracedPartitioned is newPartitioned on a pool of its own whose
// statements sent under withPassMark stmts labels (passStatements.taken).
//
// It starts the store at least tracedTestSpan before the end of its
// partition of now (waiting for the next one if need be), so that no
// partition of the store's own closes while a test counts its passes'
// statements: one that did would be read for its key filter too.
func newTracedPartitioned(t *testing.T) (stmts *passStatements, pool *pgxpool.Pool, schema string, s *postgres.Store) {
	stmts = &passStatements{start: time.Now()}
	pool = testenv.Pool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = stmts })
	schema = testenv.Schema(t, pool)
	const tracedTestSpan = 40 * time.Second
	width := postgres.PartitionWidth(partitionedRetention)
	now := dbNow(t, pool)
	if left := now.Truncate(width).Add(width).Sub(now); left < tracedTestSpan {
		time.Sleep(left + 100*time.Millisecond)
	}
	return stmts, pool, schema, newPartitioned(t, pool, schema, postgres.Options{})
}
