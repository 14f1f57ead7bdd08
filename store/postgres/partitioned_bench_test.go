package postgres_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// The partitioned layout over several retentions (issue 26, "Flat as it
// grows" and "No bloat"): a retention of minutes, with partitions of
// seconds (WithPartitionWidth, 24 to the retention as partitionWidth gives
// in production), so that a run sees tables fill from empty and then turn
// over, partitions dropped and rows deleted, in a few minutes.

// turnover is the shape of a run of these benchmarks.
type turnover struct {
	retention time.Duration // Options.Retention, and the messages' SuccessTTL and FailureTTL
	width     time.Duration // the partition width
	every     time.Duration // the cleaner's interval
	length    time.Duration // BenchmarkPartitionedFlatAsItGrows: each layout's run
	handlers  int
	rate      int // BenchmarkPartitionedNoBloat: messages a second to each layout
	pacedRate int // BenchmarkPartitionedFlatAsItGrows: messages a second in its paced runs
}

func turnoverConfig() turnover {
	if testing.Short() {
		// Every step in seconds: the tables fill, the first rows expire at
		// 4 s, a partition goes at about 6 s.
		return turnover{retention: 4 * time.Second, width: time.Second, every: time.Second, length: 10 * time.Second, handlers: 4, rate: 100, pacedRate: 1000}
	}
	return turnover{retention: 2 * time.Minute, width: 5 * time.Second, every: 2 * time.Second, length: 4 * time.Minute, handlers: 4, rate: 250, pacedRate: 1000}
}

// turnoverStore is a migrated store of layout in schema, with partitions
// of cfg.width, the background cleaner every `every` (negative: off).
func turnoverStore(b *testing.B, pool *pgxpool.Pool, schema, tbl string, layout postgres.Layout, cfg turnover, every time.Duration) *postgres.Store {
	opts := postgres.Options{Schema: schema, Table: tbl, Layout: layout, Retention: cfg.retention, CleanupInterval: every}
	if layout == postgres.LayoutPartitioned {
		opts = postgres.WithPartitionWidth(opts, cfg.width)
	}
	return newStore(b, pool, opts)
}

// turnoverHandler is the one-transaction mode on ts around one business
// insert into ledger (a new table in schema), every outcome kept for the
// retention: a record's purge time is its claim plus the retention (and
// the claim's 1% slack). The ledger has no index: it only grows, a
// million rows in a run, and an index on its random keys would slow the
// handler as it grew, on either layout alike, where these benchmarks
// measure the records table's growth and turnover.
func turnoverHandler(b *testing.B, pool *pgxpool.Pool, ts store.Transactional, schema, ledger string, retention time.Duration) func(key string) error {
	qualified := pgx.Identifier{schema, ledger}.Sanitize()
	if _, err := pool.Exec(b.Context(), "CREATE TABLE "+qualified+" (key text NOT NULL, amount int NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	r, err := receiver.NewTransactional(ts).WithScope("bench").
		WithPolicy(policy.Policy{SuccessTTL: retention, FailureTTL: retention}).Build()
	if err != nil {
		b.Fatal(err)
	}
	insert := "INSERT INTO " + qualified + " (key, amount) VALUES ($1, 100)"
	h := r.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := postgres.TxFromContext(msg.Context())
		_, err := tx.Exec(msg.Context(), insert, msg.UUID)
		return nil, err
	})
	payload := []byte(`{"amount":100}`)
	return func(key string) error {
		_, err := h(message.NewMessage(key, payload))
		return err
	}
}

// childrenOf is the names of the partitions of schema.tbl, from the
// catalog: none for a plain table.
func childrenOf(b *testing.B, pool *pgxpool.Pool, schema, tbl string) map[string]bool {
	names := texts(b, pool, `SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = to_regclass($1)`, table(schema, tbl))
	out := make(map[string]bool, len(names))
	for _, n := range names {
		out[n] = true
	}
	return out
}

