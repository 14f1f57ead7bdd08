package redisstore_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/redisstore"
)

// The benchmarks run against the real Redis (ONCEMILL_REDIS_ADDR), except
// BenchmarkVersusSetNX, which starts a server of its own. Compare
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

// BenchmarkVersusSetNX takes turns, in rounds of 1,000 new keys, between
// oncemill's lease mode (beginComplete: ClaimLease, then Complete with a
// 256-byte result, two round trips) and what a user who accepts the same
// trade would write by hand, each with the same goroutines, connections and
// transport, the order rotating each round, so that a noisy machine slows
// all alike:
//
//   - floor: two SET key v NX EX 60 a message, through the client, or with
//     AutoPipeline through the store's own AutoPipeliner (go-redis keeps one
//     a client);
//   - minimal-lease: the least a lease with a compare-and-set Complete can
//     do (minimalLease), on the same transport.
//
// floor-ratio and minimal-lease-ratio are oncemill's msgs/s over the
// reference's: the median of the rounds' ratios, so a slow spell that
// falls on a few rounds moves them little. Per variant (floor- and
// minimal-lease- before the name for the references), per message:
// client-µs/msg is this process's CPU during the variant's rounds
// (getrusage, with a garbage collection after each round, so each variant
// pays for its own garbage); server-µs/msg the Redis server's, read from
// its process (/proc/PID/stat): the benchmark starts a server of its own
// for this (startPrivateRedis), because a shared server's counts take in
// every other client; round-trips/msg the writes on the client's
// connections (writeCounter: one a command sent alone, one a pipelined
// flush). ONCEMILL_BENCH_REDIS_SERVER names another server binary (a
// valkey-server, for SET IFEQ). b.N is the number of messages. -short
// runs two of the setups. The wait=1 setups run the store with
// Options.WaitReplicas 1 on a private primary with one replica of its own
// (server-µs/msg is the primary's); the references there do not wait.
//
//	go test -run='^$' -bench=VersusSetNX -benchtime=20000x -count=3 ./store/redisstore
func BenchmarkVersusSetNX(b *testing.B) {
	plain := startPrivateRedis(b)
	pair := startReplicated(b) // the wait=1 setups'
	type setup struct {
		n            int
		autoPipeline bool
		wait         int
	}
	setups := []setup{{1, false, 0}, {4, false, 0}, {16, false, 0}, {4, true, 0}, {16, true, 0}, {1, false, 1}, {16, false, 1}}
	if testing.Short() { // a check that it runs: one of each transport
		setups = []setup{{1, false, 0}, {16, true, 0}, {16, false, 1}}
	}
	for _, tt := range setups {
		name := fmt.Sprintf("handlers=%d/autopipeline=%v", tt.n, tt.autoPipeline)
		if tt.wait > 0 {
			name += fmt.Sprintf("/wait=%d", tt.wait)
		}
		b.Run(name, func(b *testing.B) {
			srv := plain
			if tt.wait > 0 {
				srv = pair.primary
			}
			var wc writeCounter
			c := connect(b, srv.addr, &redis.Options{PoolSize: tt.n, Dialer: wc.dialer}, "")
			prefix := testPrefix(b, c)
			s := newStore(b, c, redisstore.Options{Prefix: prefix, AutoPipeline: tt.autoPipeline, WaitReplicas: tt.wait})
			ctx := context.Background()
			// via sends the references' commands: the transport oncemill
			// uses, never a pipelined one beside an unpipelined one.
			var via redis.Cmdable = c
			if tt.autoPipeline {
				pipe, err := c.AutoPipeline() // the store's: it asked first
				if err != nil {
					b.Fatal(err)
				}
				via = pipe
			}
			twoSetNX := func(i int) error {
				key := prefix + ":floor:" + strconv.Itoa(i)
				for _, k := range [2]string{key + ":1", key + ":2"} {
					if ok, err := via.SetNX(ctx, k, "v", time.Minute).Result(); err != nil || !ok {
						return fmt.Errorf("floor: SET NX %s = %v, %v", k, ok, err)
					}
				}
				return nil
			}
			variants := []struct {
				name string // the metrics' prefix
				op   func(i int) error
			}{
				{"", func(i int) error { return beginComplete(ctx, s, "msg-"+strconv.Itoa(i)) }},
				{"floor-", twoSetNX},
				{"minimal-lease-", minimalLease(ctx, via, prefix+":min:")},
			}
			// run sends messages [from, to) through variant v. Its
			// goroutines carry the label variant=<v's name> (oncemill for
			// the store) for a CPU profile's -tagfocus.
			run := func(from, to, v int) time.Duration {
				var (
					next = int64(from)
					wg   sync.WaitGroup
				)
				labels := pprof.Labels("variant", cmp.Or(strings.TrimSuffix(variants[v].name, "-"), "oncemill"))
				start := time.Now()
				for range tt.n {
					wg.Go(func() {
						pprof.Do(ctx, labels, func(context.Context) {
							for {
								i := int(atomic.AddInt64(&next, 1) - 1)
								if i >= to {
									return
								}
								if err := variants[v].op(i); err != nil {
									b.Error(err)
									return
								}
							}
						})
					})
				}
				wg.Wait()
				return time.Since(start)
			}
			cpu := func(read func() (time.Duration, error)) time.Duration {
				d, err := read()
				if err != nil {
					b.Fatal(err)
				}
				return d
			}
			serverCPU := func() (time.Duration, error) {
				_, d, err := testenv.PidCPU(srv.pid)
				return d, err
			}
			// Warm up past the measured keys: the pool's connections, the
			// pipeliner's, the scripts loaded.
			for v := range variants {
				run(b.N, b.N+4*tt.n, v)
			}

			const batch = 1000
			type costs struct {
				took, client, server time.Duration
				writes               int64
				rounds               []time.Duration
			}
			spent := make([]costs, len(variants))
			b.ResetTimer()
			for from, round := 0, 0; from < b.N; from, round = from+batch, round+1 {
				to := min(from+batch, b.N)
				for k := range variants {
					j := (round + k) % len(variants) // the order rotates
					w0, srv0, cli0 := wc.writes.Load(), cpu(serverCPU), cpu(testenv.ProcessCPU)
					took := run(from, to, j)
					w1, srv1 := wc.writes.Load(), cpu(serverCPU)
					runtime.GC()
					cli1 := cpu(testenv.ProcessCPU)
					v := &spent[j]
					v.took += took
					v.rounds = append(v.rounds, took)
					v.client += cli1 - cli0
					v.server += srv1 - srv0
					v.writes += w1 - w0
				}
			}
			b.StopTimer()
			// ratio is the median over the rounds of oncemill's rate over
			// variant j's.
			ratio := func(j int) float64 {
				r := make([]float64, len(spent[0].rounds))
				for i := range r {
					r[i] = spent[j].rounds[i].Seconds() / spent[0].rounds[i].Seconds()
				}
				slices.Sort(r)
				if len(r)%2 == 1 {
					return r[len(r)/2]
				}
				return (r[len(r)/2-1] + r[len(r)/2]) / 2
			}
			us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(b.N) }
			b.ReportMetric(float64(b.N)/spent[0].took.Seconds(), "msgs/s")
			b.ReportMetric(float64(b.N)/spent[1].took.Seconds(), "floor-msgs/s")
			b.ReportMetric(ratio(1), "floor-ratio")
			b.ReportMetric(ratio(2), "minimal-lease-ratio")
			for j, v := range spent {
				name := variants[j].name
				b.ReportMetric(us(v.client), name+"client-µs/msg")
				b.ReportMetric(us(v.server), name+"server-µs/msg")
				b.ReportMetric(float64(v.writes)/float64(b.N), name+"round-trips/msg")
			}
		})
	}
}
