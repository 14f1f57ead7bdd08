package oncemilltest_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/oncemill/oncemill/oncemilltest"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/receiver"
)

// outcomes counts the receiver's outcomes per message.
type outcomes struct {
	mu sync.Mutex
	by map[string][]pipeline.Outcome
}

func (o *outcomes) record(e pipeline.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.by == nil {
		o.by = map[string][]pipeline.Outcome{}
	}
	o.by[e.MessageUUID] = append(o.by[e.MessageUUID], e.Outcome)
}

func (o *outcomes) get(uuid string) []pipeline.Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]pipeline.Outcome(nil), o.by[uuid]...)
}

// runRouter runs a gochannel router whose "charge" handler charges p,
// with DuplicatingMiddleware(times) outside the receiver built from b (nil:
// no receiver), publishes n messages, and returns once each was acked.
func runRouter(t *testing.T, b *receiver.Builder, p *payments, times, n int) {
	t.Helper()
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	t.Cleanup(func() { pubSub.Close() })
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	// Added first, so outermost: the receiver inside sees every copy.
	router.AddMiddleware(oncemilltest.DuplicatingMiddleware(times))
	handler := router.AddHandler("charge", "payments", pubSub, "receipts", pubSub, p.handle)
	if b != nil {
		r, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		handler.AddMiddleware(r.Middleware)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	<-router.Running()
	for i := range n {
		if err := pubSub.Publish("payments", message.NewMessage(fmt.Sprintf("pay-%d", i), []byte("1.00 EUR"))); err != nil {
			t.Fatal(err)
		}
	}
	if err := router.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestDuplicatingMiddlewareThroughReceiver(t *testing.T) {
	var p payments
	var seen outcomes
	b := receiver.New(newStore(t)).WithPolicy(testPolicy()).WithEventHandler(seen.record)
	runRouter(t, b, &p, 3, 20)
	p.charges.RequireEachOnce(t)
	for i := range 20 {
		uuid := fmt.Sprintf("pay-%d", i)
		got := seen.get(uuid)
		if fmt.Sprint(got) != "[executed replayed replayed]" {
			t.Errorf("%s: outcomes %v, want executed and two replays", uuid, got)
		}
		if p.charges.Count(uuid) != 1 {
			t.Errorf("%s charged %d times", uuid, p.charges.Count(uuid))
		}
	}
	if len(seen.by) != 20 {
		t.Errorf("%d messages seen, want 20", len(seen.by))
	}
}

// Without the receiver the handler really runs once per copy: the
// duplicates are real.
func TestDuplicatingMiddlewareWithoutReceiver(t *testing.T) {
	var p payments
	runRouter(t, nil, &p, 2, 5)
	for i := range 5 {
		p.charges.RequireCount(t, fmt.Sprintf("pay-%d", i), 2)
	}
}

func TestDuplicatingMiddlewareCopiesAndErrors(t *testing.T) {
	msg := message.NewMessage("m-1", []byte("payload"))
	msg.Metadata.Set("k", "v")
	var got []*message.Message
	h := func(m *message.Message) ([]*message.Message, error) {
		got = append(got, m)
		if len(got) == 3 {
			return nil, errTimeout
		}
		return []*message.Message{message.NewMessage(fmt.Sprintf("out-%d", len(got)), nil)}, nil
	}
	produced, err := oncemilltest.DuplicatingMiddleware(2)(h)(msg)
	if err != nil || len(produced) != 2 || produced[0].UUID != "out-1" || produced[1].UUID != "out-2" {
		t.Fatalf("produced %v, %v; want both deliveries' messages", produced, err)
	}
	if got[0] != msg || got[1] == msg || got[1].UUID != "m-1" || string(got[1].Payload) != "payload" || got[1].Metadata.Get("k") != "v" {
		t.Errorf("the handler got %v; want the message, then a copy", got)
	}
	// The first error ends the message: the router nacks it.
	got = got[:0]
	if produced, err := oncemilltest.DuplicatingMiddleware(5)(h)(msg); err != errTimeout || produced != nil || len(got) != 3 {
		t.Errorf("produced %v, %v after %d runs; want the third run's error and no messages", produced, err, len(got))
	}
}

func TestDuplicatingMiddlewarePanicsBelowOne(t *testing.T) {
	defer func() {
		if r := recover(); r != "oncemill: oncemilltest: DuplicatingMiddleware(0): a message is handled at least once" {
			t.Errorf("recovered %v", r)
		}
	}()
	oncemilltest.DuplicatingMiddleware(0)
}