// vacuumer does what autovacuum does, at the time scale of these
// benchmarks, until the benchmark ends: every `every`, it VACUUMs each
// table of schema and of pg_catalog whose dead rows, or rows inserted
// since its last vacuum, pass autovacuum's default thresholds (50 + 20% of
// its rows, 1,000 + 20%), and ANALYZEs each whose changed rows pass 50 +
// 10% (vacuumRound). The server's own autovacuum wakes every
// autovacuum_naptime (1 minute by default), two naps in a retention of 2
// minutes where a day's retention has 1,440, and may be off, as on the
// machines these benchmarks run on: left to it, the DELETE layout's table
// would never reuse the space of its deleted rows, no partition would have
// statistics, and the system catalogs, which every partition created and
// dropped, and every test's DDL, leaves dead rows in, would grow without
// end, and every read of the catalog (the partition listing first) with
// them. A table that is gone by the time its turn comes (a partition
// dropped) is skipped.
// Its first round comes after first, then one every `every`. stop ends it,
// waits, and returns the rounds that vacuumed or analyzed a table, as
// spans from start.
func vacuumer(b *testing.B, pool *pgxpool.Pool, schema string, start time.Time, first, every time.Duration) (stop func() []span) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var rounds []span
	go func() {
		defer close(done)
		select {
		case <-ctx.Done():
			return
		case <-time.After(first - every):
		}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			from := time.Since(start)
			did, err := vacuumRound(ctx, pool, schema)
			if err != nil {
				if ctx.Err() == nil {
					b.Error(err)
				}
				return
			}
			if did {
				rounds = append(rounds, span{from, time.Since(start)})
			}
		}
	}()
	return sync.OnceValue(func() []span { cancel(); <-done; return rounds })
}

// vacuumRound VACUUMs (with ANALYZE) each table of schema and of
// pg_catalog past autovacuum's default thresholds for dead or inserted
// rows, and ANALYZEs each past its threshold for changed rows, as
// vacuumer's rounds do, and reports whether it did either to any table.
func vacuumRound(ctx context.Context, pool *pgxpool.Pool, schema string) (bool, error) {
	rows, err := pool.Query(ctx, `SELECT format('%I.%I', schemaname, relname),
			n_dead_tup > 50 + 0.2 * n_live_tup OR n_ins_since_vacuum > 1000 + 0.2 * n_live_tup,
			n_mod_since_analyze > 50 + 0.1 * n_live_tup
		FROM pg_stat_all_tables WHERE schemaname IN ($1, 'pg_catalog')`, schema)
	if err != nil {
		return false, err
	}
	type due struct {
		name            string
		vacuum, analyze bool
	}
	tables, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (due, error) {
		var d due
		return d, r.Scan(&d.name, &d.vacuum, &d.analyze)
	})
	if err != nil {
		return false, err
	}
	did := false
	for _, d := range tables {
		var q string
		switch {
		case d.vacuum:
			q = "VACUUM (ANALYZE) " + d.name
		case d.analyze:
			q = "ANALYZE " + d.name
		default:
			continue
		}
		if _, err := pool.Exec(ctx, q); err != nil && !isUndefinedTable(err) {
			return did, err
		}
		did = true
	}
	return did, nil
}

// isUndefinedTable reports whether err is PostgreSQL's undefined_table.
func isUndefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}

