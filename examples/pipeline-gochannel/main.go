// Command pipeline-gochannel runs oncemill's whole pipeline in one process,
// on Watermill's gochannel and the memory store. A delivery goes through
//
//	validation → idempotency → retry → circuit breaker → handler
//
// and the program prints what each stage did with six deliveries:
//
//   - order-1 twice: the handler ships it once; the duplicate is replayed.
//   - order-2 has no quantity: validation refuses it before anything is
//     stored, and it goes to the dead-letter topic.
//   - order-3 meets a warehouse timeout (a transient failure): the retry
//     stage runs the handler again in process, and it ships.
//   - order-4 twice: out of stock, a permanent failure. It is cached and
//     dead-lettered once; the duplicate gets the cached failure, unrun.
//
// Nothing to configure: go run ./examples/pipeline-gochannel
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/sony/gobreaker/v2"

	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/memory"
)

var (
	errOutOfStock       = errors.New("out of stock")
	errWarehouseTimeout = errors.New("warehouse API timed out")
)

type order struct {
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
}

// validate refuses what can never be processed: it is acked, not stored.
func validate(msg *message.Message) error {
	var o order
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return err
	}
	if o.Quantity < 1 {
		return fmt.Errorf("quantity %d: must be 1 or more", o.Quantity)
	}
	return nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// run publishes the demo deliveries, prints what happened to out, and
// returns once every one of them was handled.
func run(ctx context.Context, out io.Writer) error {
	var mu sync.Mutex // the handlers run on goroutines of the router
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, format+"\n", args...)
	}

	st, err := memory.New(memory.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	// Publish returns once the message is acked, so the story prints in order.
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	defer pubSub.Close()

	r, err := receiver.New(st).
		// The policy classifies errors for every stage: errOutOfStock is
		// cached (not retried, and no strike against the breaker); any
		// other error is retryable.
		WithPolicy(policy.Policy{CachedErrors: []error{errOutOfStock}}).
		WithValidation(validate).
		WithRetry(pipeline.RetryConfig{
			InitialInterval: 50 * time.Millisecond,
			MaxTries:        3,
			OnRetry:         func(try int, err error, _ time.Duration) { say("  retry: try %d failed (%v), trying again", try, err) },
		}).
		WithCircuitBreaker(gobreaker.Settings{
			Name:    "warehouse",
			Timeout: 10 * time.Second, // open this long after more than 5 transient failures in a row
			OnStateChange: func(name string, from, to gobreaker.State) {
				say("  circuit %s: %s -> %s", name, from, to)
			},
		}).
		WithDeadLetter(pubSub, "orders.dead").
		WithEventHandler(func(e pipeline.Event) {
			if e.Err != nil {
				say("%s: %s (%v)", e.MessageUUID, e.Outcome, e.Err)
				return
			}
			say("%s: %s", e.MessageUUID, e.Outcome)
		}).
		Build()
	if err != nil {
		return err
	}

	shipped := map[string]int{} // the business effect, counted per order
	calls := map[string]int{}   // warehouse calls per order, to fail order-3's first
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	ship := router.AddConsumerHandler("ship", "orders", pubSub, func(msg *message.Message) error {
		var o order
		_ = json.Unmarshal(msg.Payload, &o) // validation passed
		mu.Lock()
		defer mu.Unlock()
		calls[msg.UUID]++
		switch {
		case msg.UUID == "order-3" && calls[msg.UUID] == 1:
			return errWarehouseTimeout // transient: retried
		case o.Item == "unobtainium":
			return fmt.Errorf("%s: %w", o.Item, errOutOfStock) // cached, never run again
		}
		shipped[msg.UUID]++
		fmt.Fprintf(out, "%s: shipped %d × %s\n", msg.UUID, o.Quantity, o.Item)
		return nil
	})
	// On this handler only: the dead-letter handler below must not run
	// through oncemill, or its messages would be validated and dead-lettered again.
	ship.AddMiddleware(r.Middleware)
	router.AddConsumerHandler("dead-letters", "orders.dead", pubSub, func(msg *message.Message) error {
		say("  dead letter: %s, %s on attempt %s: %s", msg.UUID, msg.Metadata.Get(pipeline.ReasonKindKey),
			msg.Metadata.Get(pipeline.AttemptKey), msg.Metadata.Get(middleware.ReasonForPoisonedKey))
		return nil
	})

	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case err := <-routerDone:
		return err
	}
	for _, d := range []struct{ uuid, payload string }{
		{"order-1", `{"item":"book","quantity":1}`},
		{"order-1", `{"item":"book","quantity":1}`}, // the broker delivers it again
		{"order-2", `{"item":"pen"}`},
		{"order-3", `{"item":"lamp","quantity":2}`},
		{"order-4", `{"item":"unobtainium","quantity":1}`},
		{"order-4", `{"item":"unobtainium","quantity":1}`},
	} {
		say("-> %s %s", d.uuid, d.payload)
		if err := pubSub.Publish("orders", message.NewMessage(d.uuid, []byte(d.payload))); err != nil {
			return err
		}
	}
	if err := router.Close(); err != nil {
		return err
	}
	if err := <-routerDone; err != nil {
		return err
	}

	mu.Lock()
	defer mu.Unlock()
	for _, uuid := range slices.Sorted(maps.Keys(shipped)) {
		fmt.Fprintf(out, "shipped %s %d time(s)\n", uuid, shipped[uuid])
	}
	return nil
}
