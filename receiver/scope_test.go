package receiver_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/memory"
	"github.com/oncemill/oncemill/store/storetest"
)

// Through the builder and a router: WithScopeFunc gives each tenant its own
// record of a shared key, and WithRetentionFor keeps the handler's records
// for its own TTL.
func TestWithScopeFuncAndWithRetentionFor(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	st, err := memory.New(memory.Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r, err := receiver.New(st).
		WithScopeFunc(func(m *message.Message) (string, error) { return m.Metadata.Get("tenant"), nil }).
		WithRetentionFor("payments", 7*24*time.Hour, 0).
		Build()
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	tr := startTelRouter(t, r, "payments", "payments.in", func(*message.Message) ([]*message.Message, error) { runs++; return nil, nil })
	for _, tenant := range []string{"acme", "globex", "acme", "globex"} {
		m := message.NewMessage("order-1", []byte("{}"))
		m.Metadata.Set("tenant", tenant)
		tr.deliver("payments.in", m)
	}
	if runs != 2 {
		t.Fatalf("handler ran %d times, want once per tenant", runs)
	}
	for _, tenant := range []string{"acme", "globex"} {
		rec, err := st.Get(context.Background(), tenant, "order-1")
		if err != nil {
			t.Fatalf("%s/order-1: %v", tenant, err)
		}
		if ttl := rec.ExpiresAt.Sub(clock.Now()); ttl != 7*24*time.Hour {
			t.Errorf("%s/order-1 expires in %v, want the handler's week", tenant, ttl)
		}
	}
}