// BenchmarkPartitionedFlatAsItGrows runs the one-transaction mode (a
// handler inserting one business row through its transaction) as fast as
// it goes on 4 handlers, from an empty table for two retentions (the first
// row expires at one retention, its partition goes about two cleaner
// intervals and a width later), on the partitioned layout and then, in the
// same run, on the DELETE layout; then both again with the 4 handlers
// paced to a fixed rate (pacedRate, about a third of what they reach here
// as fast as they go). The cleaner's passes are run here, one every
// interval through CleanupPass (the background cleaner's own pass, its
// lock included), with the background cleaner off, so that each pass is
// timed, with the rows it removed and the partitions it dropped (read from
// the catalog before and after), and vacuum runs as autovacuum would at
// this time scale (vacuumer), halfway between the passes. It reports, per
// layout:
//
//   - last-q/first-q: msgs/s of the last quarter of the run over the first
//     (goal ≥ 0.95): the table grows from empty to a retention and then
//     turns over;
//   - p99-drop/p99: the p99 of the claim's latency (ClaimInTx: BEGIN, the
//     key's lock and the claim, one round trip for a new key; not the
//     handler's insert or the COMMIT) among the claims that overlap a pass
//     that dropped a partition, over the p99 among the claims that overlap
//     a quiet window (goal ≤ 1.3): each such pass's span a quarter of an
//     interval later, where no pass and no vacuum runs. The same shape and
//     the same rule on both sides, since a claim overlaps a window with a
//     chance that grows with its own length. A pass is timed whole: the
//     partitions it creates and the reading of the old ones count with its
//     drop. The log gives the old ratio too, over the claims that overlap
//     no pass;
//   - paced-p99-drop/p99: the same in the paced run;
//   - msgs/s over the run, partitions-dropped, and the p99s in ms with the
//     number of claims behind the drop's (drop-claims).
//
// The log gives every run's figures, and each statement the passes sent
// (passStatements) with its count, its mean time and the p99 of the claims
// that overlap it.
//
// The DELETE layout's figures carry the prefix delete-, its cleanup pass
// (DELETE batches) in place of the drop: delete-p99-cleanup/p99. A run in
// which no partition is dropped, the cleaner removes no row, or no claim
// overlaps a quiet window, fails: it did not measure what it is for.
//
// Run it once (about 17 minutes; retention 2 minutes, partitions of 5 s, a
// pass every 2 s, 4 minutes per run):
//
//	go test -run='^$' -bench=PartitionedFlatAsItGrows -benchtime=1x -timeout=40m ./store/postgres
//
// With -short (scripts/test) the retention is 4 s, partitions 1 s, a pass
// every second, 10 s per run: every step, at least one drop, no figure.
func BenchmarkPartitionedFlatAsItGrows(b *testing.B) {
	cfg := turnoverConfig()
	for range b.N {
		type run struct {
			name string // the layout, and "paced" for a run at pacedRate
			s    growSummary
			g    *growth
		}
		var runs []run
		for _, rate := range []int{0, cfg.pacedRate} {
			for _, layout := range []struct {
				name   string
				layout postgres.Layout
			}{{"partitioned", postgres.LayoutPartitioned}, {"delete", postgres.LayoutDelete}} {
				g := growRun(b, layout.layout, cfg, rate)
				r := run{name: layout.name, s: g.summary(cfg.length, cfg.every), g: g}
				if rate > 0 {
					r.name += " paced"
				}
				switch {
				case layout.layout == postgres.LayoutPartitioned && r.s.dropped < 1:
					b.Fatalf("%s: no partition was dropped in %v of traffic (%d passes): the run did not exercise the drop", r.name, cfg.length, len(g.passes))
				case r.s.removed < 1:
					b.Fatalf("%s: the cleaner removed no row in %v of traffic (%d passes): the run did not exercise the cleanup", r.name, cfg.length, len(g.passes))
				case r.s.quietClaims < 1:
					b.Fatalf("%s: no claim overlapped a quiet window (%d windows): the run has nothing to compare the passes with", r.name, r.s.quietWindows)
				}
				runs = append(runs, r)
			}
		}
		part, del, partPaced, delPaced := runs[0].s, runs[1].s, runs[2].s, runs[3].s
		b.ReportMetric(part.lastOverFirst, "last-q/first-q")
		b.ReportMetric(part.p99Drop.Seconds()/part.p99Quiet.Seconds(), "p99-drop/p99")
		b.ReportMetric(part.rate, "msgs/s")
		b.ReportMetric(float64(part.dropped), "partitions-dropped")
		b.ReportMetric(msOf(part.p99Quiet), "p99-ms")
		b.ReportMetric(msOf(part.p99Drop), "p99-drop-ms")
		b.ReportMetric(float64(part.dropClaims), "drop-claims")
		b.ReportMetric(partPaced.p99Drop.Seconds()/partPaced.p99Quiet.Seconds(), "paced-p99-drop/p99")
		b.ReportMetric(del.lastOverFirst, "delete-last-q/first-q")
		b.ReportMetric(del.p99Drop.Seconds()/del.p99Quiet.Seconds(), "delete-p99-cleanup/p99")
		b.ReportMetric(del.rate, "delete-msgs/s")
		b.ReportMetric(msOf(del.p99Quiet), "delete-p99-ms")
		b.ReportMetric(msOf(del.p99Drop), "delete-p99-cleanup-ms")
		b.ReportMetric(delPaced.p99Drop.Seconds()/delPaced.p99Quiet.Seconds(), "delete-paced-p99-cleanup/p99")
		for i, r := range runs {
			b.Logf("%s: %.0f msgs/s over %v (first quarter %.0f, last %.0f: %.3f); claim p99 %v over %d passes that removed rows (%d claims), %v over %d quiet windows of the same shape (%d claims): %.3f; p99 %v outside passes (%d claims, p50 %v): %.3f; p99 %v over the other %d passes; %d rows removed, %d partitions dropped, longest removing pass %v",
				r.name, r.s.rate, cfg.length, r.s.first, r.s.last, r.s.lastOverFirst,
				r.s.p99Drop, r.s.dropPasses, r.s.dropClaims, r.s.p99Quiet, r.s.quietWindows, r.s.quietClaims, r.s.p99Drop.Seconds()/r.s.p99Quiet.Seconds(),
				r.s.p99, r.s.outsideClaims, r.s.p50, r.s.p99Drop.Seconds()/r.s.p99.Seconds(), r.s.p99Pass, r.s.otherPasses,
				r.s.removed, r.s.dropped, r.s.longestDrop.Round(time.Millisecond))
			eighths := ""
			if i < 2 {
				eighths = fmt.Sprintf("msgs/s by eighth of the run %.0f, partitions %v; ", r.s.eighths, r.s.partsAt)
			}
			b.Logf("%s: %sthe passes' statements: %s", r.name, eighths, r.g.statements)
		}
	}
}

