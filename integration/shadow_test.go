package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/internal/teltest"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/postgres"
	"github.com/oncemill/oncemill/store/redisstore"
)

// Shadow mode on a real broker (issue 25): 300 messages and 90
// redeliveries of 90 of them (the same UUID and payload published again,
// 30%) go through RabbitMQ to a router whose receiver is in shadow mode.
// The handler runs for every delivery, 390, and oncemill.shadow.duplicates
// counts exactly the 90 duplicates, read from an OpenTelemetry ManualReader.
// Then a new receiver over the same store, shadow off, gets the same 90
// duplicates once more: they are replayed from the records the shadow run
// left, and the handler does not run.
//
// In the lease mode (Redis) and in the one-transaction mode (PostgreSQL),
// where a shadowed duplicate's handler runs with no transaction from
// oncemill (postgres.TxFromContext's ok is false).
func TestShadow(t *testing.T) {
	const (
		messages   = 300
		duplicates = 90
	)
	bk := brokerKindNamed(t, "amqp-v3")
	for _, mode := range []string{"lease-redis", "transactional-postgres"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			var raw [5]byte
			_, _ = rand.Read(raw[:])
			ns := "it_shadow_" + hex.EncodeToString(raw[:])
			topic := ns + "-in"
			t.Cleanup(func() { bk.cleanup(t, []string{topic}) })

			var (
				mu     sync.Mutex
				runs   = map[string]int{}
				inTx   int
				events []pipeline.Event
			)
			handler := func(m *message.Message) error {
				_, tx := postgres.TxFromContext(m.Context())
				mu.Lock()
				defer mu.Unlock()
				runs[m.UUID]++
				if tx {
					inTx++
				}
				return nil
			}
			onEvent := func(e pipeline.Event) {
				mu.Lock()
				events = append(events, e)
				mu.Unlock()
			}
			var newBuilder func() *receiver.Builder
			switch mode {
			case "lease-redis":
				t.Cleanup(func() { storeKindNamed(t, "redis").cleanup(t, ns) })
				st, err := redisstore.New(redisClient(t), redisstore.Options{Prefix: ns})
				must(t, err)
				t.Cleanup(func() { _ = st.Close() })
				newBuilder = func() *receiver.Builder { return receiver.New(st) }
			case "transactional-postgres":
				t.Cleanup(func() { storeKindNamed(t, "postgres").cleanup(t, ns) })
				st, err := postgres.New(pgPool(t), postgres.Options{Schema: ns, CleanupInterval: -1})
				must(t, err)
				t.Cleanup(func() { _ = st.Close() })
				must(t, st.Migrate(context.Background()))
				newBuilder = func() *receiver.Builder { return receiver.NewTransactional(st) }
			}

			// Each phase reads its own MeterProvider.
			kit := teltest.New(t)
			rc, err := newBuilder().WithScope("shadow").WithShadow(true).WithMeterProvider(kit.MeterProvider).WithEventHandler(onEvent).Build()
			must(t, err)
			pub := outagePublisher(t, bk, 0)
			stop := startRouter(t, topic, bk.subscriber(t, ""), rc.Middleware, handler)

			originals := make([]*message.Message, messages)
			for i := range originals {
				originals[i] = message.NewMessage(fmt.Sprintf("%s-%03d", ns, i), fmt.Appendf(nil, `{"payment":%d}`, i))
			}
			redelivered := func() []*message.Message {
				out := make([]*message.Message, duplicates)
				for i := range out {
					out[i] = again(originals[i*messages/duplicates])
				}
				return out
			}
			must(t, pub.Publish(topic, originals...))
			must(t, pub.Publish(topic, redelivered()...))

			total := func() (n int) {
				mu.Lock()
				defer mu.Unlock()
				for _, c := range runs {
					n += c
				}
				return n
			}
			testenv.WaitFor(t, limit, "the handler to run for all 390 deliveries", func() bool { return total() >= messages+duplicates })
			stop()

			mu.Lock()
			wantRuns := map[string]int{}
			for _, m := range originals {
				wantRuns[m.UUID] = 1
			}
			for _, m := range redelivered() {
				wantRuns[m.UUID] = 2
			}
			if !maps.Equal(runs, wantRuns) {
				t.Errorf("runs per message differ: %d messages ran, want %d; duplicates ran twice?", len(runs), len(wantRuns))
			}
			shadowed := 0
			for _, e := range events {
				if e.Shadow {
					shadowed++
				}
			}
			gotInTx, gotEvents := inTx, len(events)
			mu.Unlock()
			if want := map[string]int{"transactional-postgres": messages}[mode]; gotInTx != want {
				t.Errorf("%d runs in oncemill's transaction, want %d (the executions only)", gotInTx, want)
			}
			if gotEvents != messages+duplicates || shadowed != duplicates {
				t.Errorf("%d events, %d shadowed; want %d and %d", gotEvents, shadowed, messages+duplicates, duplicates)
			}
			counted := teltest.Sums(t, kit.Metrics(t), "oncemill.shadow.duplicates", "decision")
			var sum int64
			for _, n := range counted {
				sum += n
			}
			t.Logf("shadow: %d handler runs for %d deliveries; oncemill.shadow.duplicates %v", total(), messages+duplicates, counted)
			if sum != duplicates {
				t.Fatalf("oncemill.shadow.duplicates counted %d (%v), want %d", sum, counted, duplicates)
			}

			// Enforcement on the same store: the same duplicates are
			// replayed, the handler does not run.
			mu.Lock()
			events = nil
			mu.Unlock()
			kit = teltest.New(t)
			rc, err = newBuilder().WithScope("shadow").WithMeterProvider(kit.MeterProvider).WithEventHandler(onEvent).Build()
			must(t, err)
			startRouter(t, topic, bk.subscriber(t, ""), rc.Middleware, handler)
			must(t, pub.Publish(topic, redelivered()...))
			testenv.WaitFor(t, limit, "the 90 duplicates to be decided", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(events) >= duplicates
			})
			mu.Lock()
			outcomes := map[pipeline.Outcome]int{}
			for _, e := range events {
				outcomes[e.Outcome]++
			}
			mu.Unlock()
			t.Logf("enforcing: %d handler runs in all; outcomes %v", total(), outcomes)
			if !maps.Equal(outcomes, map[pipeline.Outcome]int{pipeline.OutcomeReplayed: duplicates}) || total() != messages+duplicates {
				t.Fatalf("enforcing: outcomes %v and %d handler runs; want %d replayed and still %d runs", outcomes, total(), duplicates, messages+duplicates)
			}
			if got := teltest.Sums(t, kit.Metrics(t), "oncemill.shadow.duplicates", ""); len(got) != 0 {
				t.Errorf("enforcing: oncemill.shadow.duplicates %v, want nothing", got)
			}
		})
	}
}

