package idempotency_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/oncemill/oncemill/internal/idempotency"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/store/memory"
)

// The lease mode's stage used alone, as the middleware of a Watermill
// router: a message delivered twice runs once.
func ExampleLeased_Middleware() {
	st, err := memory.New(memory.Options{})
	if err != nil {
		panic(err)
	}
	defer st.Close()
	done := make(chan struct{}, 2)
	stage, err := idempotency.NewLeased(st, idempotency.Config{
		Scope: "invoices", // the default key is the message UUID
		EventHandler: func(e pipeline.Event) {
			fmt.Println("outcome:", e.Outcome)
			done <- struct{}{}
		},
	})
	if err != nil {
		panic(err)
	}

	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	router.AddConsumerHandler("invoices", "orders", pubSub, func(m *message.Message) error {
		fmt.Println("issuing invoice for", string(m.Payload))
		return nil
	}).AddMiddleware(stage.Middleware)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { _ = router.Run(ctx); close(stopped) }()
	<-router.Running()

	for range 2 { // a broker's redelivery
		if err := pubSub.Publish("orders", message.NewMessage("order-7", []byte("order 7"))); err != nil {
			panic(err)
		}
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			panic("no delivery")
		}
	}
	cancel()
	<-stopped
	// Output:
	// issuing invoice for order 7
	// outcome: executed
	// outcome: replayed
}

// The stage as a plain handler middleware: a duplicate gets the messages
// the first delivery produced, with their UUIDs, without running again.
func ExampleLeased_Middleware_replay() {
	st, err := memory.New(memory.Options{})
	if err != nil {
		panic(err)
	}
	defer st.Close()
	stage, err := idempotency.NewLeased(st, idempotency.Config{
		Scope:        "invoices",
		EventHandler: func(e pipeline.Event) { fmt.Println("outcome:", e.Outcome) },
	})
	if err != nil {
		panic(err)
	}
	handler := stage.Middleware(func(m *message.Message) ([]*message.Message, error) {
		fmt.Println("issuing invoice for", string(m.Payload))
		return []*message.Message{message.NewMessage("invoice-1", []byte("issued"))}, nil
	})
	for range 2 {
		out, _ := handler(message.NewMessage("order-7", []byte("order 7")))
		fmt.Println("produced:", out[0].UUID)
	}
	// Output:
	// issuing invoice for order 7
	// outcome: executed
	// produced: invoice-1
	// outcome: replayed
	// produced: invoice-1
}
