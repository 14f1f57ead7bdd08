package idempotency_test

import (
	"context"
	"runtime/metrics"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/cespare/xxhash/v2"
	"github.com/sony/gobreaker/v2"

	"github.com/oncemill/oncemill/internal/idempotency"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
)

var benchPayload = []byte(`{"payment_id":"p-000123","account":"acc-17","amount_cents":1234,"currency":"EUR","meta":{"sent_at":"2026-11-21T10:00:00Z","attempt":1}}`)

func benchStage(b *testing.B) *idempotency.Leased {
	b.Helper()
	st, err := memory.New(memory.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	stage, err := idempotency.NewLeased(st, idempotency.Config{KeyGenerator: keygen.UUID(), Scope: "bench", Policy: policy.Policy{}.WithDefaults()})
	if err != nil {
		b.Fatal(err)
	}
	return stage
}

// BenchmarkRouterThroughput runs the same router on gochannel bare, with
// oncemill as the builder makes it (idempotency and a delivery span), with
// Watermill's Deduplicator, with oncemill with every option (full-chain),
// with the idempotency stage alone, and with a middleware that only calls
// the handler (passthrough/bare: how far apart two routers doing the same
// work land, the resolution of oncemill/bare), in one process. The routers
// take turns (takeTurns), and the ratios are reported directly. Every
// message is unique, so oncemill executes each one and stores its record:
// this is its full cost. docs/benchmarks.md runs it as
//
//	go test -run='^$' -bench='RouterThroughput$' -benchtime=40000x -count=3 ./internal/idempotency
func BenchmarkRouterThroughput(b *testing.B) {
	dedup := &middleware.Deduplicator{KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil }}
	routers := []*benchedRouter{
		startBenchedRouter(b, "bare", nil),
		startBenchedRouter(b, "oncemill", benchReceiver(b, false).Middleware),
		startBenchedRouter(b, "deduplicator", dedup.Middleware),
		startBenchedRouter(b, "full-chain", benchReceiver(b, true).Middleware),
		startBenchedRouter(b, "stage-alone", benchStage(b).Middleware),
		startBenchedRouter(b, "passthrough", passthrough),
	}
	b.ReportAllocs()
	takeTurns(b, routers)
	b.ReportMetric(routers[3].rate()/routers[1].rate(), "full-chain/oncemill")
	b.ReportMetric(routers[1].rate()/routers[2].rate(), "oncemill/deduplicator")
}

// BenchmarkRouterThroughputBusyHandler is BenchmarkRouterThroughput's bare
// and builder routers around a handler that does about 50 µs of CPU work, as
// a handler that parses, validates and computes does: what oncemill costs a
// handler with real work, reported as oncemill/bare. A third router with a
// middleware that only calls the handler (passthrough/bare) shows how far
// apart two routers doing the same work land in the same run: the
// resolution of oncemill/bare.
//
//	go test -run='^$' -bench=RouterThroughputBusyHandler -benchtime=20000x -count=3 ./internal/idempotency
func BenchmarkRouterThroughputBusyHandler(b *testing.B) {
	work := cpuWork(50 * time.Microsecond)
	takeTurns(b, []*benchedRouter{
		startBenchedRouter(b, "bare", nil, work),
		startBenchedRouter(b, "oncemill", benchReceiver(b, false).Middleware, work),
		startBenchedRouter(b, "passthrough", passthrough, work),
	})
}

// passthrough is a middleware that only calls the handler.
func passthrough(h message.HandlerFunc) message.HandlerFunc {
	return func(m *message.Message) ([]*message.Message, error) { return h(m) }
}

// cpuWork returns a function that hashes the bench payload for about d,
// calibrated once on this machine.
func cpuWork(d time.Duration) func() {
	var sink uint64
	hash := func(n int) {
		for range n {
			sink += xxhash.Sum64(benchPayload)
		}
	}
	const probe = 100_000
	start := time.Now()
	hash(probe)
	n := max(int(float64(probe)*float64(d)/float64(time.Since(start))), 1)
	return func() { hash(n) }
}

