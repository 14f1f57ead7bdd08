package postgres_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store/postgres"
)

// BenchmarkPartitionDrop: on the partitioned layout a retention period
// dropped costs what a DROP of its partition costs (issue 46). Each of 3
// rounds fills a partition of 200,000 rows (1,000 with -short) that a pass
// has built the key filter of while its rows lived, as the cleaner does
// once a partition's range ends, and a same-size partition of a second
// partitioned table of the same shape; once their rows have expired it
// times the cleaner's pass that drops the first (CleanupPass) and, by hand,
// ALTER TABLE … DETACH PARTITION … CONCURRENTLY then DROP TABLE of the
// second: the fair reference, since a DROP TABLE of an attached partition
// locks the whole table and waits for every transaction on it, which the
// pass must not. Beyond the drop, the pass takes the leader's advisory
// lock, lists the partitions and the key filters (one round trip), marks
// the partition with a comment, and deletes its filter with the DROP; it
// does not read the partition: the filter's read gave when its rows may
// all go, and their count (retireClosed). The order alternates over the
// rounds, each drop after the same pause. It
// reports the medians drop-ms (the pass), plain-drop-ms (the reference)
// and drop/plain (the median of the rounds' ratios; goal ≤ 1.5); the log
// gives each statement of the timed passes with its mean time.
//
//	go test -run='^$' -bench=PartitionDrop -benchtime=1x ./store/postgres
func BenchmarkPartitionDrop(b *testing.B) {
	const refTable = "records_ref"
	rows, margin := 200_000, 10*time.Second // margin: the rows live while both fill and the filter's pass runs
	// idle comes before each timed drop, so that each starts on connections
	// and a server left alone as long: the first after a pause paid about
	// a millisecond a round trip more (a pool's ping, a backend woken), and
	// in two rounds of three the pass came first.
	const idle = time.Second
	if testing.Short() {
		rows, margin = 1000, 500*time.Millisecond
	}
	admin := testenv.Pool(b)
	for range b.N {
		stmts := &passStatements{start: time.Now()}
		pool := testenv.Pool(b, func(c *pgxpool.Config) { c.ConnConfig.Tracer = stmts })
		schema := testenv.Schema(b, admin)
		s := newPartitioned(b, pool, schema, postgres.Options{})
		newStore(b, admin, postgres.Options{Schema: schema, Table: refTable, Layout: postgres.LayoutPartitioned, Retention: partitionedRetention})
		base := dbNow(b, admin).Truncate(time.Hour).Add(-6 * time.Hour)
		var pass, plain []time.Duration
		for round := range 3 {
			lower := base.Add(-time.Duration(round) * time.Hour)
			name, ref := fmt.Sprintf("drop_%d", round), fmt.Sprintf("ref_%d", round)
			goes := dbNow(b, admin).Add(margin)
			fillPartition(b, admin, schema, partitionedTable, name, "s", lower, rows, goes)
			fillPartition(b, admin, schema, refTable, ref, "s", lower, rows, goes)
			if _, _, err := s.CleanupPass(b.Context()); err != nil {
				b.Fatal(err)
			}
			if s.KeyFilters() == 0 || !slices.ContainsFunc(partitionsOf(b, admin, schema), func(p part) bool { return p.name == name }) {
				b.Fatalf("round %d: the first pass built no key filter or dropped the partition: its rows expired before it ran (margin %v)", round, margin)
			}
			if wait := goes.Sub(dbNow(b, admin)); wait > 0 {
				time.Sleep(wait + 10*time.Millisecond)
			}
			timePass := func() {
				time.Sleep(idle)
				start := time.Now()
				removed, ran, err := s.CleanupPass(withPassMark(b.Context()))
				pass = append(pass, time.Since(start))
				if err != nil || !ran || removed != rows {
					b.Fatalf("round %d: pass = %d rows, ran %v, %v; want the partition's %d rows dropped", round, removed, ran, err, rows)
				}
			}
			timePlain := func() {
				time.Sleep(idle)
				start := time.Now()
				run(b, admin, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s CONCURRENTLY", table(schema, refTable), pgx.Identifier{schema, ref}.Sanitize()))
				run(b, admin, "DROP TABLE "+pgx.Identifier{schema, ref}.Sanitize())
				plain = append(plain, time.Since(start))
			}
			if round%2 == 0 {
				timePass()
				timePlain()
			} else {
				timePlain()
				timePass()
			}
		}
		b.ReportMetric(msOf(medianDuration(pass)), "drop-ms")
		b.ReportMetric(msOf(medianDuration(plain)), "plain-drop-ms")
		b.ReportMetric(1/medianRatio(pass, plain), "drop/plain")
		b.Logf("%d rows a partition: passes %v, DETACH CONCURRENTLY + DROP %v; the passes' statements: %s", rows, pass, plain, stmts.byStatement(nil))
	}
}

// medianDuration is the median of ds (of an odd count).
func medianDuration(ds []time.Duration) time.Duration {
	s := slices.Sorted(slices.Values(ds))
	return s[len(s)/2]
}