// brokerKindNamed is the broker of brokerKinds called name.
func brokerKindNamed(t *testing.T, name string) brokerKind {
	for _, k := range brokerKinds {
		if k.name == name {
			return k
		}
	}
	t.Fatalf("no broker kind %q in brokerKinds", name)
	return brokerKind{}
}

// In the one-transaction mode a duplicate of a key held by an open
// transaction claims without waiting in shadow mode, although the policy
// says to wait an hour (policy.HeldKeyWait), and runs its handler at once,
// with no transaction of oncemill's.
func TestShadowHeldKeyDoesNotWaitInTheTransaction(t *testing.T) {
	t.Parallel()
	var raw [5]byte
	_, _ = rand.Read(raw[:])
	ns := "it_shadow_held_" + hex.EncodeToString(raw[:])
	t.Cleanup(func() { storeKindNamed(t, "postgres").cleanup(t, ns) })
	st, err := postgres.New(pgPool(t), postgres.Options{Schema: ns, CleanupInterval: -1})
	must(t, err)
	t.Cleanup(func() { _ = st.Close() })
	must(t, st.Migrate(context.Background()))
	var events []pipeline.Event
	var mu sync.Mutex
	rc, err := receiver.NewTransactional(st).WithScope("shadow").WithShadow(true).
		WithPolicy(policy.Policy{HeldKey: policy.HeldKeyWait, HeldKeyTimeout: time.Hour}).
		WithEventHandler(func(e pipeline.Event) { mu.Lock(); events = append(events, e); mu.Unlock() }).
		Build()
	must(t, err)

	holding, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	h := rc.Middleware(func(m *message.Message) ([]*message.Message, error) {
		if calls.Add(1) == 1 {
			close(holding) // the claim's transaction is open
			<-release
			return nil, nil
		}
		if _, ok := postgres.TxFromContext(m.Context()); ok {
			return nil, errors.New("the shadowed duplicate runs in a transaction of oncemill's")
		}
		return nil, nil
	})
	first := make(chan error, 1)
	go func() { _, err := h(message.NewMessage("k1", []byte("x"))); first <- err }()
	<-holding
	dup := make(chan error, 1)
	go func() { _, err := h(message.NewMessage("k1", []byte("x"))); dup <- err }()
	select {
	case err := <-dup:
		must(t, err)
	case <-time.After(limit):
		close(release)
		t.Fatalf("the duplicate still waits for the holder after %v", limit)
	}
	close(release)
	must(t, <-first)
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 2 || !events[0].Shadow || events[0].Outcome != pipeline.OutcomeHeldKeyNacked || events[1].Outcome != pipeline.OutcomeExecuted {
		t.Fatalf("events %+v; want the duplicate shadowed as held, then the execution", events)
	}
}
