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
// with one cleanup pass while 4 handlers run ClaimLease+Complete, and reports how
// long the removal took and the ClaimLease latency p99 before and during it, at
// the default CleanupDuty (0.5) and without rest (1), for two layouts of the
// expired rows. Goals: within 10 s, and the p99 at most doubles. It also
// reports the size of a record (docs/operations.md, Sizing). Run it once:
//
//	go test -run='^$' -bench=Cleanup1M -benchtime=1x -timeout=30m ./store/postgres
//
// With -short (scripts/test) it inserts cleanupRowsShort rows and measures
// the latency before for a moment only: a check that it runs, not a figure.
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
	cleanupRows      = 1_000_000
	cleanupRowsShort = 5_000
)

func benchCleanup(b *testing.B, duty float64, expiry string) {
	rows, baseline := cleanupRows, 5*time.Second
	if testing.Short() {
		rows, baseline = cleanupRowsShort, 300*time.Millisecond
	}
	pool := testenv.Pool(b, func(c *pgxpool.Config) { c.MaxConns = 16 })
	schema := testenv.Schema(b, pool)
	s := newStore(b, pool, postgres.Options{Schema: schema, CleanupDuty: duty})
	ctx := b.Context()
	for range b.N {
		b.StopTimer()
		// Rows that expired over the last day, as if cleanup had been off.
		// purge_at = expires_at and a message UUID, as a claim writes them.
		_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s
			(scope, key, fingerprint, status, token, attempt, result, created_at, updated_at, expires_at, purge_at, message_uuid)
			SELECT 'old', md5(i::text), 'fp', 2, nextval('%s'), 1, '\x0102030405060708'::bytea,
				now() - interval '2 days', now() - interval '2 days', e, e, md5(i::text)::uuid::text
			FROM generate_series(1, %d) i, LATERAL (SELECT %s AS e) x`,
			table(schema, ""), schema+"."+postgres.DefaultTable+"_token_seq", rows, fmt.Sprintf(expiry, rows)))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+table(schema, "")); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
			b.Fatal(err)
		}
		// Sizing (docs/operations.md): bytes per record, heap and indexes.
		var heap, total int64
		if err := pool.QueryRow(ctx, "SELECT pg_table_size($1), pg_total_relation_size($1)", schema+"."+postgres.DefaultTable).Scan(&heap, &total); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(total)/float64(rows), "bytes/row")
		b.Logf("size of %d records: heap %d MB, indexes %d MB, %.0f bytes per record in all", rows, heap>>20, (total-heap)>>20, float64(total)/float64(rows))

		before := beginLatencies(b, s, 4, baseline, nil)

		stop := make(chan struct{})
		during := make(chan []time.Duration, 1)
		go func() { during <- beginLatencies(b, s, 4, time.Hour, stop) }()
		time.Sleep(500 * time.Millisecond) // the load is running
		b.StartTimer()
		start := time.Now()
		removed, ran, err := s.CleanupPass(ctx)
		took := time.Since(start)
		b.StopTimer()
		close(stop)
		lat := <-during
		if err != nil || !ran || removed < rows {
			b.Fatalf("CleanupPass = %d, %v, %v; want %d removed", removed, ran, err, rows)
		}
		p99b, p99d := percentile(before, 0.99), percentile(lat, 0.99)
		b.ReportMetric(took.Seconds(), "cleanup-s")
		b.ReportMetric(float64(removed)/took.Seconds(), "rows/s")
		b.ReportMetric(float64(p99b.Microseconds())/1000, "p99-before-ms")
		b.ReportMetric(float64(p99d.Microseconds())/1000, "p99-during-ms")
		b.ReportMetric(float64(p99d)/float64(p99b), "p99-ratio")
		b.Logf("removed %d rows in %v (%.0f rows/s); ClaimLease p50 %v → %v, p99 %v → %v (%d and %d samples)",
			removed, took.Round(time.Millisecond), float64(removed)/took.Seconds(),
			percentile(before, 0.5), percentile(lat, 0.5), p99b, p99d, len(before), len(lat))
	}
}

// beginLatencies runs ClaimLease+Complete of unique keys on n goroutines until d
// passes or stop closes, and returns the latency of every ClaimLease.
func beginLatencies(b *testing.B, s *postgres.Store, n int, d time.Duration, stop <-chan struct{}) []time.Duration {
	ctx := b.Context()
	prefix := rand.Text()[:8]
	end := time.Now().Add(d)
	var (
		mu  sync.Mutex
		all []time.Duration
		wg  sync.WaitGroup
		seq atomic.Int64
	)
	for range n {
		wg.Go(func() {
			var mine []time.Duration
			defer func() {
				mu.Lock()
				all = append(all, mine...)
				mu.Unlock()
			}()
			for time.Now().Before(end) {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "live", Key: fmt.Sprintf("%s-%d", prefix, seq.Add(1)), LeaseDuration: time.Minute})
				mine = append(mine, time.Since(t0))
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
	wg.Wait()
	return all
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}
