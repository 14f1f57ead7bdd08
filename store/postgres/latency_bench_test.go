package postgres_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// BenchmarkClaimLatency measures the claim's latency at a steady pace, the
// seed's targets: the claim of a new key (miss) under 1 ms at p99, the claim
// that finds a finished key (hit, a replay) under 0.5 ms. Four handlers
// send claimLatencyRate messages a second between them, nothing else runs,
// and each handler alternates a new key (claimed, timed, then completed)
// with a duplicate of a key it finished before (claimed, timed, replayed).
// In the lease mode the claim is ClaimLease; in the one-transaction mode it
// is ClaimInTx decided up front (BEGIN and the claim; the commit that
// follows a miss is not timed). b.N is the messages of each mode: at the
// pace, 30,000 take a minute.
//
//	go test -run='^$' -bench=ClaimLatency -benchtime=30000x ./store/postgres
func BenchmarkClaimLatency(b *testing.B) {
	const handlers = 4
	pool := testenv.Pool(b, func(c *pgxpool.Config) { c.MaxConns = handlers })
	s := newStore(b, pool, postgres.Options{})
	modes := []struct {
		name string
		// claim claims key, times the claim alone, and finishes what it
		// began; it returns the decision and the claim's latency.
		claim func(ctx context.Context, key string) (store.Decision, time.Duration, error)
	}{
		{"lease", func(ctx context.Context, key string) (store.Decision, time.Duration, error) {
			start := time.Now()
			res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "latency", Key: key, LeaseDuration: time.Minute})
			took := time.Since(start)
			if err == nil && res.Decision == store.DecisionExecute {
				err = s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour})
			}
			return res.Decision, took, err
		}},
		{"one-transaction", func(ctx context.Context, key string) (store.Decision, time.Duration, error) {
			start := time.Now()
			res, err := s.ClaimInTx(ctx, store.TxRequest{Scope: "latency-tx", Key: key, SuccessTTL: time.Hour, Wait: time.Second})
			took := time.Since(start)
			if err == nil && res.Decision == store.DecisionExecute {
				err = res.Tx.Commit(ctx, nil)
			}
			return res.Decision, took, err
		}},
	}
	for _, mode := range modes {
		b.Run("mode="+mode.name, func(b *testing.B) {
			perHandler := max(b.N/handlers, 20)
			interval := time.Duration(handlers) * time.Second / claimLatencyRate
			var (
				mu         sync.Mutex
				miss, hits []time.Duration
				wg         sync.WaitGroup
			)
			b.ResetTimer()
			for range handlers {
				wg.Go(func() {
					ctx := b.Context()
					tick := time.NewTicker(interval)
					defer tick.Stop()
					var done []string
					var m, h []time.Duration
					for i := range perHandler {
						<-tick.C
						key, want := rand.Text(), store.DecisionExecute
						if i%2 == 1 && len(done) > 0 {
							key, want = done[len(done)/2], store.DecisionReplay
						}
						d, took, err := mode.claim(ctx, key)
						if err == nil && d != want {
							err = fmt.Errorf("claim of %q: %v, want %v", key, d, want)
						}
						if err != nil {
							b.Error(err)
							return
						}
						if want == store.DecisionExecute {
							m, done = append(m, took), append(done, key)
						} else {
							h = append(h, took)
						}
					}
					mu.Lock()
					miss, hits = append(miss, m...), append(hits, h...)
					mu.Unlock()
				})
			}
			wg.Wait()
			b.StopTimer()
			for _, q := range []struct {
				name string
				at   float64
			}{{"p50", 0.50}, {"p99", 0.99}} {
				b.ReportMetric(float64(percentile(miss, q.at).Microseconds())/1000, "miss-"+q.name+"-ms")
				b.ReportMetric(float64(percentile(hits, q.at).Microseconds())/1000, "hit-"+q.name+"-ms")
			}
		})
	}
}

// claimLatencyRate is BenchmarkClaimLatency's pace, messages a second over
// all handlers.
const claimLatencyRate = 500
