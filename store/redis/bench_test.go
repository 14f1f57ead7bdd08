package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/store"
	oredis "github.com/oncemill/oncemill/store/redis"
)

// The benchmarks run against the real Redis (ONCEMILL_REDIS_ADDR). Compare
// them with redis-benchmark running SET NX EX at the same client count:
//
//	go test -run='^$' -bench=. -benchtime=100000x ./store/redis
//	redis-benchmark -h 127.0.0.1 -p 6379 -n 200000 -c N -r 1000000 SET oncemillbench:__rand_int__ v NX EX 60
//
// msgs/s counts messages: one Begin and one Complete each (a SET NX and a
// script).

var benchOutcome = store.Completion{Status: store.StatusSucceeded, Result: make([]byte, 256), TTL: time.Hour}

func benchStore(b *testing.B, poolSize int, autoPipeline bool) *oredis.Store {
	b.Helper()
	c := newClient(b, &goredis.Options{PoolSize: poolSize})
	return newStore(b, c, oredis.Options{Prefix: testPrefix(b, c), AutoPipeline: autoPipeline})
}

// concurrently runs op(i) for i in [0, b.N) on n goroutines and reports
// the rate as msgs/s.
func concurrently(b *testing.B, n int, op func(i int) error) {
	b.Helper()
	var (
		next   atomic.Int64
		wg     sync.WaitGroup
		failed atomic.Pointer[error]
	)
	b.ResetTimer()
	for range n {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= b.N || failed.Load() != nil {
					return
				}
				if err := op(i); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

func beginComplete(ctx context.Context, s *oredis.Store, key string) error {
	res, err := s.Begin(ctx, store.BeginRequest{Scope: "bench", Key: key, Fingerprint: "fp", Lease: time.Minute})
	if err != nil {
		return err
	}
	if res.Decision != store.DecisionExecute {
		return fmt.Errorf("Begin(%s) = %v, want execute", key, res.Decision)
	}
	return s.Complete(ctx, res.Lease, benchOutcome)
}

// BenchmarkBeginComplete is a first delivery: Begin a new key, then
// Complete it with a 256-byte result, at 1, 4 and 16 concurrent handlers.
func BenchmarkBeginComplete(b *testing.B) {
	for _, n := range []int{1, 4, 16} {
		b.Run("handlers="+strconv.Itoa(n), func(b *testing.B) {
			s := benchStore(b, n, false)
			ctx := context.Background()
			concurrently(b, n, func(i int) error { return beginComplete(ctx, s, "msg-"+strconv.Itoa(i)) })
		})
	}
}

// BenchmarkBeginCompleteAutoPipeline is BenchmarkBeginComplete with
// Options.AutoPipeline: concurrent script calls share round trips.
func BenchmarkBeginCompleteAutoPipeline(b *testing.B) {
	for _, n := range []int{1, 4, 16} {
		b.Run("handlers="+strconv.Itoa(n), func(b *testing.B) {
			s := benchStore(b, n, true)
			ctx := context.Background()
			concurrently(b, n, func(i int) error { return beginComplete(ctx, s, "msg-"+strconv.Itoa(i)) })
		})
	}
}

// BenchmarkReplay is a duplicate of a finished key: one Begin that finds the
// stored 256-byte result.
func BenchmarkReplay(b *testing.B) {
	for _, n := range []int{1, 4, 16} {
		b.Run("handlers="+strconv.Itoa(n), func(b *testing.B) {
			s := benchStore(b, n, false)
			ctx := context.Background()
			const keys = 1024
			for i := range keys {
				if err := beginComplete(ctx, s, "msg-"+strconv.Itoa(i)); err != nil {
					b.Fatal(err)
				}
			}
			concurrently(b, n, func(i int) error {
				key := "msg-" + strconv.Itoa(i%keys)
				res, err := s.Begin(ctx, store.BeginRequest{Scope: "bench", Key: key, Fingerprint: "fp", Lease: time.Minute})
				if err != nil {
					return err
				}
				if res.Decision != store.DecisionReplay {
					return fmt.Errorf("Begin(%s) = %v, want replay", key, res.Decision)
				}
				return nil
			})
		})
	}
}

// BenchmarkSetNX is the baseline in Go: go-redis sending SET key v NX EX 60
// for unique keys, the command redis-benchmark measures, at the same
// concurrency. It separates the cost of the client from that of the
// scripts.
func BenchmarkSetNX(b *testing.B) {
	for _, n := range []int{1, 4, 16} {
		b.Run("handlers="+strconv.Itoa(n), func(b *testing.B) {
			c := newClient(b, &goredis.Options{PoolSize: n})
			prefix := testPrefix(b, c)
			ctx := context.Background()
			concurrently(b, n, func(i int) error {
				return c.SetNX(ctx, prefix+":"+strconv.Itoa(i), "v", time.Minute).Err()
			})
		})
	}
}

// BenchmarkNewKeyReply is why Begin sends SET NX rather than SET NX GET for
// a new key: go-redis takes the nil reply of SET NX GET down its error path
// (its retry classification), where SET NX answers OK. Compare allocs/op.
func BenchmarkNewKeyReply(b *testing.B) {
	c := newClient(b, &goredis.Options{PoolSize: 1})
	prefix := testPrefix(b, c)
	ctx := context.Background()
	b.Run("SET-NX", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			if err := c.SetNX(ctx, prefix+":nx:"+strconv.Itoa(b.N)+":"+strconv.Itoa(i), "v", time.Minute).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("SET-NX-GET", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			err := c.SetArgs(ctx, prefix+":nxget:"+strconv.Itoa(b.N)+":"+strconv.Itoa(i), "v", goredis.SetArgs{Mode: "NX", Get: true, TTL: time.Minute}).Err()
			if !errors.Is(err, goredis.Nil) {
				b.Fatalf("SET NX GET of a new key = %v, want redis.Nil", err)
			}
		}
	})
}

// commandUsec is the server's CPU time in all commands so far, in µs, from
// INFO commandstats (the INFO command itself included, a few µs).
func commandUsec(b *testing.B, c *goredis.Client) int64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		_, stats, ok := strings.Cut(line, ",usec=")
		if !ok {
			continue
		}
		usec, _, _ := strings.Cut(stats, ",")
		n, err := strconv.ParseInt(usec, 10, 64)
		if err != nil {
			b.Fatalf("INFO commandstats line %q: %v", line, err)
		}
		total += n
	}
	return total
}

