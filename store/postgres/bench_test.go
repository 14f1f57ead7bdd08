package postgres_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// BenchmarkBeginComplete measures unique messages per second through the
// lease mode's ClaimLease and Complete (two statements per message), at 1, 4, 16
// and 64 concurrent handlers on a pool of at most 16 connections
// (docs/benchmarks.md).
//
//	go test -run='^$' -bench='BeginComplete/durable/handlers=(1|4|16)$' -benchtime=5s ./store/postgres
func BenchmarkBeginComplete(b *testing.B) {
	for _, mode := range []struct {
		name string
		opts postgres.Options
	}{
		{"durable", postgres.Options{}},
		{"async-begin", postgres.Options{AsyncBegin: true}},
	} {
		for _, handlers := range []int{1, 4, 16, 64} {
			b.Run(fmt.Sprintf("%s/handlers=%d", mode.name, handlers), func(b *testing.B) {
				pool := testenv.Pool(b, func(c *pgxpool.Config) { c.MaxConns = 16 })
				s := newStore(b, pool, mode.opts)
				runHandlers(b, handlers, func(ctx context.Context, key string) error {
					res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "bench", Key: key, Fingerprint: "fp", LeaseDuration: time.Minute,
						MessageUUID: "0192f3a4-5b6c-7d8e-9f01-23456789abcd"})
					if err != nil {
						return err
					}
					if res.Decision != store.DecisionExecute {
						return fmt.Errorf("decision %v for a unique key", res.Decision)
					}
					return s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, Result: []byte("ok"), TTL: time.Hour})
				})
			})
		}
	}
}

