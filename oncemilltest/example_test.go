package oncemilltest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/oncemill/oncemill/oncemilltest"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
)

// A handler's test delivers a payment twice, as a broker whose ack was lost
// does: the handler runs once, the duplicate is replayed, and the charge
// happens once.
func Example() {
	t := &testing.T{} // in a test: the test's own t

	var charges oncemilltest.Effects
	charge := func(msg *message.Message) error {
		charges.Add(msg.UUID) // where the real charge would be
		return nil
	}
	st, _ := memory.New(memory.Options{})
	defer st.Close()

	msg := message.NewMessage("pay-1", []byte(`{"amount":1200}`))
	ds := oncemilltest.DeliverTwice(t, receiver.New(st), oncemilltest.NoPublish(charge), msg)
	ds.RequireOutcomes(t, pipeline.OutcomeExecuted, pipeline.OutcomeReplayed)
	ds.RequireExecutedOnce(t)
	charges.RequireCount(t, "pay-1", 1)

	fmt.Println(ds[0].Event.Outcome, ds[1].Event.Outcome, "charged", charges.Count("pay-1"))
	// Output: executed replayed charged 1
}

// Three workers get the same message at once: one runs it, the others wait
// for it and replay its outcome.
func ExampleDeliverConcurrently() {
	t := &testing.T{} // in a test: the test's own t

	var charges oncemilltest.Effects
	st, _ := memory.New(memory.Options{})
	defer st.Close()

	ds := oncemilltest.DeliverConcurrently(t, receiver.New(st), oncemilltest.NoPublish(func(msg *message.Message) error {
		charges.Add(msg.UUID)
		return nil
	}), message.NewMessage("pay-2", nil), 3)
	ds.RequireExecutedOnce(t)

	for _, d := range ds {
		fmt.Print(d.Event.Outcome, " ")
	}
	fmt.Println("charged", charges.Count("pay-2"))
	// Output: executed replayed replayed charged 1
}

// A worker dies after the charge and before the outcome is recorded: the
// redelivery takes the expired lease over and runs the handler again. A
// handler that writes its effect with a unique key (here a ledger checked
// before writing, as INSERT ... ON CONFLICT DO NOTHING does) still charges
// once; the runs are two, as the lease mode allows.
func ExampleDeliverAfterCrash() {
	t := &testing.T{} // in a test: the test's own t

	var ledger, runs oncemilltest.Effects
	charge := func(msg *message.Message) error {
		runs.Add(msg.UUID)
		if ledger.Count(msg.UUID) == 0 {
			ledger.Add(msg.UUID)
		}
		return nil
	}
	newBuilder := func(st store.Store) *receiver.Builder {
		return receiver.New(st) // with the test's policy and options
	}
	ds := oncemilltest.DeliverAfterCrash(t, newBuilder, oncemilltest.NoPublish(charge), message.NewMessage("pay-3", nil))
	ds.RequireOutcomes(t, pipeline.OutcomeExecuted, pipeline.OutcomeExecuted)
	ledger.RequireCount(t, "pay-3", 1)

	for _, d := range ds {
		fmt.Println(d.Event.Outcome, "attempt", d.Event.Attempt, "takeover", d.Event.Takeover, "crashed", d.Crashed, "acked", d.Acked)
	}
	fmt.Println("runs", runs.Count("pay-3"), "ledger rows", ledger.Count("pay-3"))
	// Output:
	// executed attempt 1 takeover false crashed true acked false
	// executed attempt 2 takeover true crashed false acked true
	// runs 2 ledger rows 1
}

// An integration test: the router handles every message three times, and
// the receiver, inside the duplicating middleware, runs each once.
func ExampleDuplicatingMiddleware() {
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	var charges oncemilltest.Effects
	r, _ := receiver.New(st).
		WithEventHandler(func(e pipeline.Event) { fmt.Println(e.MessageUUID, e.Outcome) }).
		Build()

	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	router.AddMiddleware(oncemilltest.DuplicatingMiddleware(3)) // first: outside the receiver
	handler := router.AddConsumerHandler("charge", "payments", pubSub, func(msg *message.Message) error {
		charges.Add(msg.UUID)
		return nil
	})
	handler.AddMiddleware(r.Middleware)
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()

	for _, uuid := range []string{"pay-5", "pay-6"} {
		_ = pubSub.Publish("payments", message.NewMessage(uuid, nil)) // returns once acked
	}
	_ = router.Close()
	fmt.Println("charged", charges.Count("pay-5"), charges.Count("pay-6"))
	// Output:
	// pay-5 executed
	// pay-5 replayed
	// pay-5 replayed
	// pay-6 executed
	// pay-6 replayed
	// pay-6 replayed
	// charged 1 1
}
