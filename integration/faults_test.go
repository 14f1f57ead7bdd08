package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/postgres"
	"github.com/oncemill/oncemill/store/redisstore"
)

// The fault suite puts a toxiproxy proxy, in process, between the pipeline
// and the real PostgreSQL or Redis, and delivers messages the way a broker
// that requeues a nack at once does (RabbitMQ), while the proxy cuts,
// stalls or slows the store's connections. Every message must end acked,
// charged once in the one-transaction mode (PostgreSQL) and at most once
// in the lease mode (Redis, and PostgreSQL's partitioned layout in
// TestStoreFaultsPartitioned: a success that cannot be recorded is acked,
// so a later duplicate could run again; none may here, since the faults
// end).

// faultProxy starts a proxy to upstream and returns it with its address.
func faultProxy(t *testing.T, upstream string) *toxiproxy.Proxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "store", "127.0.0.1:0", upstream)
	must(t, p.Start())
	t.Cleanup(p.Stop)
	return p
}

// fault is one way the store's network misbehaves for a while.
type fault struct {
	name  string
	apply func(t *testing.T, p *toxiproxy.Proxy) (heal func())
}

var faults = []fault{
	{"cut 4s", func(t *testing.T, p *toxiproxy.Proxy) func() {
		p.Stop() // every connection dropped, new ones refused
		return func() { must(t, p.Start()) }
	}},
	{"stall 3s (longer than the lease)", func(t *testing.T, p *toxiproxy.Proxy) func() {
		_, err := p.Toxics.AddToxicJson(strings.NewReader(`{"name":"stall","type":"timeout","stream":"downstream","toxicity":1,"attributes":{"timeout":0}}`))
		must(t, err)
		return func() { must(t, p.Toxics.RemoveToxic(context.Background(), "stall")) }
	}},
	{"latency 50-200ms", func(t *testing.T, p *toxiproxy.Proxy) func() {
		_, err := p.Toxics.AddToxicJson(strings.NewReader(`{"name":"slow","type":"latency","stream":"downstream","toxicity":1,"attributes":{"latency":125,"jitter":75}}`))
		must(t, err)
		return func() { must(t, p.Toxics.RemoveToxic(context.Background(), "slow")) }
	}},
}

// faultDuration is how long each fault lasts: the cut 4 s, the stall 3 s
// (a lease is 2 s), the latency 4 s.
var faultDuration = map[string]time.Duration{"cut 4s": 4 * time.Second, "stall 3s (longer than the lease)": 3 * time.Second, "latency 50-200ms": 4 * time.Second}

// faultRun is what one run saw.
type faultRun struct {
	deliveries, acks, nacks, takeovers atomic.Int64
	mu                                 sync.Mutex
	slowest                            time.Duration // the longest delivery
	effects                            func() map[string]int
}

func TestStoreFaults(t *testing.T) { testStoreFaults(t, storeKinds) }

// The faults again on the partitioned layout of PostgreSQL, in both modes:
// the one-transaction mode (postgres) and the lease mode (postgres-lease,
// whose handler's effect is counted in memory, as Redis's is).
func TestStoreFaultsPartitioned(t *testing.T) {
	tx := storeKinds[0]
	tx.layout = postgres.LayoutPartitioned
	lease := tx
	lease.name, lease.lease = "postgres-lease", true
	testStoreFaults(t, []storeKind{tx, lease})
}

// The faults again in the one-transaction mode with the claim deferred
// (WithDeferredClaim), on both layouts: a cut that fails the claim sent
// with the handler's statement is a store failure, claimed again up front.
func TestStoreFaultsDeferred(t *testing.T) {
	del := storeKinds[0]
	del.name, del.deferred = "postgres-deferred", true
	part := del
	part.name, part.layout = "postgres-partitioned-deferred", postgres.LayoutPartitioned
	testStoreFaults(t, []storeKind{del, part})
}

