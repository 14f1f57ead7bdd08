package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/ThreeDotsLabs/watermill"
	amqp2 "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	amqp3 "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/redisstore"
)

// TestQuorumQueueDeliveryLimit: RabbitMQ 4 gives a
// quorum queue a delivery limit of 20 by default, and drops (or
// dead-letters) a message delivered past it; every nack spends one
// delivery: a retryable failure's, a held key's, a store failure's. The
// RabbitMQ of these tests is 3.x, so the queue sets `x-delivery-limit: 20`
// itself, and the broker's own dead letter (`x-dead-letter-exchange`) is a
// queue the test reads: what lands there is what the broker dropped.
//
// marshaler: watermill-amqp's DefaultMarshaler (v2 and v3) refuses the
// integer `x-delivery-count` header the quorum queue adds to a redelivery,
// and the subscriber nacks that delivery at once without running the
// handler: one retryable failure, and the message is dropped within
// seconds (*_default). quorumMarshalerV3 and V2, which copy the header as
// a string (docs/amqp.md; the example worker has V3's), redeliver it to
// the handler (*_quorum).
//
// store_cut_60s and handler_db_cut_60s: a 60 s cut of the store (Redis,
// lease mode) and of the handler's database (PostgreSQL, the handler fails
// retryably), under the default policy with a dead letter set. Every
// message must be processed exactly once or dead-lettered by oncemill (with
// its reason), and none dropped by the broker; the highest
// `x-delivery-count` is logged (docs/amqp.md quotes it).
func TestQuorumQueueDeliveryLimit(t *testing.T) {
	t.Run("marshaler", func(t *testing.T) {
		t.Parallel()
		for _, client := range []string{"v2", "v3"} {
			for _, quorum := range []bool{false, true} {
				name := client + "_" + map[bool]string{false: "default", true: "quorum"}[quorum]
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					testQuorumMarshaler(t, client, quorum)
				})
			}
		}
	})
	t.Run("store_cut_60s", func(t *testing.T) {
		t.Parallel()
		runQuorumOutage(t, "store")
	})
	t.Run("handler_db_cut_60s", func(t *testing.T) {
		t.Parallel()
		runQuorumOutage(t, "handler")
	})
}

const (
	quorumDeliveryLimit = 20 // RabbitMQ 4's default
	quorumMessages      = 100
	quorumCutAfter      = 20 // executed before the cut
	quorumCut           = 60 * time.Second
	deliveryCountHeader = "x-delivery-count"
)

// quorumMarshalerV3 is the marshaler of docs/amqp.md and the example worker
// (cmd/example-worker/main.go): the default one, with the quorum queue's
// integer x-delivery-count copied as a string.
var quorumMarshalerV3 = amqp3.DefaultMarshaler{PreprocessDelivery: func(d amqp091.Delivery) amqp091.Delivery {
	if n, ok := d.Headers["x-delivery-count"]; ok {
		d.Headers["x-delivery-count"] = fmt.Sprint(n)
	}
	return d
}}

// quorumMarshalerV2 does the same for watermill-amqp/v2, whose
// DefaultMarshaler has no PreprocessDelivery.
type quorumMarshalerV2 struct{ amqp2.DefaultMarshaler }

func (m quorumMarshalerV2) Unmarshal(d amqp091.Delivery) (*message.Message, error) {
	if n, ok := d.Headers["x-delivery-count"]; ok {
		d.Headers["x-delivery-count"] = fmt.Sprint(n)
	}
	return m.DefaultMarshaler.Unmarshal(d)
}

// quorumArgs declare a quorum queue with RabbitMQ 4's delivery limit, whose
// broker dead letter goes to the queue dropped.
func quorumArgs(dropped string) amqp091.Table {
	return amqp091.Table{
		"x-queue-type":              "quorum",
		"x-delivery-limit":          quorumDeliveryLimit,
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": dropped,
	}
}

// quorumQueues declares the queue the broker dead-letters to, and removes
// the test's queues at the end.
func quorumQueues(t *testing.T, dropped string, queues ...string) {
	ch, closeConn := amqpChannel(t)
	defer closeConn()
	_, err := ch.QueueDeclare(dropped, true, false, false, false, nil)
	must(t, err)
	t.Cleanup(func() { amqpKind("", "", nil, nil).cleanup(t, append(queues, dropped)) })
}

// amqpChannel is a channel on a connection of its own; closing the
// connection (close) closes both.
func amqpChannel(t *testing.T) (ch *amqp091.Channel, close func()) {
	conn, err := amqp091.Dial(env.amqpURL)
	must(t, err)
	ch, err = conn.Channel()
	if err != nil {
		_ = conn.Close()
		t.Fatal(err)
	}
	return ch, func() { _ = conn.Close() }
}

