package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/redisstore"
)

// The benchmarks run against the real Redis (ONCEMILL_REDIS_ADDR). Compare
// them with redis-benchmark running SET NX EX at the same client count:
//
//	go test -run='^$' -bench=. -benchtime=100000x ./store/redisstore
//	redis-benchmark -h 127.0.0.1 -p 6379 -n 200000 -c N -r 1000000 SET oncemillbench:__rand_int__ v NX EX 60
//
// msgs/s counts messages: one ClaimLease and one Complete each (a SET NX and a
// script).

var benchCompletion = store.Completion{Status: store.StatusSucceeded, Result: make([]byte, 256), TTL: time.Hour}

func benchStore(b *testing.B, poolSize int, autoPipeline bool) *redisstore.Store {
	b.Helper()
	c := newClient(b, &redis.Options{PoolSize: poolSize})
	return newStore(b, c, redisstore.Options{Prefix: testPrefix(b, c), AutoPipeline: autoPipeline})
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

// benchUUID is a message UUID as Watermill makes them, which the pipeline
// passes with every claim.
const benchUUID = "0192f3a4-5b6c-7d8e-9f01-23456789abcd"

func beginComplete(ctx context.Context, s *redisstore.Store, key string) error {
	res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "bench", Key: key, Fingerprint: "fp", LeaseDuration: time.Minute, MessageUUID: benchUUID})
	if err != nil {
		return err
	}
	if res.Decision != store.DecisionExecute {
		return fmt.Errorf("Begin(%s) = %v, want execute", key, res.Decision)
	}
	return s.Complete(ctx, res.Claim, benchCompletion)
}

// BenchmarkBeginComplete is a first delivery: ClaimLease a new key, then
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

// BenchmarkReplay is a duplicate of a finished key: one ClaimLease that finds the
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
				res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "bench", Key: key, Fingerprint: "fp", LeaseDuration: time.Minute})
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
			c := newClient(b, &redis.Options{PoolSize: n})
			prefix := testPrefix(b, c)
			ctx := context.Background()
			concurrently(b, n, func(i int) error {
				return c.SetNX(ctx, prefix+":"+strconv.Itoa(i), "v", time.Minute).Err()
			})
		})
	}
}

// BenchmarkNewKeyReply is why ClaimLease sends SET NX rather than SET NX GET for
// a new key: go-redis takes the nil reply of SET NX GET down its error path
// (its retry classification), where SET NX answers OK. Compare allocs/op.
func BenchmarkNewKeyReply(b *testing.B) {
	c := newClient(b, &redis.Options{PoolSize: 1})
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
			err := c.SetArgs(ctx, prefix+":nxget:"+strconv.Itoa(b.N)+":"+strconv.Itoa(i), "v", redis.SetArgs{Mode: "NX", Get: true, TTL: time.Minute}).Err()
			if !errors.Is(err, redis.Nil) {
				b.Fatalf("SET NX GET of a new key = %v, want redis.Nil", err)
			}
		}
	})
}

// messageUsec is the server's CPU, in µs, for the commands that ClaimLease and
// Complete of new keys sent between two readings: a SET NX and an EVALSHA
// each (two SETs where Complete is a SET IFEQ). Redis counts a command that
// a script calls twice, within the script's time and again on its own, so
// the scripts' own SETs (one each) are taken out at the average cost of a
// SET, and their GETs (the only GETs: every key is new) left out.
func messageUsec(before, after commandStats) float64 {
	delta := func(name string) (calls, usec float64) {
		return float64(after[name].calls - before[name].calls), float64(after[name].usec - before[name].usec)
	}
	scripts, scriptUsec := delta("evalsha")
	sets, setUsec := delta("set")
	if sets == 0 {
		return scriptUsec
	}
	return scriptUsec + setUsec*(sets-scripts)/sets
}