// BenchmarkVersusSetNX takes turns, in batches of 1,000, between oncemill's
// Begin+Complete of new keys, go-redis sending SET key v NX EX 60 for new
// keys, and go-redis sending two such SETs per message, each with the same
// number of goroutines and connections, so that a noisy machine slows all
// alike. It reports the rates, oncemill's ratio to SET NX, and the ratio of
// the two SETs to one: the most that any store taking two round trips per
// message could reach in the same run. It also reports the Redis server's
// CPU per message (server-µs/msg, from INFO commandstats around oncemill's
// batches). b.N is the number of messages (and of SETs).
//
//	go test -run='^$' -bench=VersusSetNX -benchtime=20000x -count=3 ./store/redis
func BenchmarkVersusSetNX(b *testing.B) {
	for _, tt := range []struct {
		n            int
		autoPipeline bool
	}{{1, false}, {4, false}, {16, false}, {4, true}, {16, true}} {
		b.Run(fmt.Sprintf("handlers=%d/autopipeline=%v", tt.n, tt.autoPipeline), func(b *testing.B) {
			c := newClient(b, &goredis.Options{PoolSize: tt.n})
			prefix := testPrefix(b, c)
			s := newStore(b, c, oredis.Options{Prefix: prefix, AutoPipeline: tt.autoPipeline})
			ctx := context.Background()
			run := func(from, to int, op func(i int) error) time.Duration {
				var (
					next = int64(from)
					wg   sync.WaitGroup
				)
				start := time.Now()
				for range tt.n {
					wg.Go(func() {
						for {
							i := int(atomic.AddInt64(&next, 1) - 1)
							if i >= to {
								return
							}
							if err := op(i); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				return time.Since(start)
			}
			setNX := func(key string) error { return c.SetNX(ctx, key, "v", time.Minute).Err() }
			ops := []func(i int) error{
				func(i int) error { return beginComplete(ctx, s, "msg-"+strconv.Itoa(i)) },
				func(i int) error { return setNX(prefix + ":set:" + strconv.Itoa(i)) },
				func(i int) error {
					if err := setNX(prefix + ":two:" + strconv.Itoa(i)); err != nil {
						return err
					}
					return setNX(prefix + ":two2:" + strconv.Itoa(i))
				},
			}

			const batch = 1000
			var (
				took     [3]time.Duration
				serverUS int64 // the server's CPU for oncemill's commands
			)
			b.ResetTimer()
			for from := 0; from < b.N; from += batch {
				to := min(from+batch, b.N)
				for k := range ops {
					j := (from/batch + k) % len(ops) // the order rotates
					if j == 0 {
						before := commandUsec(b, c)
						took[j] += run(from, to, ops[j])
						serverUS += commandUsec(b, c) - before
					} else {
						took[j] += run(from, to, ops[j])
					}
				}
			}
			b.StopTimer()
			once, set, two := float64(b.N)/took[0].Seconds(), float64(b.N)/took[1].Seconds(), float64(b.N)/took[2].Seconds()
			b.ReportMetric(once, "msgs/s")
			b.ReportMetric(set, "setnx/s")
			b.ReportMetric(once/set, "ratio")
			b.ReportMetric(two/set, "two-setnx-ratio")
			b.ReportMetric(float64(serverUS)/float64(b.N), "server-µs/msg")
		})
	}
}