// brokerDropped is the UUIDs of the messages in the broker's dead letter
// queue, with the reasons RabbitMQ gives (x-first-death-reason).
func brokerDropped(t *testing.T, queue string) map[string]string {
	ch, closeConn := amqpChannel(t)
	defer closeConn()
	out := map[string]string{}
	for {
		d, ok, err := ch.Get(queue, true)
		must(t, err)
		if !ok {
			return out
		}
		id, _ := d.Headers[amqp3.DefaultMessageUUIDHeaderKey].(string)
		out[id] = fmt.Sprint(d.Headers["x-first-death-reason"])
	}
}

var errQuorumTransient = errors.New("transient failure")

// testQuorumMarshaler: one message fails retryably once, on a quorum queue
// read with the client's DefaultMarshaler (the broker drops it) or with
// its quorum marshaler (the second attempt succeeds).
func testQuorumMarshaler(t *testing.T, client string, quorum bool) {
	var raw [5]byte
	_, _ = rand.Read(raw[:])
	ns := "it_quorum_" + hex.EncodeToString(raw[:])
	topic, dropped := ns+"-in", ns+"-broker-dropped"
	quorumQueues(t, dropped, topic)
	t.Cleanup(func() { storeKindNamed(t, "redis").cleanup(t, ns) })

	var pub message.Publisher
	var sub message.Subscriber
	var err error
	if client == "v2" {
		c := amqp2.NewDurableQueueConfig(env.amqpURL)
		c.Queue.Arguments = quorumArgs(dropped)
		if quorum {
			c.Marshaler = quorumMarshalerV2{}
		}
		pub, err = amqp2.NewPublisher(c, logger())
		must(t, err)
		sub, err = amqp2.NewSubscriber(c, logger())
	} else {
		c := amqp3.NewDurableQueueConfig(env.amqpURL)
		c.Queue.Arguments = quorumArgs(dropped)
		if quorum {
			c.Marshaler = quorumMarshalerV3
		}
		pub, err = amqp3.NewPublisher(c, logger())
		must(t, err)
		sub, err = amqp3.NewSubscriber(c, logger())
	}
	must(t, err)
	t.Cleanup(func() { _ = pub.Close(); _ = sub.Close() })

	st, err := redisstore.New(redisClient(t), redisstore.Options{Prefix: ns})
	must(t, err)
	t.Cleanup(func() { _ = st.Close() })
	rc, err := receiver.New(st).WithScope("quorum").WithMessagingSystem(semconv.MessagingSystemRabbitMQ).
		WithDeadLetter(pub, ns+"-dead-letters").Build()
	must(t, err)
	var runs atomic.Int64
	var count atomic.Pointer[string] // the second run's x-delivery-count
	stop := startRouter(t, topic, sub, rc.Middleware, func(m *message.Message) error {
		if runs.Add(1) == 1 {
			return errQuorumTransient
		}
		v := m.Metadata.Get(deliveryCountHeader)
		count.Store(&v)
		return nil
	})
	defer stop()

	id := watermill.NewUUID()
	start := time.Now()
	must(t, pub.Publish(topic, message.NewMessage(id, []byte(`{"cents":100}`))))
	if quorum {
		eventually(t, limit, func() bool { return runs.Load() >= 2 },
			func() string {
				return fmt.Sprintf("the handler ran %d times; broker dropped %v", runs.Load(), brokerDropped(t, dropped))
			})
		took := time.Since(start)
		time.Sleep(time.Second) // a late run, or a late drop
		got := brokerDropped(t, dropped)
		var second string
		if p := count.Load(); p != nil {
			second = *p
		}
		t.Logf("%s quorum marshaler: second attempt %v after publishing, x-delivery-count %q; %d dropped by the broker",
			client, took.Round(100*time.Millisecond), second, len(got))
		if len(got) > 0 || runs.Load() != 2 || second != "1" {
			t.Errorf("the handler ran %d times (want 2), the second with x-delivery-count %q (want \"1\"); broker dropped %v (want none)", runs.Load(), second, got)
		}
		return
	}
	var got map[string]string
	eventually(t, limit, func() bool { got = brokerDropped(t, dropped); return len(got) > 0 },
		func() string { return fmt.Sprintf("the broker dropped nothing; the handler ran %d times", runs.Load()) })
	t.Logf("%s DefaultMarshaler: dropped by the broker (%s) %v after publishing; the handler ran %d times",
		client, got[id], time.Since(start).Round(100*time.Millisecond), runs.Load())
	if reason, ok := got[id]; !ok || reason != "delivery_limit" {
		t.Errorf("broker dead letters %v; want %s for reason delivery_limit", got, id)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times; want once (the redeliveries never reach it)", n)
	}
}

