package receiver_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/memory"
)

var errInsufficientFunds = errors.New("insufficient funds")

// Example is the README's quick start: a Watermill router on gochannel,
// the receiver as its middleware, and a broker that delivers a payment
// twice. The handler runs once; the duplicate is acked without running it.
func Example() {
	st, err := memory.New(memory.Options{})
	if err != nil {
		panic(err)
	}
	defer st.Close()

	events := make(chan pipeline.Event)
	r, err := receiver.New(st).
		WithPolicy(policy.Policy{
			SuccessTTL:   24 * time.Hour,
			CachedErrors: []error{errInsufficientFunds},
		}).
		WithEventHandler(func(e pipeline.Event) { events <- e }).
		Build()
	if err != nil {
		panic(err)
	}

	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(r.Middleware)
	router.AddConsumerHandler("charge", "payments", pubSub, func(m *message.Message) error {
		lease, _ := pipeline.ClaimFromContext(m.Context())
		fmt.Println("charging", string(m.Payload), "token", lease.Token)
		return nil
	})
	go func() { _ = router.Run(context.Background()) }()
	defer router.Close()
	<-router.Running()

	// The broker delivers the same message twice.
	for range 2 {
		if err := pubSub.Publish("payments", message.NewMessage("pay-1", []byte("12.00 EUR"))); err != nil {
			panic(err)
		}
		e := <-events // what became of the delivery
		fmt.Println(e.Key, e.Outcome)
	}
	// Output:
	// charging 12.00 EUR token 1
	// pay-1 executed
	// pay-1 replayed
}

func ExampleBuilder_Build_error() {
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	_, err := receiver.New(st).
		WithPolicy(policy.Policy{LeaseDuration: time.Second, Heartbeat: 2 * time.Second}).
		Build()
	fmt.Println(errors.Is(err, oncemill.ErrInvalidConfig))
	fmt.Println(err)
	// Output:
	// true
	// oncemill: invalid configuration: WithPolicy(Policy.Heartbeat): 2s is not shorter than LeaseDuration 1s, so the lease would expire between beats; use less than LeaseDuration, or leave it 0 for 333.333333ms (a third of LeaseDuration, room for two missed beats)
}

// One receiver, many tenants: the scope is each message's tenant, so the
// same key sent by two tenants runs once for each.
func ExampleBuilder_WithScopeFunc() {
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	r, err := receiver.New(st).
		WithScopeFunc(func(m *message.Message) (string, error) { return m.Metadata.Get("tenant"), nil }).
		WithEventHandler(func(e pipeline.Event) { fmt.Println(e.Scope, e.Key, e.Outcome) }).
		Build()
	if err != nil {
		panic(err)
	}
	h := r.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	for _, tenant := range []string{"acme", "globex", "acme"} {
		m := message.NewMessage("invoice-7", []byte("{}"))
		m.Metadata.Set("tenant", tenant)
		if _, err := h(m); err != nil {
			panic(err)
		}
	}
	// Output:
	// acme invoice-7 executed
	// globex invoice-7 executed
	// acme invoice-7 replayed
}

// ExampleBuilder_WithShadow measures before it enforces: in shadow mode a
// duplicate runs the handler, and its event says what enforcement would
// have done. The same store then enforces: the records written in shadow
// answer the duplicate.
func ExampleBuilder_WithShadow() {
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	handler := func(m *message.Message) ([]*message.Message, error) {
		fmt.Println("charging", string(m.Payload))
		return nil, nil
	}
	report := func(e pipeline.Event) { fmt.Println(e.Key, e.Outcome, "shadow:", e.Shadow) }

	shadow, _ := receiver.New(st).WithScope("charge").WithShadow(true).WithEventHandler(report).Build()
	for range 2 {
		_, _ = shadow.Middleware(handler)(message.NewMessage("pay-1", []byte("12.00 EUR")))
	}
	enforcing, _ := receiver.New(st).WithScope("charge").WithEventHandler(report).Build()
	_, _ = enforcing.Middleware(handler)(message.NewMessage("pay-1", []byte("12.00 EUR")))
	// Output:
	// charging 12.00 EUR
	// pay-1 executed shadow: false
	// charging 12.00 EUR
	// pay-1 replayed shadow: true
	// pay-1 replayed shadow: false
}