func testStoreFaults(t *testing.T, kinds []storeKind) {
	var rows []string
	for _, f := range faults {
		for _, kind := range kinds {
			t.Run(kind.name+"/"+f.name, func(t *testing.T) {
				r := runFault(t, kind, f)
				effects := r.effects()
				doubles, lost := 0, 0
				for i := range faultMessages {
					switch n := effects[fmt.Sprintf("m-%d", i)]; {
					case n == 0:
						lost++
					case n > 1:
						doubles++
					}
				}
				rows = append(rows, fmt.Sprintf("| %s | %s | %d | %d | %d | %d | %d | %d | %d |", f.name, kind.name,
					r.deliveries.Load(), r.acks.Load(), r.nacks.Load(), len(effects), doubles, lost, r.takeovers.Load()))
				if lost != 0 || doubles != 0 {
					t.Errorf("%d lost, %d doubled", lost, doubles)
				}
				if f.name == "latency 50-200ms" && r.takeovers.Load() != 0 {
					t.Errorf("%d takeovers while the store answered within the lease", r.takeovers.Load())
				}
				switch {
				case f.name == "stall 3s (longer than the lease)" && kind.deferred:
					// The deferred claim rides the handler's statement, under
					// the handler's context, not the store's statement
					// timeout: the stall holds deliveries up, it fails none.
					if r.slowest < time.Second {
						t.Errorf("the slowest delivery took %v during the %s: the fault did not reach the store", r.slowest, f.name)
					}
				case f.name != "latency 50-200ms" && r.nacks.Load() == 0:
					t.Errorf("no delivery was nacked during the %s: the fault did not reach the store", f.name)
				}
			})
		}
	}
	t.Logf("\n| fault | store | deliveries | acks | nacks | effects | doubles | lost | takeovers |\n|---|---|---|---|---|---|---|---|---|\n%s", strings.Join(rows, "\n"))
}

// Messages arrive every faultSpacing over faultMessages × faultSpacing =
// 6 s; the fault starts faultLead after the first.
const (
	faultMessages = 300
	faultSpacing  = 20 * time.Millisecond
	faultLead     = 500 * time.Millisecond
)

// runFault delivers faultMessages messages through a receiver over a store
// behind a proxy, with the fault applied a little after the start.
func runFault(t *testing.T, kind storeKind, f fault) *faultRun {
	var raw [5]byte
	_, _ = rand.Read(raw[:])
	ns := "it_fault_" + hex.EncodeToString(raw[:])
	// Registered first, so it runs last: after the store and its pool or
	// client are closed.
	t.Cleanup(func() { kind.cleanup(t, ns) })
	r := &faultRun{}
	p := policy.Policy{
		LeaseDuration: 2 * time.Second, Heartbeat: 600 * time.Millisecond,
		NackDelay:   50 * time.Millisecond,
		MaxAttempts: 1 << 20, // faults are not the handler's failures
	}
	var b *receiver.Builder
	var handler message.HandlerFunc
	switch {
	case strings.HasPrefix(kind.name, "postgres"): // the layout, the mode and the claim are the kind's fields
		proxy := faultProxy(t, pgUpstream(t))
		pool := proxiedPool(t, proxy, 16, 0) // pgx's default connect timeout, as before
		direct := pgPool(t)
		// A lease-mode claim commits its row in the batch that answers it: a
		// claim that runs out of its bound after the commit leaves a live
		// lease, taken over once it expires, so under the latency fault
		// (several round trips of 50-200 ms: connecting, preparing, the
		// batch) its bound must let it finish within the 2 s lease.
		timeout := 500 * time.Millisecond
		if kind.lease {
			timeout = 1500 * time.Millisecond
		}
		st, err := postgres.New(pool, postgres.Options{Schema: ns, StatementTimeout: timeout, CleanupInterval: -1, Layout: kind.layout})
		must(t, err)
		t.Cleanup(func() { st.Close() })
		must(t, st.Migrate(context.Background()))
		if kind.lease {
			b = receiver.New(st)
			handler, r.effects = countedEffects()
			defer runFaultLoop(t, r, b, handler, p, proxy, f)
			break
		}
		ledger := pgx.Identifier{ns, "ledger"}.Sanitize()
		_, err = direct.Exec(context.Background(), "CREATE TABLE "+ledger+" (id bigserial PRIMARY KEY, uuid text NOT NULL)")
		must(t, err)
		b = receiver.NewTransactional(st).WithDeferredClaim(kind.deferred)
		p.LeaseDuration, p.Heartbeat = 0, 0 // the claim is held by the handler's transaction
		handler = func(m *message.Message) ([]*message.Message, error) {
			tx, _ := postgres.TxFromContext(m.Context())
			_, err := tx.Exec(m.Context(), "INSERT INTO "+ledger+" (uuid) VALUES ($1)", m.UUID)
			return nil, err
		}
		r.effects = func() map[string]int {
			rows, err := direct.Query(context.Background(), "SELECT uuid, count(*)::int FROM "+ledger+" GROUP BY uuid")
			must(t, err)
			out := map[string]int{}
			for rows.Next() {
				var id string
				var n int
				must(t, rows.Scan(&id, &n))
				out[id] = n
			}
			must(t, rows.Err())
			return out
		}
		defer runFaultLoop(t, r, b, handler, p, proxy, f)
	case kind.name == "redis":
		proxy := faultProxy(t, env.redisAddr)
		client := redis.NewClient(&redis.Options{Addr: proxy.Listen, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond,
			DialTimeout: 500 * time.Millisecond, MaxRetries: -1})
		t.Cleanup(func() { _ = client.Close() })
		st, err := redisstore.New(client, redisstore.Options{Prefix: ns})
		must(t, err)
		b = receiver.New(st)
		handler, r.effects = countedEffects()
		defer runFaultLoop(t, r, b, handler, p, proxy, f)
	default:
		t.Fatalf("no fault run for store kind %q: add one to runFault", kind.name)
	}
	return r
}