// quorumRun is what one outage run saw.
type quorumRun struct {
	mu         sync.Mutex
	executed   map[string]int    // handler successes per message
	maxCount   map[string]int    // highest x-delivery-count per message
	outcomes   map[string]int    // per outcome
	deadLetter map[string]string // oncemill's dead letters: UUID → reason kind
	dlCount    int
	nExecuted  atomic.Int64
}

func (r *quorumRun) done(ids []string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, id := range ids {
		if r.executed[id] > 0 || r.deadLetter[id] != "" {
			n++
		}
	}
	return n
}

// runQuorumOutage cuts what (the store or the handler's database) for
// quorumCut once quorumCutAfter messages are executed.
func runQuorumOutage(t *testing.T, what string) {
	var raw [5]byte
	_, _ = rand.Read(raw[:])
	ns := "it_quorum_" + hex.EncodeToString(raw[:])
	topic, dlTopic, dropped := ns+"-in", ns+"-dead-letters", ns+"-broker-dropped"
	quorumQueues(t, dropped, topic, dlTopic)
	t.Cleanup(func() {
		storeKindNamed(t, "redis").cleanup(t, ns)
		storeKindNamed(t, "postgres").cleanup(t, ns)
	})
	r := &quorumRun{executed: map[string]int{}, maxCount: map[string]int{}, outcomes: map[string]int{}, deadLetter: map[string]string{}}

	c := amqp3.NewDurableQueueConfig(env.amqpURL)
	c.Queue.Arguments = quorumArgs(dropped)
	c.Marshaler = quorumMarshalerV3
	pub, err := amqp3.NewPublisher(c, logger())
	must(t, err)
	t.Cleanup(func() { _ = pub.Close() })

	// oncemill's dead letters, on a classic queue, observed from the start.
	dlSub, err := amqp3.NewSubscriber(amqp3.NewDurableQueueConfig(env.amqpURL), logger())
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	dls, err := dlSub.Subscribe(ctx, dlTopic)
	if err != nil {
		cancel()
		t.Fatalf("subscribe to %s: %v", dlTopic, err)
	}
	dlDone := make(chan struct{})
	go func() {
		defer close(dlDone)
		for m := range dls {
			r.mu.Lock()
			r.deadLetter[m.UUID] = m.Metadata.Get(pipeline.ReasonKindKey)
			r.dlCount++
			r.mu.Unlock()
			m.Ack()
		}
	}()
	t.Cleanup(func() { cancel(); _ = dlSub.Close(); <-dlDone })

	// The store: Redis, directly or (what == "store") through the proxy.
	var proxy *toxiproxy.Proxy
	client := redisClient(t)
	if what == "store" {
		proxy = faultProxy(t, env.redisAddr)
		client = redis.NewClient(&redis.Options{Addr: proxy.Listen, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = client.Close() })
	}
	st, err := redisstore.New(client, redisstore.Options{Prefix: ns})
	must(t, err)
	t.Cleanup(func() { _ = st.Close() })

	// The handler: one effect counted in memory, or (what == "handler") a
	// ledger row in PostgreSQL through the proxy (outageRun.bookOnPool).
	handler := func(m *message.Message) error { return nil }
	var ledger func() map[string]int // the handler's rows, read directly
	if what == "handler" {
		direct := pgPool(t)
		_, err := direct.Exec(context.Background(), "CREATE SCHEMA "+pgx.Identifier{ns}.Sanitize())
		must(t, err)
		o := &outageRun{ns: ns, ledger: pgx.Identifier{ns, "ledger"}.Sanitize()}
		_, err = direct.Exec(context.Background(), "CREATE TABLE "+o.ledger+" (id bigserial PRIMARY KEY, uuid text NOT NULL)")
		must(t, err)
		proxy = faultProxy(t, pgUpstream(t))
		o.pool = proxiedPool(t, proxy, 4, 2*time.Second)
		handler = o.bookOnPool
		ledger = func() map[string]int {
			rows, err := direct.Query(context.Background(), "SELECT uuid, count(*)::int FROM "+o.ledger+" GROUP BY uuid")
			must(t, err)
			out := map[string]int{}
			var id string
			var n int
			_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil })
			must(t, err)
			return out
		}
	}

	rc, err := receiver.New(st).WithScope("quorum").WithMessagingSystem(semconv.MessagingSystemRabbitMQ).
		WithDeadLetter(pub, dlTopic).WithEventHandler(func(e pipeline.Event) {
		r.mu.Lock()
		r.outcomes[e.Outcome.String()]++
		r.mu.Unlock()
	}).Build()
	must(t, err)
	// Before oncemill: every delivery's x-delivery-count, whatever the
	// stage does with it.
	observe := func(h message.HandlerFunc) message.HandlerFunc {
		inner := rc.Middleware(h)
		return func(m *message.Message) ([]*message.Message, error) {
			if v := m.Metadata.Get(deliveryCountHeader); v != "" {
				n, err := strconv.Atoi(v)
				if err != nil {
					t.Errorf("x-delivery-count %q: %v", v, err)
				}
				r.mu.Lock()
				r.maxCount[m.UUID] = max(r.maxCount[m.UUID], n)
				r.mu.Unlock()
			}
			return inner(m)
		}
	}
	sub, err := amqp3.NewSubscriber(c, logger())
	must(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	stop := startRouter(t, topic, sub, observe, func(m *message.Message) error {
		time.Sleep(20 * time.Millisecond) // the cut finds messages waiting
		if err := handler(m); err != nil {
			return err
		}
		r.mu.Lock()
		r.executed[m.UUID]++
		r.mu.Unlock()
		r.nExecuted.Add(1)
		return nil
	})
	defer stop()

	ids := make([]string, quorumMessages)
	for i := range ids {
		ids[i] = watermill.NewUUID()
		must(t, pub.Publish(topic, message.NewMessage(ids[i], []byte(`{"cents":100}`))))
	}
	eventually(t, limit, func() bool { return r.nExecuted.Load() >= quorumCutAfter },
		func() string { return fmt.Sprintf("%d executed; the cut never came", r.nExecuted.Load()) })
	proxy.Stop() // every connection dropped, new ones refused
	cutAt := r.nExecuted.Load()
	time.Sleep(quorumCut)
	must(t, proxy.Start())
	heal := time.Now()
	eventually(t, limit, func() bool { return r.done(ids) == quorumMessages },
		func() string {
			return fmt.Sprintf("%d of %d messages executed or dead-lettered; broker dropped %v", r.done(ids), quorumMessages, brokerDropped(t, dropped))
		})
	took := time.Since(heal)
	time.Sleep(2 * time.Second) // a late double, or a late dead letter
	stop()

	gone := brokerDropped(t, dropped)
	var booked map[string]int
	if ledger != nil {
		booked = ledger()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	highest, hist := 0, map[int]int{}
	for _, id := range ids {
		highest = max(highest, r.maxCount[id])
		hist[r.maxCount[id]]++
	}
	var counts []string
	for n, k := range hist {
		counts = append(counts, fmt.Sprintf("%d:%d", n, k))
	}
	sort.Strings(counts)
	t.Logf("60 s cut of the %s after %d executed, all done %v after the heal: highest x-delivery-count %d of the limit %d (count:messages %s); outcomes %v; %d dead-lettered by oncemill %v; %d dropped by the broker",
		map[string]string{"store": "store (Redis)", "handler": "handler's database (PostgreSQL)"}[what], cutAt,
		took.Round(100*time.Millisecond), highest, quorumDeliveryLimit, strings.Join(counts, " "), r.outcomes, len(r.deadLetter), r.deadLetter, len(gone))

	for id, reason := range gone {
		t.Errorf("message %s dropped by the broker (%s)", id, reason)
	}
	for _, id := range ids {
		n, reason := r.executed[id], r.deadLetter[id]
		switch {
		case reason != "" && n > 0:
			t.Errorf("message %s executed %d times and dead-lettered (%s)", id, n, reason)
		case reason != "" && reason != string(pipeline.DeadLetterReasonAttemptsExhausted):
			t.Errorf("message %s dead-lettered for %q; want %q", id, reason, pipeline.DeadLetterReasonAttemptsExhausted)
		case reason == "" && n != 1:
			t.Errorf("message %s executed %d times; want once", id, n)
		}
		if booked != nil && booked[id] != n {
			t.Errorf("message %s has %d ledger rows; its handler succeeded %d times", id, booked[id], n)
		}
	}
	if r.dlCount != len(r.deadLetter) {
		t.Errorf("%d dead letters for %d messages; want one each", r.dlCount, len(r.deadLetter))
	}
	if what == "store" && len(r.deadLetter) > 0 {
		t.Errorf("%d messages dead-lettered in a store outage; store failures spend no attempt", len(r.deadLetter))
	}
	if highest >= quorumDeliveryLimit {
		t.Errorf("highest x-delivery-count %d; want below the limit %d", highest, quorumDeliveryLimit)
	}
}
