package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/sony/gobreaker/v2"

	"github.com/oncemill/oncemill/oncemilltest"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
)

// shipper is the program's ship handler as a test builds it. run keeps its
// handler and receiver inside itself, out of a test's reach, so this one
// follows them: the same orders, validation, policy and errors, with the
// shipments counted by oncemilltest.Effects instead of a map.
type shipper struct {
	shipped oncemilltest.Effects // the business effect
	calls   oncemilltest.Effects // warehouse calls, to fail order-3's first
}

func (s *shipper) ship(msg *message.Message) error {
	var o order
	_ = json.Unmarshal(msg.Payload, &o) // validation passed
	if msg.UUID == "order-3" && s.calls.Add(msg.UUID) == 1 {
		return errWarehouseTimeout // transient: retried
	}
	if o.Item == "unobtainium" {
		return fmt.Errorf("%s: %w", o.Item, errOutOfStock) // cached, never run again
	}
	s.shipped.Add(msg.UUID)
	return nil
}

// newBuilder is run's receiver over st, less its telemetry callbacks and
// dead-letter topic.
func newBuilder(st store.Store) *receiver.Builder {
	return receiver.New(st).
		WithPolicy(policy.Policy{CachedErrors: []error{errOutOfStock}}).
		WithValidation(validate).
		WithRetry(pipeline.RetryConfig{InitialInterval: time.Millisecond, MaxTries: 3}).
		WithCircuitBreaker(gobreaker.Settings{Name: "warehouse", Timeout: 10 * time.Second})
}

func newStore(t *testing.T) *memory.Store {
	t.Helper()
	st, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func newOrder(uuid, payload string) *message.Message {
	return message.NewMessage(uuid, []byte(payload))
}

// TestShipWithOncemilltest checks the example's handler with oncemilltest:
// every way a broker delivers an order, and what each comes to.
func TestShipWithOncemilltest(t *testing.T) {
	t.Run("a duplicate ships once", func(t *testing.T) {
		var s shipper
		ds := oncemilltest.DeliverTwice(t, newBuilder(newStore(t)), oncemilltest.NoPublish(s.ship),
			newOrder("order-1", `{"item":"book","quantity":1}`))
		ds.RequireOutcomes(t, pipeline.OutcomeExecuted, pipeline.OutcomeReplayed)
		ds.RequireExecutedOnce(t)
		ds.RequireAllAcked(t)
		s.shipped.RequireCount(t, "order-1", 1)
	})

	t.Run("concurrent duplicates ship once", func(t *testing.T) {
		var s shipper
		ds := oncemilltest.DeliverConcurrently(t, newBuilder(newStore(t)), oncemilltest.NoPublish(s.ship),
			newOrder("order-1", `{"item":"book","quantity":1}`), 4)
		ds.RequireExecutedOnce(t)
		ds.RequireAllAcked(t)
		s.shipped.RequireCount(t, "order-1", 1)
	})

	t.Run("an invalid order never ships", func(t *testing.T) {
		var s shipper
		ds := oncemilltest.DeliverTwice(t, newBuilder(newStore(t)), oncemilltest.NoPublish(s.ship),
			newOrder("order-2", `{"item":"pen"}`))
		ds.RequireOutcomes(t, pipeline.OutcomeInvalid, pipeline.OutcomeInvalid)
		ds.RequireRuns(t, 0)
		ds.RequireAllAcked(t)
		s.shipped.RequireCount(t, "order-2", 0)
	})

	t.Run("a warehouse timeout is retried in process", func(t *testing.T) {
		var s shipper
		ds := oncemilltest.DeliverTwice(t, newBuilder(newStore(t)), oncemilltest.NoPublish(s.ship),
			newOrder("order-3", `{"item":"lamp","quantity":2}`))
		ds.RequireOutcomes(t, pipeline.OutcomeExecuted, pipeline.OutcomeReplayed)
		ds.RequireRuns(t, 2) // both in the first delivery
		s.shipped.RequireCount(t, "order-3", 1)
	})

	t.Run("out of stock is cached", func(t *testing.T) {
		var s shipper
		ds := oncemilltest.DeliverTwice(t, newBuilder(newStore(t)), oncemilltest.NoPublish(s.ship),
			newOrder("order-4", `{"item":"unobtainium","quantity":1}`))
		ds.RequireOutcomes(t, pipeline.OutcomeCachedFailure, pipeline.OutcomeCachedFailureReplayed)
		ds.RequireRuns(t, 1)
		ds.RequireAllAcked(t)
		s.shipped.RequireCount(t, "order-4", 0)
	})

	// The lease mode's limit, pinned: a worker that dies after shipping and
	// before the outcome is recorded ships again on the redelivery. The
	// example's handler counts shipments in memory, so it ships twice; a
	// real one passes the order's UUID to the warehouse as its idempotency
	// key, or writes its effect in the one-transaction mode.
	t.Run("a crash after shipping ships again", func(t *testing.T) {
		var s shipper
		ds := oncemilltest.DeliverAfterCrash(t, newBuilder, oncemilltest.NoPublish(s.ship),
			newOrder("order-5", `{"item":"desk","quantity":1}`))
		ds.RequireOutcomes(t, pipeline.OutcomeExecuted, pipeline.OutcomeExecuted)
		if !ds[1].Event.Takeover || !ds[1].Acked {
			t.Errorf("the redelivery did not take the crashed lease over: takeover %v, acked %v", ds[1].Event.Takeover, ds[1].Acked)
		}
		s.shipped.RequireCount(t, "order-5", 2)
	})

	// The program's wiring with every message handled twice by the router:
	// DuplicatingMiddleware is added to the router before the receiver is
	// added to the handler, so it runs outside it.
	t.Run("a router that duplicates every order", func(t *testing.T) {
		var s shipper
		r, err := newBuilder(newStore(t)).Build()
		if err != nil {
			t.Fatal(err)
		}
		pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
		defer pubSub.Close()
		router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		router.AddMiddleware(oncemilltest.DuplicatingMiddleware(2))
		ship := router.AddConsumerHandler("ship", "orders", pubSub, s.ship)
		ship.AddMiddleware(r.Middleware)

		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		routerDone := make(chan error, 1)
		go func() { routerDone <- router.Run(ctx) }()
		<-router.Running()
		for _, o := range []struct{ uuid, payload string }{
			{"order-1", `{"item":"book","quantity":1}`},
			{"order-2", `{"item":"pen"}`},
			{"order-3", `{"item":"lamp","quantity":2}`},
			{"order-4", `{"item":"unobtainium","quantity":1}`},
		} {
			if err := pubSub.Publish("orders", newOrder(o.uuid, o.payload)); err != nil {
				t.Fatal(err)
			}
		}
		if err := router.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-routerDone; err != nil {
			t.Fatal(err)
		}
		s.shipped.RequireEachOnce(t) // order-1 and order-3
		s.shipped.RequireCount(t, "order-2", 0)
		s.shipped.RequireCount(t, "order-4", 0)
	})
}