// BenchmarkRouterOverhead splits the gap between oncemill and a bare router
// into its parts, side by side like BenchmarkRouterThroughput. "passthrough"
// is a middleware that only calls the handler: how far apart two identical
// routers land on this machine, the resolution of any ratio measured here.
// "stage-nop-store" is the idempotency stage over a store that keeps nothing
// (every ClaimLease executes): the stage's own work. "stage-memory-store" is the
// stage as BenchmarkRouterThroughput runs it. Run it as
//
//	go test -run='^$' -bench=RouterOverhead -count=3 ./internal/idempotency
func BenchmarkRouterOverhead(b *testing.B) {
	nop, err := idempotency.NewLeased(keepNothing{}, idempotency.Config{KeyGenerator: keygen.UUID(), Scope: "bench", Policy: policy.Policy{}.WithDefaults()})
	if err != nil {
		b.Fatal(err)
	}
	takeTurns(b, []*benchedRouter{
		startBenchedRouter(b, "bare", nil),
		startBenchedRouter(b, "passthrough", passthrough),
		startBenchedRouter(b, "stage-nop-store", nop.Middleware),
		startBenchedRouter(b, "stage-memory-store", benchStage(b).Middleware),
	})
}

// takeTurns runs b.N messages through each router in batches of 1,000, the
// order rotating each round, so that a noisy machine slows all of them
// alike, and reports each rate and its ratio to the first router's, and
// what a message cost the process during the router's turns: CPU time (its
// garbage collector's included) and heap allocations. The costs move far
// less than the rates on a shared machine.
func takeTurns(b *testing.B, routers []*benchedRouter) {
	const batch = 1000
	b.ResetTimer()
	for round := 0; round*batch < b.N; round++ {
		for i := range routers {
			routers[(round+i)%len(routers)].run(b, batch)
		}
	}
	b.StopTimer()
	base := routers[0]
	for _, r := range routers {
		b.ReportMetric(r.rate(), r.name+"-msgs/s")
		b.ReportMetric(float64(r.cpu.Microseconds())/float64(r.sent), r.name+"-cpu-µs/msg")
		b.ReportMetric(float64(r.allocs)/float64(r.sent), r.name+"-allocs/msg")
		if r != base {
			b.ReportMetric(r.rate()/base.rate(), r.name+"/"+base.name)
		}
	}
}

// keepNothing is a store that remembers nothing: every ClaimLease executes and
// every write succeeds. It measures the stage without a store's cost and is
// no store at all (BenchmarkRouterOverhead only).
type keepNothing struct{}

func (keepNothing) ClaimLease(_ context.Context, req store.LeaseRequest) (store.ClaimResult, error) {
	return store.ClaimResult{Decision: store.DecisionExecute, Claim: store.Claim{
		Scope: req.Scope, Key: req.Key, Token: 1, Attempt: 1, ExpiresAt: time.Now().Add(req.LeaseDuration),
	}}, nil
}
func (keepNothing) Limits() store.Limits                                          { return store.Limits{} }
func (keepNothing) Complete(context.Context, store.Claim, store.Completion) error { return nil }
func (keepNothing) Release(context.Context, store.Claim, store.Completion) error  { return nil }
func (keepNothing) Extend(_ context.Context, l store.Claim, _ time.Duration) (store.Claim, error) {
	return l, nil
}
func (keepNothing) Get(context.Context, string, string) (store.Record, error) {
	return store.Record{}, store.ErrNotFound
}
func (keepNothing) Delete(context.Context, string, string) error    { return nil }
func (keepNothing) DeleteExpired(context.Context, int) (int, error) { return 0, nil }

