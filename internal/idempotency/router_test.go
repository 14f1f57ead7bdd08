package idempotency_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/oncemill/oncemill/internal/idempotency"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store/memory"
)

// routerRun runs a gochannel router until acks deliveries have been acked,
// then stops it.
type routerRun struct {
	t      *testing.T
	pubSub *gochannel.GoChannel
	router *message.Router
	acks   atomic.Int32
}

func newRouterRun(t *testing.T) *routerRun {
	t.Helper()
	logger := watermill.NopLogger{}
	r, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	rr := &routerRun{t: t, pubSub: gochannel.NewGoChannel(gochannel.Config{}, logger), router: r}
	// Outermost: count what the router will ack.
	r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			out, err := h(m)
			if err == nil {
				rr.acks.Add(1)
			}
			return out, err
		}
	})
	return rr
}

func (rr *routerRun) start() {
	rr.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = rr.router.Run(ctx); close(done) }()
	rr.t.Cleanup(func() { cancel(); <-done; _ = rr.pubSub.Close() })
	<-rr.router.Running()
}

func (rr *routerRun) publish(topic string, msgs ...*message.Message) {
	rr.t.Helper()
	if err := rr.pubSub.Publish(topic, msgs...); err != nil {
		rr.t.Fatal(err)
	}
}

func (rr *routerRun) waitAcks(n int32) {
	rr.t.Helper()
	testenv.WaitFor(rr.t, 10*time.Second, "the router to ack the deliveries", func() bool { return rr.acks.Load() >= n })
}

func newStage(t *testing.T, mutate func(*stageConfig)) *idempotency.Leased {
	t.Helper()
	st, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	cfg := stageConfig{Store: st, Config: idempotency.Config{KeyGenerator: keygen.UUID(), Policy: policy.Policy{}.WithDefaults()}}
	if mutate != nil {
		mutate(&cfg)
	}
	stage, err := idempotency.NewLeased(cfg.Store, cfg.Config)
	if err != nil {
		t.Fatal(err)
	}
	return stage
}

// failOnce is a handler whose first call fails (before any effect) and whose
// later calls record one effect each.
func failOnce(calls, effects *atomic.Int32) message.NoPublishHandlerFunc {
	return func(*message.Message) error {
		if calls.Add(1) == 1 {
			return errors.New("database briefly unavailable")
		}
		effects.Add(1)
		return nil
	}
}

// Watermill's Deduplicator remembers a key when it first sees it, before the
// handler runs. A handler that fails once is nacked, and its redelivery is
// then acked as a duplicate without running: the message is lost. oncemill
// releases the key on a retryable failure, so the redelivery runs.
func TestDeduplicatorLosesARetriedMessageOncemillDoesNot(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		middleware  message.HandlerMiddleware
		wantEffects int32
	}{
		{"watermill Deduplicator", (&middleware.Deduplicator{KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil }}).Middleware, 0},
		{"oncemill", newStage(t, nil).Middleware, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rr := newRouterRun(t)
			var calls, effects atomic.Int32
			h := rr.router.AddConsumerHandler("payments", "in", rr.pubSub, failOnce(&calls, &effects))
			h.AddMiddleware(tc.middleware)
			rr.start()
			rr.publish("in", msg("m1", `{"payment_id":"p1"}`))
			rr.waitAcks(1)
			if effects.Load() != tc.wantEffects {
				t.Fatalf("effects = %d after %d handler calls, want %d", effects.Load(), calls.Load(), tc.wantEffects)
			}
		})
	}
}

// A crash after the record is written but before the router publishes the
// produced messages: the redelivery replays them with the original UUIDs.
func TestReplayRepublishesWhatACrashLost(t *testing.T) {
	t.Parallel()
	rr := newRouterRun(t)
	var calls atomic.Int32
	var produced string
	var crashed atomic.Bool
	h := rr.router.AddHandler("settle", "in", rr.pubSub, "out", rr.pubSub, func(m *message.Message) ([]*message.Message, error) {
		calls.Add(1)
		out := message.NewMessage(watermill.NewUUID(), []byte("settled"))
		produced = out.UUID
		return []*message.Message{out}, nil
	})
	// Models the process dying between the record and the publish: the first
	// delivery's produced messages never reach the broker, and it is not acked.
	h.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			out, err := next(m)
			if err == nil && crashed.CompareAndSwap(false, true) {
				return nil, errors.New("process killed before publishing")
			}
			return out, err
		}
	}, newStage(t, nil).Middleware)
	downstream, err := rr.pubSub.Subscribe(context.Background(), "out")
	if err != nil {
		t.Fatal(err)
	}
	rr.start()
	rr.publish("in", msg("m1", "pay"))
	select {
	case got := <-downstream:
		got.Ack()
		if got.UUID != produced || string(got.Payload) != "settled" {
			t.Fatalf("downstream got %s %q, want the originally produced %s", got.UUID, got.Payload, produced)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nothing reached downstream")
	}
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", calls.Load())
	}
}

// The scope defaults to the handler name: two handlers consuming one topic
// each process a message once, and each absorbs its own duplicates.
func TestScopeDefaultsToTheHandlerName(t *testing.T) {
	t.Parallel()
	rr := newRouterRun(t)
	var mu sync.Mutex
	scopes := map[string]int{}
	stage := newStage(t, func(c *stageConfig) {
		c.EventHandler = func(e pipeline.Event) {
			if e.Outcome == pipeline.OutcomeExecuted {
				mu.Lock()
				scopes[e.Scope]++
				mu.Unlock()
			}
		}
	})
	rr.router.AddMiddleware(stage.Middleware)
	var ledger, email atomic.Int32
	rr.router.AddConsumerHandler("ledger", "in", rr.pubSub, func(*message.Message) error { ledger.Add(1); return nil })
	rr.router.AddConsumerHandler("email", "in", rr.pubSub, func(*message.Message) error { email.Add(1); return nil })
	rr.start()
	rr.publish("in", msg("m1", "x"))
	rr.publish("in", msg("m1", "x"))
	rr.waitAcks(4)
	mu.Lock()
	defer mu.Unlock()
	if ledger.Load() != 1 || email.Load() != 1 || scopes["ledger"] != 1 || scopes["email"] != 1 {
		t.Fatalf("ledger %d email %d scopes %v; want each handler to run once in its own scope", ledger.Load(), email.Load(), scopes)
	}
}