// overlaps reports whether c overlaps one of ps.
func overlaps(c span, ps []span) bool {
	for _, p := range ps {
		if c.from <= p.to && c.to >= p.from {
			return true
		}
	}
	return false
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// timedClaims is the store as the receiver sees it, timing every ClaimInTx.
type timedClaims struct {
	store.Transactional
	start time.Time
	mu    sync.Mutex
	taken []span
}

// span is an interval of a run, from its start.
type span struct{ from, to time.Duration }

func (t *timedClaims) ClaimInTx(ctx context.Context, req store.TxRequest) (store.TxResult, error) {
	from := time.Since(t.start)
	res, err := t.Transactional.ClaimInTx(ctx, req)
	to := time.Since(t.start)
	t.mu.Lock()
	t.taken = append(t.taken, span{from, to})
	t.mu.Unlock()
	return res, err
}

// cleanupPassSpan is one timed pass of the cleaner.
type cleanupPassSpan struct {
	span
	removed, dropped int
	parts            int // partitions before it
}

// growth is what one layout's run recorded.
type growth struct {
	claims  []span
	done    []time.Duration // when each message was handled
	passes  []cleanupPassSpan
	vacuums []span // the vacuumer's rounds
	// the passes' statements, with the p99 of the claims that overlap
	// each (passStatements.byStatement)
	statements string
}

// growRun is one layout's run of BenchmarkPartitionedFlatAsItGrows, in a
// schema of its own on a pool of its own.
func growRun(b *testing.B, layout postgres.Layout, cfg turnover, rate int) *growth {
	ctx := b.Context()
	stmts := &passStatements{}
	pool := testenv.Pool(b, func(c *pgxpool.Config) {
		c.MaxConns = int32(cfg.handlers) + 2 // and the pass's two
		c.ConnConfig.Tracer = stmts
	})
	schema := testenv.Schema(b, pool)
	st := turnoverStore(b, pool, schema, "records", layout, cfg, -1)
	timed := &timedClaims{Transactional: st}
	handle := turnoverHandler(b, pool, timed, schema, "ledger", cfg.retention)
	if _, _, err := st.CleanupPass(ctx); err != nil { // the partitions for now
		b.Fatal(err)
	}
	warm(b, pool, cfg.handlers)
	// The catalogs as autovacuum would keep them, whatever ran before.
	if _, err := vacuumRound(ctx, pool, schema); err != nil {
		b.Fatal(err)
	}

	g := &growth{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	stop := make(chan struct{})
	stopHandlers := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopHandlers()
	start := time.Now()
	timed.start, stmts.start = start, start
	var slot atomic.Int64 // with a rate: the next message's place in it
	for range cfg.handlers {
		wg.Go(func() {
			var mine []time.Duration
			defer func() {
				mu.Lock()
				g.done = append(g.done, mine...)
				mu.Unlock()
			}()
			for {
				if rate > 0 { // wait for the message's place in the rate
					t := time.NewTimer(time.Until(start.Add(time.Duration(slot.Add(1)-1) * time.Second / time.Duration(rate))))
					select {
					case <-stop:
						t.Stop()
						return
					case <-t.C:
					}
				} else {
					select {
					case <-stop:
						return
					default:
					}
				}
				if err := handle(rand.Text()); err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, time.Since(start))
			}
		})
	}
	tick := time.NewTicker(cfg.every)
	defer tick.Stop()
	// Vacuum halfway between the passes: autovacuum keeps no step with the
	// cleaner, and a vacuum on every pass's tick would count against it.
	stopVacuum := vacuumer(b, testenv.Pool(b), schema, start, cfg.every+cfg.every/2, cfg.every)
	defer stopVacuum()
	end := time.NewTimer(cfg.length)
	defer end.Stop()
	for running := true; running; {
		select {
		case <-end.C:
			running = false
			continue
		case <-tick.C:
		}
		before := childrenOf(b, pool, schema, "records")
		p := cleanupPassSpan{span: span{from: time.Since(start)}}
		removed, ran, err := st.CleanupPass(withPassMark(ctx))
		p.to = time.Since(start)
		if err != nil || !ran {
			b.Fatalf("CleanupPass = %d, %v, %v", removed, ran, err)
		}
		p.removed, p.parts = removed, len(before)
		after := childrenOf(b, pool, schema, "records")
		for name := range before {
			if !after[name] {
				p.dropped++
			}
		}
		g.passes = append(g.passes, p)
	}
	stopHandlers()
	g.vacuums = stopVacuum()
	if b.Failed() {
		b.FailNow()
	}
	timed.mu.Lock()
	g.claims = timed.taken
	timed.mu.Unlock()
	g.statements = stmts.byStatement(g.claims)
	return g
}

// growSummary is a layout's figures.
type growSummary struct {
	rate, first, last, lastOverFirst float64
	p50, p99, p99Drop, p99Pass       time.Duration
	p99Quiet                         time.Duration // over the quiet windows
	outsideClaims, dropClaims        int
	quietClaims, quietWindows        int
	dropPasses, otherPasses          int
	removed, dropped                 int
	longestDrop                      time.Duration
	// msgs/s in each eighth of the run, and the most partitions a pass
	// found in it.
	eighths []float64
	partsAt []int
}

// summary sorts the claims by the passes they overlap: one that removed
// rows or dropped a partition, another, or none.
func (g *growth) summary(length, every time.Duration) growSummary {
	var s growSummary
	q := length / 4
	var first, last int
	for _, d := range g.done {
		switch {
		case d < q:
			first++
		case d >= length-q && d < length:
			last++
		}
		if d < length {
			s.rate++
		}
	}
	s.rate /= length.Seconds()
	eighth := length / 8
	s.eighths = make([]float64, 8)
	s.partsAt = make([]int, 8)
	for _, d := range g.done {
		if i := int(d / eighth); i < 8 {
			s.eighths[i]++
		}
	}
	for i := range s.eighths {
		s.eighths[i] /= eighth.Seconds()
	}
	for _, p := range g.passes {
		if i := int(p.from / eighth); i < 8 {
			s.partsAt[i] = max(s.partsAt[i], p.parts)
		}
	}
	s.first, s.last = float64(first)/q.Seconds(), float64(last)/q.Seconds()
	s.lastOverFirst = s.last / s.first
	var drops, others []span
	for _, p := range g.passes {
		s.removed += p.removed
		s.dropped += p.dropped
		if p.removed > 0 || p.dropped > 0 {
			drops = append(drops, p.span)
			s.longestDrop = max(s.longestDrop, p.to-p.from)
		} else {
			others = append(others, p.span)
		}
	}
	s.dropPasses, s.otherPasses = len(drops), len(others)
	// A claim overlaps a window with a chance that grows with its own
	// length, so the claims that overlap a pass of a few milliseconds are
	// weighted towards the slow ones even when the pass slows none. The
	// quiet windows are each removing pass's span a quarter interval later,
	// where neither a pass nor a vacuum runs: the same shape, the same rule,
	// nothing running.
	busy := append(append(append([]span(nil), drops...), others...), g.vacuums...)
	var quiet []span
	for _, d := range drops {
		q := span{d.from + every/4, d.to + every/4}
		if q.to < length && !overlaps(q, busy) {
			quiet = append(quiet, q)
		}
	}
	var outside, inDrop, inPass, inQuiet []time.Duration
	for _, c := range g.claims {
		took := c.to - c.from
		if overlaps(c, quiet) {
			inQuiet = append(inQuiet, took)
		}
		switch {
		case overlaps(c, drops):
			inDrop = append(inDrop, took)
		case overlaps(c, others):
			inPass = append(inPass, took)
		default:
			outside = append(outside, took)
		}
	}
	s.outsideClaims, s.dropClaims, s.quietClaims, s.quietWindows = len(outside), len(inDrop), len(inQuiet), len(quiet)
	s.p50, s.p99 = percentile(outside, 0.5), percentile(outside, 0.99)
	s.p99Drop, s.p99Pass, s.p99Quiet = percentile(inDrop, 0.99), percentile(inPass, 0.99), percentile(inQuiet, 0.99)
	return s
}

// BenchmarkPartitionedNoBloat runs three retentions of steady traffic, a
// fixed rate of messages a second (paced: the same keys, at the same
// moments, to both), through the one-transaction mode on the partitioned
// layout and on the DELETE layout side by side, each store's background
// cleaner running every 2 s, and compares the size of each table then
// with its size when it held one retention's live rows.
//
// A table's bytes are pg_total_relation_size (heap, indexes, TOAST) summed
// over pg_partition_tree: every partition of the partitioned table (the
// empty ones created ahead included), the DELETE layout's table with its
// indexes. One period's live rows are the table's bytes one retention
// after the first message: the table then holds exactly the rows of that
// retention, none of them expired (a row goes at its claim plus the
// retention and 1%), in the pages a table that never deleted fills. It
// reports
//
//   - partitioned-bytes/live (goal ≤ 1.1) and delete-bytes/live: the
//     bytes after three retentions over those bytes. What a layout keeps
//     past a retention counts against it: the partitioned layout keeps a
//     partition until its newest row has gone (up to a width and a pass
//     more), the DELETE layout the space of deleted rows that vacuum has
//     not made reusable;
//   - partitioned-rows/live and delete-rows/live: the same for the row
//     counts, to tell rows from bloat;
//   - partitioned-live-MB and delete-live-MB, the bytes of one retention's
//     live rows; partitioned-MB and delete-MB, the bytes at the end; and
//     partitioned-msgs/s and delete-msgs/s, the rate each layout kept up
//     with (messages handled over the run).
//
// The DELETE layout's figure depends on vacuum, which the benchmark runs as
// autovacuum would at this time scale (vacuumer): it reuses the space of
// deleted rows once a vacuum has passed, which autovacuum's thresholds put
// off until about a fifth of the rows are dead. The partitioned layout's
// figure owes nothing to vacuum.
//
// A run in which no partition is dropped, or the DELETE layout's cleaner
// removes no row, fails: it did not measure what it is for. Run it once
// (about 7 minutes; retention 2 minutes, partitions of 5 s, 250 msgs/s to
// each layout):
//
//	go test -run='^$' -bench=PartitionedNoBloat -benchtime=1x -timeout=30m ./store/postgres
//
// With -short (scripts/test) the retention is 4 s, partitions 1 s, 100
// msgs/s: every step, at least one drop, no figure.
func BenchmarkPartitionedNoBloat(b *testing.B) {
	cfg := turnoverConfig()
	for range b.N {
		noBloat(b, cfg)
	}
}

// bloatLayout is one layout's side of BenchmarkPartitionedNoBloat.
type bloatLayout struct {
	name    string
	tbl     string
	handle  func(string) error
	keys    chan string
	handled int
	sizes   []int64 // bytes after each retention
	rows    []int64 // rows after each retention
	parts   []map[string]bool
}

func noBloat(b *testing.B, cfg turnover) {
	ctx := b.Context()
	const periods = 3
	admin := testenv.Pool(b)
	schema := testenv.Schema(b, admin)
	total := cfg.rate * int(periods*cfg.retention/time.Second)
	sides := []*bloatLayout{
		{name: "partitioned", tbl: "records_partitioned"},
		{name: "delete", tbl: "records_delete"},
	}
	for i, side := range sides {
		pool := testenv.Pool(b, func(c *pgxpool.Config) { c.MaxConns = int32(cfg.handlers) + 2 })
		layout := postgres.LayoutPartitioned
		if i == 1 {
			layout = postgres.LayoutDelete
		}
		st := turnoverStore(b, pool, schema, side.tbl, layout, cfg, cfg.every)
		side.handle = turnoverHandler(b, pool, st, schema, side.tbl+"_ledger", cfg.retention)
		side.keys = make(chan string, total) // never full: a layout that falls behind queues
		warm(b, pool, cfg.handlers)
	}
	var settings []string
	for _, name := range []string{"autovacuum", "autovacuum_naptime", "autovacuum_vacuum_scale_factor", "autovacuum_vacuum_threshold", "autovacuum_vacuum_cost_delay"} {
		var v string
		if err := admin.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			b.Fatal(err)
		}
		settings = append(settings, name+"="+v)
	}

	defer vacuumer(b, testenv.Pool(b), schema, time.Now(), cfg.every, cfg.every)()

	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, side := range sides {
		for range cfg.handlers {
			wg.Go(func() {
				n := 0
				defer func() {
					mu.Lock()
					side.handled += n
					mu.Unlock()
				}()
				for key := range side.keys {
					if err := side.handle(key); err != nil {
						b.Error(err)
						return
					}
					n++
				}
			})
		}
	}
	// The pacer: by each moment, rate messages a second since the start,
	// the same key to both layouts.
	start := time.Now()
	paced := make(chan struct{})
	pacerCtx, stopPacer := context.WithCancel(ctx)
	stop := sync.OnceFunc(func() {
		stopPacer()
		<-paced
		for _, side := range sides {
			close(side.keys)
		}
		wg.Wait()
	})
	defer stop()
	go func() {
		defer close(paced)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for sent := 0; sent < total; {
			select {
			case <-pacerCtx.Done():
				return
			case <-tick.C:
			}
			due := min(int(time.Since(start).Seconds()*float64(cfg.rate)), total)
			for ; sent < due; sent++ {
				key := rand.Text()
				for _, side := range sides {
					side.keys <- key
				}
			}
		}
	}()

	measure := func() {
		for _, side := range sides {
			var bytes, rows int64
			// pg_partition_tree has no row for a plain table.
			if err := admin.QueryRow(ctx, `SELECT coalesce((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree($1)),
				pg_total_relation_size($1))::int8`, table(schema, side.tbl)).Scan(&bytes); err != nil {
				b.Fatal(err)
			}
			if err := admin.QueryRow(ctx, "SELECT count(*) FROM "+table(schema, side.tbl)).Scan(&rows); err != nil {
				b.Fatal(err)
			}
			side.sizes = append(side.sizes, bytes)
			side.rows = append(side.rows, rows)
			side.parts = append(side.parts, childrenOf(b, admin, schema, side.tbl))
		}
	}
	for period := 1; period <= periods; period++ {
		t := time.NewTimer(time.Until(start.Add(time.Duration(period) * cfg.retention)))
		select {
		case <-ctx.Done():
			t.Stop()
			b.Fatal(ctx.Err())
		case <-t.C:
		}
		measure()
	}
	elapsed := time.Since(start)
	<-paced // all sent: the last was due at the end
	stop()
	if b.Failed() {
		b.FailNow()
	}

	part, del := sides[0], sides[1]
	dropped := 0
	for name := range part.parts[0] {
		if !part.parts[periods-1][name] {
			dropped++
		}
	}
	if dropped < 1 {
		b.Fatalf("no partition of those at the end of the first retention was dropped by the end of the third: the run did not exercise the drop")
	}
	if del.rows[periods-1] >= int64(del.handled) {
		b.Fatalf("the DELETE layout's table holds %d rows of %d handled: its cleaner removed none", del.rows[periods-1], del.handled)
	}
	ratio := func(xs []int64) float64 { return float64(xs[periods-1]) / float64(xs[0]) }
	mb := func(n int64) float64 { return float64(n) / (1 << 20) }
	b.ReportMetric(ratio(part.sizes), "partitioned-bytes/live")
	b.ReportMetric(ratio(del.sizes), "delete-bytes/live")
	b.ReportMetric(ratio(part.rows), "partitioned-rows/live")
	b.ReportMetric(ratio(del.rows), "delete-rows/live")
	b.ReportMetric(mb(part.sizes[0]), "partitioned-live-MB")
	b.ReportMetric(mb(del.sizes[0]), "delete-live-MB")
	b.ReportMetric(mb(part.sizes[periods-1]), "partitioned-MB")
	b.ReportMetric(mb(del.sizes[periods-1]), "delete-MB")
	b.ReportMetric(float64(part.handled)/elapsed.Seconds(), "partitioned-msgs/s")
	b.ReportMetric(float64(del.handled)/elapsed.Seconds(), "delete-msgs/s")
	for _, side := range sides {
		b.Logf("%s: %d of %d messages handled at %d msgs/s over %v; after each retention %v bytes, %v rows, %d partitions",
			side.name, side.handled, total, cfg.rate, elapsed.Round(time.Second), side.sizes, side.rows, len(side.parts[periods-1]))
	}
	b.Logf("%d partitions dropped since the end of the first retention; %v", dropped, settings)
}
