package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// harness is one scenario on one broker and one store, in a namespace of
// its own: a PostgreSQL schema or Redis prefix, and topic and queue names,
// that no other test uses.
type harness struct {
	t      *testing.T
	broker brokerKind
	store  storeKind
	ns     string
	pub    message.Publisher
}

// scope is the oncemill scope and ledger scope of every worker.
const scope = "payments"

func newHarness(t *testing.T, b brokerKind, s storeKind) *harness {
	var raw [5]byte
	_, _ = rand.Read(raw[:])
	h := &harness{t: t, broker: b, store: s, ns: "it_" + hex.EncodeToString(raw[:])}
	h.pub = b.publisher(t)
	t.Cleanup(func() {
		_ = h.pub.Close()
		b.cleanup(t, []string{h.payments(), h.settlements(), h.deadLetters()})
		s.cleanup(t, h.ns)
	})
	return h
}

// Topic names, as the worker derives them from --topic-prefix.
func (h *harness) payments() string    { return h.ns + "-payments-0" }
func (h *harness) settlements() string { return h.ns + "-settlements" }
func (h *harness) deadLetters() string { return h.ns + "-dead-letters" }

// start starts a worker (cmd/worker-rig, or the soak tool where the
// broker's client needs it); extra flags come last.
func (h *harness) start(name string, extra ...string) *worker {
	h.t.Helper()
	bin := env.workerBin
	if h.broker.soakOnly {
		bin = env.soakBin
	}
	return startWorker(h.t, bin, name, h.args(extra)...)
}

// startSoak starts the soak tool instead, for its test switches: faults
// carried in the commands, --gateway-latency, --hold-before-ack, --key.
func (h *harness) startSoak(name string, extra ...string) *worker {
	h.t.Helper()
	return startWorker(h.t, env.soakBin, name, h.args(extra)...)
}

func (h *harness) args(extra []string) []string {
	args := append(h.broker.workerArgs(), h.store.workerArgs(h.ns)...)
	args = append(args,
		"--topic-prefix="+h.ns+"-", "--consumer-group="+h.ns, "--scope="+scope, "--partitions=1",
		"--lease=2s", "--drain-timeout=20s")
	return append(args, extra...)
}

// publish publishes msgs to the payments topic, in order.
func (h *harness) publish(msgs ...*message.Message) {
	h.t.Helper()
	h.publishTo(h.payments(), msgs...)
}

func (h *harness) publishTo(topic string, msgs ...*message.Message) {
	h.t.Helper()
	for _, m := range msgs {
		if err := h.pub.Publish(topic, m); err != nil {
			h.t.Fatalf("publish to %s: %v", topic, err)
		}
	}
}

// ledger is the number of charges per payment_id.
func (h *harness) ledger() map[string]int {
	h.t.Helper()
	return h.store.ledger(h.t, h.ns, scope)
}

// command is a payment command as the worker reads it.
type command struct {
	PaymentID   string `json:"payment_id"`
	Account     string `json:"account"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Meta        struct {
		SentAt  string `json:"sent_at"`
		Attempt int    `json:"attempt"`
	} `json:"meta"`
	Fault string `json:"fault,omitempty"`
}

// newCommand is a command under a new UUID, stamped now with attempt.
func newCommand(t *testing.T, paymentID string, amount int64, fault string, attempt int) *message.Message {
	c := command{PaymentID: paymentID, Account: "acc-1", AmountCents: amount, Currency: "EUR", Fault: fault}
	c.Meta.SentAt = time.Now().UTC().Format(time.RFC3339Nano)
	c.Meta.Attempt = attempt
	payload, err := json.Marshal(c)
	must(t, err)
	return message.NewMessage(watermill.NewUUID(), payload)
}

// again is the same message (UUID and payload) once more, as a broker
// redelivers it.
func again(m *message.Message) *message.Message { return message.NewMessage(m.UUID, m.Payload) }

// observer consumes a topic downstream of the workers and keeps what it got.
type observer struct {
	mu   sync.Mutex
	msgs []*message.Message
}

func (h *harness) observe(topic string) *observer {
	h.t.Helper()
	sub := h.broker.subscriber(h.t, h.ns+"-observer-"+topic)
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		cancel()
		h.t.Fatalf("subscribe to %s: %v", topic, err)
	}
	o := &observer{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ch {
			o.mu.Lock()
			o.msgs = append(o.msgs, m)
			o.mu.Unlock()
			m.Ack()
		}
	}()
	h.t.Cleanup(func() {
		cancel()
		_ = sub.Close()
		<-done
	})
	return o
}

// count is how many received messages have uuid.
func (o *observer) count(uuid string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, m := range o.msgs {
		if m.UUID == uuid {
			n++
		}
	}
	return n
}

// received returns the messages received so far.
func (o *observer) received() []*message.Message {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]*message.Message(nil), o.msgs...)
}

// get fetches path from the worker's HTTP endpoints.
func get(t *testing.T, w *worker, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + w.httpAddr() + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, string(body)
}