// runHandlers spreads b.N messages with unique random keys (like message
// UUIDs: every insert lands on a random page of the primary key, as
// pgbench's random keys do) over n goroutines and reports msgs/s.
func runHandlers(b *testing.B, n int, handle func(ctx context.Context, key string) error) {
	ctx := b.Context()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Bool
	b.ResetTimer()
	for range n {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := handle(ctx, rand.Text()); err != nil {
					b.Error(err)
					failed.Store(true)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if failed.Load() {
		b.FailNow()
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkCleanup1M inserts 1,000,000 expired records, then removes them
// with one cleanup pass while 4 handlers run ClaimLease+Complete, and
// reports how long the removal took (cleanup-s) and the ClaimLease p99
// during it over the p99 in quiet windows interleaved with it (p99-ratio):
// the pass is held between two batches for cleanupQuiet after every
// cleanupQuietEvery of cleaning, and the load runs on through it all. It
// does the same for 10,000 records first (cleanup-10k-ms), at the default
// CleanupDuty (0.5) and without rest (1), for two layouts of the expired
// rows. Goals: 1M within 10 s, 10k within 100 ms, and a p99-ratio of at
// most 2. Beside them: the cleaner's server CPU per row (its own
// backends), the WAL written per row (the load's included), and the size
// of a record (docs/operations.md, Sizing). Run it once:
//
//	go test -run='^$' -bench=Cleanup1M -benchtime=1x -timeout=30m ./store/postgres
//
// With -short (scripts/test) it inserts cleanupRowsShort and
// cleanupSmallShort rows and holds short quiet windows: a check that it
// runs, not a figure.
func BenchmarkCleanup1M(b *testing.B) {
	// How the expired rows lie in the table: "ordered" as they do after
	// normal operation (a row expires TTL after it was written, so expiry
	// follows the physical order), "scattered" as a worst case (expiries
	// spread over a day at random positions: every batch touches as many
	// pages as rows).
	layouts := map[string]string{
		"ordered":   "now() - ((%[1]d - i) * interval '50 milliseconds') - interval '1 second'",
		"scattered": "now() - mod(i::bigint * 7919 + 0 * %[1]d, 86400) * interval '1 second' - interval '1 second'",
	}
	for _, layout := range []string{"ordered", "scattered"} {
		for _, duty := range []float64{0.5, 1} {
			b.Run(fmt.Sprintf("%s/duty=%v", layout, duty), func(b *testing.B) { benchCleanup(b, duty, layouts[layout]) })
		}
	}
}

const (
	cleanupRows       = 1_000_000
	cleanupSmall      = 10_000
	cleanupRowsShort  = 5_000
	cleanupSmallShort = 1_000
	cleanupQuiet      = 500 * time.Millisecond
	cleanupQuietEvery = time.Second
)

func benchCleanup(b *testing.B, duty float64, expiry string) {
	rows, small, quiet := cleanupRows, cleanupSmall, cleanupQuiet
	if testing.Short() {
		rows, small, quiet = cleanupRowsShort, cleanupSmallShort, 50*time.Millisecond
	}
	pool := testenv.Pool(b, func(c *pgxpool.Config) { c.MaxConns = 16 })
	schema := testenv.Schema(b, pool)
	s := newStore(b, pool, postgres.Options{Schema: schema, CleanupDuty: duty})
	// The cleaner is a store of its own on a pool of its own, whose
	// backends' CPU is the cleanup's.
	cleanerPool, meter := meteredPool(b, 2)
	w := &cleanupWindows{every: cleanupQuietEvery, quiet: quiet}
	c := newStore(b, cleanerPool, postgres.WithBetweenBatches(postgres.Options{Schema: schema, CleanupDuty: duty}, w.between))
	ctx := b.Context()
	// expire inserts n rows that expired over the last day, as if cleanup
	// had been off: purge_at = expires_at and a message UUID, as a claim
	// writes them; then leaves them vacuumed, analyzed and checkpointed.
	expire := func(n int) {
		_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s
			(scope, key, fingerprint, status, token, attempt, result, created_at, updated_at, expires_at, purge_at, message_uuid)
			SELECT 'old', md5(%d || '-' || i), 'fp', 2, nextval('%s'), 1, '\x0102030405060708'::bytea,
				now() - interval '2 days', now() - interval '2 days', e, e, md5(i::text)::uuid::text
			FROM generate_series(1, %d) i, LATERAL (SELECT %s AS e) x`,
			table(schema, ""), n, schema+"."+postgres.DefaultTable+"_token_seq", n, fmt.Sprintf(expiry, n)))
		if err != nil {
			b.Fatal(err)
		}
		for _, q := range []string{"VACUUM ANALYZE " + table(schema, ""), "CHECKPOINT"} {
			if _, err := pool.Exec(ctx, q); err != nil {
				b.Fatal(err)
			}
		}
	}
	// pass removes the n rows expire left while the load runs, quiet
	// windows before and after it, and returns how long it cleaned
	// (without the quiet windows it was held in), what the cleaner's
	// backends and the WAL spent, and the latencies.
	pass := func(n int) (took time.Duration, spent meterSpent, wal int64, lat cleanupLatencies) {
		stop := claimLoad(b, s, 4, w)
		time.Sleep(quiet)
		var lsn0 string
		if err := pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn0); err != nil {
			b.Fatal(err)
		}
		before := meter.read(b)
		b.StartTimer()
		w.start()
		removed, ran, err := c.CleanupPass(ctx)
		took = w.stop()
		b.StopTimer()
		spent = spent.plus(before, meter.read(b))
		if err := pool.QueryRow(ctx, "SELECT pg_current_wal_lsn() - $1::pg_lsn", lsn0).Scan(&wal); err != nil {
			b.Fatal(err)
		}
		time.Sleep(quiet)
		lat = stop()
		if err != nil || !ran || removed < n {
			b.Fatalf("CleanupPass = %d, %v, %v; want %d removed", removed, ran, err, n)
		}
		return took, spent, wal, lat
	}
	// The cleaner has run before, as it does every CleanupInterval: its
	// connection has the batch prepared.
	if _, _, err := c.CleanupPass(ctx); err != nil {
		b.Fatal(err)
	}
	for range b.N {
		b.StopTimer()
		expire(small)
		took10k, _, _, _ := pass(small)

		expire(rows)
		// Sizing (docs/operations.md): bytes per record, heap and indexes.
		var heap, total int64
		if err := pool.QueryRow(ctx, "SELECT pg_table_size($1), pg_total_relation_size($1)", schema+"."+postgres.DefaultTable).Scan(&heap, &total); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(total)/float64(rows+small), "bytes/row")
		b.Logf("size of %d records: heap %d MB, indexes %d MB, %.0f bytes per record in all", rows+small, heap>>20, (total-heap)>>20, float64(total)/float64(rows+small))

		took, spent, wal, lat := pass(rows)
		p99q, p99d := percentile(lat.quiet, 0.99), percentile(lat.during, 0.99)
		b.ReportMetric(took.Seconds(), "cleanup-s")
		b.ReportMetric(float64(took10k.Microseconds())/1000, "cleanup-10k-ms")
		b.ReportMetric(float64(rows)/took.Seconds(), "rows/s")
		b.ReportMetric(float64(spent.server.Nanoseconds())/1e3/float64(rows), "server-µs/row")
		b.ReportMetric(float64(wal)/float64(rows), "wal-bytes/row")
		b.ReportMetric(float64(p99q.Microseconds())/1000, "p99-quiet-ms")
		b.ReportMetric(float64(p99d.Microseconds())/1000, "p99-during-ms")
		b.ReportMetric(float64(p99d)/float64(p99q), "p99-ratio")
		b.Logf("removed %d rows in %v (%.0f rows/s), %d in %v; ClaimLease p50 %v quiet, %v during; p99 %v, %v (%d and %d samples)",
			rows, took.Round(time.Millisecond), float64(rows)/took.Seconds(), small, took10k.Round(time.Millisecond),
			percentile(lat.quiet, 0.5), percentile(lat.during, 0.5), p99q, p99d, len(lat.quiet), len(lat.during))
	}
}

// cleanupWindows alternates a cleanup pass with quiet windows: the pass's
// hook between two batches (between) holds it for quiet once it has
// cleaned for every since it last rested so. A claim is quiet when the
// pass was held, or not running, from its start to its end.
type cleanupWindows struct {
	every, quiet time.Duration
	// gen counts the changes between cleaning and quiet; it is odd while
	// the pass cleans.
	gen atomic.Int64
	// since and held belong to the pass's goroutine: when its current
	// cleaning window began, and how long it was held in all.
	since, began time.Time
	held         time.Duration
}

func (w *cleanupWindows) start() {
	w.began, w.since, w.held = time.Now(), time.Now(), 0
	w.gen.Add(1)
}

func (w *cleanupWindows) between() {
	if time.Since(w.since) < w.every {
		return
	}
	t := time.Now()
	w.gen.Add(1)
	time.Sleep(w.quiet)
	w.gen.Add(1)
	w.since = time.Now()
	w.held += w.since.Sub(t)
}

// stop ends the pass and returns how long it cleaned.
func (w *cleanupWindows) stop() time.Duration {
	w.gen.Add(1)
	return time.Since(w.began) - w.held
}

// cleanupLatencies are ClaimLease latencies in quiet windows and the rest.
type cleanupLatencies struct{ quiet, during []time.Duration }

// claimLoad runs ClaimLease+Complete of unique keys on n goroutines until
// stop is called, and stop returns the latency of every ClaimLease, by
// the windows of w it ran in.
func claimLoad(b *testing.B, s *postgres.Store, n int, w *cleanupWindows) (stop func() cleanupLatencies) {
	ctx := b.Context()
	prefix := rand.Text()[:8]
	var (
		mu   sync.Mutex
		all  cleanupLatencies
		wg   sync.WaitGroup
		seq  atomic.Int64
		done atomic.Bool
	)
	for range n {
		wg.Go(func() {
			var mine cleanupLatencies
			defer func() {
				mu.Lock()
				all.quiet = append(all.quiet, mine.quiet...)
				all.during = append(all.during, mine.during...)
				mu.Unlock()
			}()
			for !done.Load() {
				g, t0 := w.gen.Load(), time.Now()
				res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "live", Key: fmt.Sprintf("%s-%d", prefix, seq.Add(1)), LeaseDuration: time.Minute})
				d := time.Since(t0)
				if g%2 == 0 && w.gen.Load() == g {
					mine.quiet = append(mine.quiet, d)
				} else {
					mine.during = append(mine.during, d)
				}
				if err != nil {
					b.Error(err)
					return
				}
				if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	return func() cleanupLatencies {
		done.Store(true)
		wg.Wait()
		return all
	}
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}