// benchReceiver is what a user builds: receiver.New(st) with the UUID key
// (idempotency and the delivery span), and with full, every other option
// too, each with nothing to do: validation passes, and the handler never
// fails (no retry, the breaker stays closed).
func benchReceiver(b *testing.B, full bool) *receiver.Receiver {
	b.Helper()
	st, err := memory.New(memory.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	builder := receiver.New(st).WithScope("bench")
	if full {
		builder = builder.
			WithValidation(func(*message.Message) error { return nil }).
			WithRetry(pipeline.RetryConfig{}).
			WithCircuitBreaker(gobreaker.Settings{})
	}
	r, err := builder.Build()
	if err != nil {
		b.Fatal(err)
	}
	return r
}

type benchedRouter struct {
	name    string
	pubSub  *gochannel.GoChannel
	handled atomic.Int64
	target  atomic.Int64
	reached chan struct{}
	elapsed time.Duration
	sent    int
	cpu     time.Duration // the process's CPU time during the turns
	allocs  uint64        // the process's heap allocations during the turns
}

// startBenchedRouter starts a router on its own gochannel, with mw (if any)
// around a handler that runs work (if any) and counts.
func startBenchedRouter(b *testing.B, name string, mw message.HandlerMiddleware, work ...func()) *benchedRouter {
	b.Helper()
	logger := watermill.NopLogger{}
	r := &benchedRouter{name: name, reached: make(chan struct{}, 1)}
	r.pubSub = gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1024}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		b.Fatal(err)
	}
	h := router.AddConsumerHandler("bench", "in", r.pubSub, func(*message.Message) error {
		for _, w := range work {
			w()
		}
		if r.handled.Add(1) == r.target.Load() {
			r.reached <- struct{}{}
		}
		return nil
	})
	if mw != nil {
		h.AddMiddleware(mw)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { _ = router.Run(ctx); close(stopped) }()
	<-router.Running()
	b.Cleanup(func() { cancel(); <-stopped; _ = r.pubSub.Close() })
	return r
}

// run publishes n new messages, made as they are published as a real
// producer would, and waits until the handler has seen them all.
func (r *benchedRouter) run(b *testing.B, n int) {
	r.target.Store(r.handled.Load() + int64(n))
	cpu, allocs := processCPU(b), heapAllocs()
	start := time.Now()
	for i := 0; i < n; i++ {
		if err := r.pubSub.Publish("in", message.NewMessage(watermill.NewUUID(), benchPayload)); err != nil {
			b.Fatal(err)
		}
	}
	<-r.reached
	r.elapsed += time.Since(start)
	r.cpu += processCPU(b) - cpu
	r.allocs += heapAllocs() - allocs
	r.sent += n
}

func processCPU(b *testing.B) time.Duration {
	t, err := testenv.ProcessCPU()
	if err != nil {
		b.Fatal(err)
	}
	return t
}

// heapAllocs is the number of heap objects the process has allocated so
// far; unlike runtime.ReadMemStats, reading it does not stop the world.
func heapAllocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:objects"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func (r *benchedRouter) rate() float64 { return float64(r.sent) / r.elapsed.Seconds() }

// BenchmarkReplay is the whole duplicate path of the stage: key, fingerprint,
// ClaimLease finding a success, decoding the stored message, handing it back.
func BenchmarkReplay(b *testing.B) {
	stage := benchStage(b)
	handler := stage.Middleware(func(m *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("settled-1", []byte(`{"status":"settled"}`))}, nil
	})
	m := message.NewMessage("m-1", benchPayload)
	if _, err := handler(m); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		out, err := handler(m)
		if err != nil || len(out) != 1 {
			b.Fatal(out, err)
		}
	}
}

// BenchmarkExecute is the stage around a handler that does nothing, for a
// new key each time: ClaimLease, lease context, heartbeat timer, Complete.
func BenchmarkExecute(b *testing.B) {
	stage := benchStage(b)
	handler := stage.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	msgs := make([]*message.Message, b.N)
	for i := range msgs {
		msgs[i] = message.NewMessage("m-"+strconv.Itoa(i), benchPayload)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for _, m := range msgs {
		if _, err := handler(m); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRouterProfile is one router with the builder's receiver and a
// no-op handler, alone in the process, for a CPU profile of what oncemill
// costs a router:
//
//	go test -run='^$' -bench=RouterProfile -benchtime=200000x -cpuprofile=cpu.out ./internal/idempotency
func BenchmarkRouterProfile(b *testing.B) {
	r := startBenchedRouter(b, "oncemill", benchReceiver(b, false).Middleware)
	b.ResetTimer()
	for n := 0; n < b.N; n += 1000 {
		r.run(b, min(1000, b.N-n))
	}
	b.ReportMetric(r.rate(), "msgs/s")
}