// countedEffects is a lease-mode handler that counts its runs per message
// in memory, and what it counted.
func countedEffects() (message.HandlerFunc, func() map[string]int) {
	var mu sync.Mutex
	effects := map[string]int{}
	handler := func(m *message.Message) ([]*message.Message, error) {
		mu.Lock()
		effects[m.UUID]++
		mu.Unlock()
		return nil, nil
	}
	return handler, func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]int{}
		for k, v := range effects {
			out[k] = v
		}
		return out
	}
}

// runFaultLoop delivers the messages on 8 consumers until each is acked,
// requeuing a nacked one at once, while the fault comes and goes.
func runFaultLoop(t *testing.T, r *faultRun, b *receiver.Builder, handler message.HandlerFunc, p policy.Policy, proxy *toxiproxy.Proxy, f fault) {
	rc, err := b.WithScope("faults").WithPolicy(p).WithEventHandler(func(e pipeline.Event) {
		if e.Takeover {
			r.takeovers.Add(1)
		}
	}).Build()
	must(t, err)
	h := rc.Middleware(func(m *message.Message) ([]*message.Message, error) {
		time.Sleep(20 * time.Millisecond) // the fault finds handlers at work
		return handler(m)
	})
	// Messages arrive every 20 ms, from before the fault until after it,
	// so that the fault finds deliveries in every state.
	queue := make(chan string, faultMessages)
	go func() {
		for i := range faultMessages {
			queue <- fmt.Sprintf("m-%d", i)
			time.Sleep(faultSpacing)
		}
	}()
	var acked atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				case id := <-queue:
					r.deliveries.Add(1)
					start := time.Now()
					_, err := h(message.NewMessage(id, []byte("pay")))
					r.mu.Lock()
					r.slowest = max(r.slowest, time.Since(start))
					r.mu.Unlock()
					if err != nil {
						r.nacks.Add(1)
						queue <- id // requeued at once, as RabbitMQ does
						continue
					}
					r.acks.Add(1)
					if acked.Add(1) == faultMessages {
						close(done)
					}
				}
			}
		})
	}
	time.Sleep(faultLead)
	heal := f.apply(t, proxy)
	time.Sleep(faultDuration[f.name])
	heal()
	eventually(t, limit, func() bool { return acked.Load() >= faultMessages },
		func() string { return fmt.Sprintf("%d of %d messages acked", acked.Load(), faultMessages) })
	wg.Wait()
}