// minimalCompleteScript is the minimal lease's Complete: one GET, a
// comparison with the value its ClaimLease wrote, one SET PX. It is what the
// store's own compare-and-set script does today, written out here so that
// the reference stays put when the store changes.
var minimalCompleteScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
`)

// minimalLease is the least a store with a lease and a compare-and-set
// Complete can do on a server without SET IFEQ, the reference design of
// issue 12: ClaimLease one SET key token|1|fp NX PX, Complete minimalCompleteScript
// with the same 256-byte result as oncemill's. Nothing else: no record
// layout, no checks, no hash tag.
func minimalLease(ctx context.Context, c redis.Cmdable, prefix string) func(i int) error {
	result := string(benchCompletion.Result)
	return func(i int) error {
		key := prefix + strconv.Itoa(i)
		lease := strconv.FormatInt(time.Now().UnixMicro(), 10) + "|1|fp"
		if ok, err := c.SetNX(ctx, key, lease, time.Minute).Result(); err != nil || !ok {
			return fmt.Errorf("minimal lease: SET NX %s = %v, %v", key, ok, err)
		}
		done, err := minimalCompleteScript.Run(ctx, c, []string{key}, lease, lease+"|s|"+result, time.Hour.Milliseconds()).Int64()
		if err != nil || done != 1 {
			return fmt.Errorf("minimal lease: Complete %s = %d, %v", key, done, err)
		}
		return nil
	}
}

// BenchmarkVersusSetNX takes turns, in batches of 1,000, between oncemill's
// ClaimLease+Complete of new keys, go-redis sending SET key v NX EX 60 for new
// keys, and go-redis sending two such SETs per message, each with the same
// number of goroutines and connections, so that a noisy machine slows all
// alike. It reports the rates, oncemill's ratio to SET NX, and the ratio of
// the two SETs to one: the most that any store taking two round trips per
// message could reach in the same run. With AutoPipeline it also sends the
// two SETs through the store's own AutoPipeliner, which go-redis keeps one
// of per client (two-setnx-pipelined-ratio): what two plain commands per
// message reach on the transport that oncemill uses. It reports the Redis server's CPU per
// message too (server-µs/msg, from INFO commandstats around oncemill's
// batches, messageUsec). b.N is the number of messages (and of SETs).
//
// Where the time goes: cpu-µs/msg is this process's CPU per message during
// oncemill's batches (user and system, from getrusage; garbage left by the
// batch before may be collected in it), and redis-cpu-µs/msg the Redis
// process's (INFO cpu: the commands and the reads, writes and polls around
// them, which server-µs/msg leaves out). two-setnx-cpu-µs/msg,
// two-setnx-pipelined-redis-cpu-µs/msg and the like are the same for the
// reference pairs.
//
//	go test -run='^$' -bench=VersusSetNX -benchtime=20000x -count=3 ./store/redisstore
func BenchmarkVersusSetNX(b *testing.B) {
	for _, tt := range []struct {
		n            int
		autoPipeline bool
	}{{1, false}, {4, false}, {16, false}, {4, true}, {16, true}} {
		b.Run(fmt.Sprintf("handlers=%d/autopipeline=%v", tt.n, tt.autoPipeline), func(b *testing.B) {
			c := newClient(b, &redis.Options{PoolSize: tt.n})
			prefix := testPrefix(b, c)
			s := newStore(b, c, redisstore.Options{Prefix: prefix, AutoPipeline: tt.autoPipeline})
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
			twoSetNX := func(c redis.Cmdable, tag string) func(i int) error {
				return func(i int) error {
					key := prefix + tag + strconv.Itoa(i)
					if err := c.SetNX(ctx, key+":1", "v", time.Minute).Err(); err != nil {
						return err
					}
					return c.SetNX(ctx, key+":2", "v", time.Minute).Err()
				}
			}
			ops := []func(i int) error{
				func(i int) error { return beginComplete(ctx, s, "msg-"+strconv.Itoa(i)) },
				func(i int) error { return c.SetNX(ctx, prefix+":set:"+strconv.Itoa(i), "v", time.Minute).Err() },
				twoSetNX(c, ":two:"),
				minimalLease(ctx, c, prefix+":min:"),
			}
			if tt.autoPipeline {
				// The same two SETs, and the minimal lease, through the
				// store's pipeliner: go-redis keeps one per client, made
				// with the store's options, and it ends with the client.
				pipe, err := c.AutoPipeline()
				if err != nil {
					b.Fatal(err)
				}
				ops[3] = minimalLease(ctx, pipe, prefix+":min:")
				ops = append(ops, twoSetNX(pipe, ":piped:"))
			}

			const batch = 1000
			var (
				took      = make([]time.Duration, len(ops))
				clientCPU = make([]time.Duration, len(ops))
				redisCPU  = make([]time.Duration, len(ops))
				serverUS  float64 // the server's CPU for oncemill's commands
			)
			_, cpuKnown := processCPU() // whether the platform tells
			b.ResetTimer()
			for from := 0; from < b.N; from += batch {
				to := min(from+batch, b.N)
				for k := range ops {
					j := (from/batch + k) % len(ops) // the order rotates
					before := readServerStats(b, c)
					cpu0, _ := processCPU()
					took[j] += run(from, to, ops[j])
					cpu1, _ := processCPU()
					after := readServerStats(b, c)
					clientCPU[j] += cpu1 - cpu0
					redisCPU[j] += after.cpu - before.cpu
					if j == 0 {
						serverUS += messageUsec(before.commands, after.commands)
					}
				}
			}
			b.StopTimer()
			rate := func(j int) float64 { return float64(b.N) / took[j].Seconds() }
			perMessage := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N) }
			// report gives op j's ratio to SET NX and its CPU per message.
			report := func(j int, name string) {
				b.ReportMetric(rate(j)/rate(1), name+"ratio")
				if cpuKnown {
					b.ReportMetric(perMessage(clientCPU[j]), name+"cpu-µs/msg")
				}
				b.ReportMetric(perMessage(redisCPU[j]), name+"redis-cpu-µs/msg")
			}
			b.ReportMetric(rate(0), "msgs/s")
			b.ReportMetric(rate(1), "setnx/s")
			report(0, "")
			report(2, "two-setnx-")
			report(3, "minimal-lease-")
			if tt.autoPipeline {
				report(4, "two-setnx-pipelined-")
			}
			b.ReportMetric(serverUS/float64(b.N), "server-µs/msg")
		})
	}
}
