package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/keygen/kafkakeys"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// The watermark mode on Kafka (docs/kafka.md): one row per (consumer group,
// topic, partition) instead of a record per message.

// Three workers in the watermark mode, one SIGKILLed and replaced every
// 1–3 s while 3,000 payments arrive: every payment is charged exactly once,
// and the watermark table holds one row per partition.
func TestKafkaWatermarkWorkersCrash(t *testing.T) {
	t.Parallel()
	h := newHarness(t, brokerKinds[0], storeKinds[0]) // kafka, postgres
	const payments, workers, rounds = 3000, 3, 10
	start := func(i int) *worker {
		return h.start(fmt.Sprintf("worker-%d", i), "--kafka-partitions=3", "--kafka-watermark")
	}
	running := make([]*worker, workers)
	for i := range running {
		running[i] = start(i)
	}
	want := map[string]int{}
	publish := func(n int) {
		for range n {
			id := fmt.Sprintf("p-%d", len(want))
			want[id] = 1
			h.publish(newCommand(t, id, 1500, "", 1))
		}
	}
	next := workers
	for range rounds - 1 {
		publish(payments / rounds)
		time.Sleep(time.Second + rand.N(2*time.Second))
		i := rand.IntN(workers)
		running[i].kill()
		running[i] = start(next)
		next++
	}
	publish(payments / rounds)
	eventually(t, 3*limit, func() bool { return len(h.ledger()) == len(want) },
		func() string {
			return fmt.Sprintf("%d of %d payments charged after %d kills", len(h.ledger()), len(want), next-workers)
		})
	assertLedger(t, h, want)
	pool := pgPool(t)
	var rows int
	must(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM "+pgx.Identifier{h.ns, "oncemill_records_watermarks"}.Sanitize()).Scan(&rows))
	if rows != 3 {
		t.Errorf("the watermark table holds %d rows, want 3 (one per partition)", rows)
	}
	t.Logf("%d kills, %d payments; every payment charged once; %d watermark rows", next-workers, len(want), rows)
}

// wmRig is an in-process consumer of one topic on kfake, in the
// watermark mode over PostgreSQL, booking each message in a ledger and
// producing one settlement whose UUID is new on every execution.
type wmRig struct {
	t      *testing.T
	topic  string
	group  string
	pool   *pgxpool.Pool
	schema string
	st     *postgres.Store
	ledger string
	client sarama.Client
}

func newWMRig(t *testing.T) *wmRig {
	t.Helper()
	ns := "wm_" + strings.ReplaceAll(watermill.NewShortUUID(), "-", "")[:10]
	ns = strings.ToLower(ns)
	r := &wmRig{t: t, topic: ns + "-payments", group: ns + "-group", schema: ns}
	pool, err := pgxpool.New(t.Context(), env.postgresDSN)
	must(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{ns}.Sanitize()+" CASCADE")
		pool.Close()
	})
	r.pool = pool
	r.st, err = postgres.New(pool, postgres.Options{Schema: ns, CleanupInterval: -1})
	must(t, err)
	t.Cleanup(func() { _ = r.st.Close() })
	must(t, r.st.Migrate(t.Context()))
	r.ledger = pgx.Identifier{ns, "ledger"}.Sanitize()
	_, err = pool.Exec(t.Context(), "CREATE TABLE "+r.ledger+" (id bigserial PRIMARY KEY, message_uuid text NOT NULL)")
	must(t, err)
	c := sarama.NewConfig()
	c.Version = sarama.V2_8_0_0
	admin, err := sarama.NewClusterAdmin([]string{env.kafkaAddr}, c)
	must(t, err)
	must(t, admin.CreateTopic(r.topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false))
	_ = admin.Close()
	r.client, err = sarama.NewClient([]string{env.kafkaAddr}, c)
	must(t, err)
	t.Cleanup(func() { _ = r.client.Close() })
	return r
}

// publish publishes n messages with UUIDs m-0, m-1, ...
func (r *wmRig) publish(n int) {
	r.t.Helper()
	pub := brokerKinds[0].publisher(r.t)
	defer pub.Close()
	for i := range n {
		must(r.t, pub.Publish(r.topic, message.NewMessage(fmt.Sprintf("m-%d", i), []byte("pay"))))
	}
}

// ledgerCounts is the charges per message UUID.
func (r *wmRig) ledgerCounts() map[string]int {
	r.t.Helper()
	rows, err := r.pool.Query(context.Background(), "SELECT message_uuid, count(*) FROM "+r.ledger+" GROUP BY 1")
	must(r.t, err)
	out := map[string]int{}
	var id string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil })
	must(r.t, err)
	return out
}

// capture is a publisher that keeps what the router published.
type capture struct {
	mu   sync.Mutex
	msgs []*message.Message
}

func (c *capture) Publish(_ string, msgs ...*message.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, msgs...)
	return nil
}
func (c *capture) Close() error { return nil }

func (c *capture) published() map[string][]string { // settlement UUIDs by source message UUID
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string][]string{}
	for _, m := range c.msgs {
		out[m.Metadata.Get("source")] = append(out[m.Metadata.Get("source")], m.UUID)
	}
	return out
}

// member is one consumer of the rig's group.
type member struct {
	router *message.Router
	out    *capture
	mu     sync.Mutex
	events []pipeline.Event
}

func (m *member) outcomes(uuid string) []pipeline.Outcome {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []pipeline.Outcome
	for _, e := range m.events {
		if e.MessageUUID == uuid {
			out = append(out, e.Outcome)
		}
	}
	return out
}

func (m *member) eventsWith(f func(pipeline.Event) bool) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, e := range m.events {
		if f(e) {
			n++
		}
	}
	return n
}

// memberOpts change a member: outer wraps the receiver; inTx runs in the
// handler's transaction after the ledger insert.
type memberOpts struct {
	outer func(h message.HandlerFunc) message.HandlerFunc
	inTx  func(msg *message.Message)
}

// join starts a member of the group.
func (r *wmRig) join(o memberOpts) *member {
	r.t.Helper()
	m := &member{out: &capture{}}
	c := kafka.DefaultSaramaSubscriberConfig()
	c.Version = sarama.V2_8_0_0
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Group.Session.Timeout = 2 * time.Second
	c.Consumer.Group.Heartbeat.Interval = 500 * time.Millisecond
	c.Consumer.Group.Rebalance.Timeout = 2 * time.Second
	c.Consumer.Group.Rebalance.Retry.Backoff = 250 * time.Millisecond
	c.Net.ReadTimeout = 10 * time.Second
	c.Consumer.Offsets.AutoCommit.Interval = 250 * time.Millisecond
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: []string{env.kafkaAddr}, Unmarshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: c,
		ConsumerGroup: r.group, NackResendSleep: 50 * time.Millisecond,
	}, logger())
	must(r.t, err)
	rcv, err := receiver.NewTransactional(r.st).
		WithKafkaWatermark(pipeline.KafkaWatermark{Group: r.group, Position: kafkakeys.Position, HighWaterMark: kafkakeys.HighWaterMark(r.client)}).
		WithPolicy(policy.Policy{HeldKeyTimeout: time.Minute, NackDelay: 100 * time.Millisecond}).
		WithLogger(slog.New(slog.DiscardHandler)).
		WithEventHandler(func(e pipeline.Event) { m.mu.Lock(); m.events = append(m.events, e); m.mu.Unlock() }).
		Build()
	must(r.t, err)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, logger())
	must(r.t, err)
	h := router.AddHandler(r.group, r.topic, sub, "settlements", m.out, func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := postgres.TxFromContext(msg.Context())
		if _, err := tx.Exec(msg.Context(), "INSERT INTO "+r.ledger+" (message_uuid) VALUES ($1)", msg.UUID); err != nil {
			return nil, err
		}
		if o.inTx != nil {
			o.inTx(msg)
		}
		out := message.NewMessage(watermill.NewUUID(), []byte("settled"))
		out.Metadata.Set("source", msg.UUID)
		return []*message.Message{out}, nil
	})
	mws := []message.HandlerMiddleware{}
	if o.outer != nil {
		mws = append(mws, o.outer)
	}
	h.AddMiddleware(append(mws, rcv.Middleware)...)
	m.router = router
	go func() { _ = router.Run(context.Background()) }()
	r.t.Cleanup(func() { _ = router.Close() })
	select {
	case <-router.Running():
	case <-time.After(30 * time.Second):
		r.t.Fatal("router not running")
	}
	return m
}

// A crash between the commit and the publish of the produced messages:
// the handler's transaction committed, then the delivery failed before the
// router published (here: the middleware outside the receiver returns an
// error, as a process killed there would never ack), so Kafka redelivers
// it. The redelivery is a duplicate at the partition's last committed
// offset: the produced message is published with the UUID it was committed
// with, and the handler does not run again.
func TestKafkaWatermarkReplaysAfterCommit(t *testing.T) {
	t.Parallel()
	r := newWMRig(t)
	r.publish(5)
	var mu sync.Mutex
	committed := map[string]string{} // source UUID -> settlement UUID of the committed execution
	crashed := false
	m := r.join(memberOpts{outer: func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			mu.Lock()
			defer mu.Unlock()
			if err == nil && msg.UUID == "m-2" && !crashed {
				crashed = true
				committed[msg.UUID] = out[0].UUID
				return nil, errors.New("crash between commit and publish")
			}
			return out, err
		}
	}})
	eventually(t, limit, func() bool { return len(m.out.published()) == 5 },
		func() string { return fmt.Sprintf("published %v", m.out.published()) })
	pub := m.out.published()
	for i := range 5 {
		id := fmt.Sprintf("m-%d", i)
		if len(pub[id]) != 1 {
			t.Errorf("%s: published %v, want one settlement", id, pub[id])
		}
	}
	if got := pub["m-2"]; len(got) != 1 || got[0] != committed["m-2"] {
		t.Errorf("m-2's settlement after the redelivery: %v, want the committed UUID %s", got, committed["m-2"])
	}
	if got := m.outcomes("m-2"); len(got) != 2 || got[0] != pipeline.OutcomeExecuted || got[1] != pipeline.OutcomeReplayed {
		t.Errorf("m-2's outcomes %v, want executed then replayed", got)
	}
	for id, n := range r.ledgerCounts() {
		if n != 1 {
			t.Errorf("%s charged %d times", id, n)
		}
	}
	if n := len(r.ledgerCounts()); n != 5 {
		t.Errorf("%d messages charged, want 5", n)
	}
}

// A forced rebalance with two owners at once: the first member holds
// message m-2 in its transaction past the rebalance timeout, so the group
// moves on without it and the second member receives m-2 while the first
// still runs it. The first member committed m-0 and m-1 itself, so it runs
// m-2 on the fast path, which claims at the commit: it holds no lock on
// the partition's row, and the second member, which knows nothing of the
// partition, claims m-2 without waiting, runs it and commits. When the
// first member's commit comes, it finds the watermark past m-2, commits
// nothing, and replays the second's settlement. Every offset has one
// effect.
func TestKafkaWatermarkTwoOwners(t *testing.T) {
	t.Parallel()
	r := newWMRig(t)
	r.publish(5)
	holding, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	first := r.join(memberOpts{inTx: func(msg *message.Message) {
		if msg.UUID == "m-2" {
			once.Do(func() {
				close(holding)
				<-release
			})
		}
	}})
	select {
	case <-holding:
	case <-time.After(limit):
		t.Fatal("the first member never ran m-2")
	}
	second := r.join(memberOpts{})
	// The second member runs m-2 while the first still holds it.
	eventually(t, limit, func() bool {
		return second.eventsWith(func(e pipeline.Event) bool {
			return e.MessageUUID == "m-2" && e.Outcome == pipeline.OutcomeExecuted
		}) > 0
	}, func() string { return "the second member never ran m-2 while the first held it" })
	close(release)
	eventually(t, limit, func() bool {
		return len(r.ledgerCounts()) == 5 && second.eventsWith(func(e pipeline.Event) bool { return e.MessageUUID == "m-4" }) > 0 &&
			len(first.outcomes("m-2")) > 0
	},
		func() string { return fmt.Sprintf("ledger %v", r.ledgerCounts()) })
	for id, n := range r.ledgerCounts() {
		if n != 1 {
			t.Errorf("%s charged %d times", id, n)
		}
	}
	if got := first.outcomes("m-2"); len(got) != 1 || got[0] != pipeline.OutcomeReplayed {
		t.Errorf("first member's m-2: %v, want replayed (its commit found the watermark moved)", got)
	}
	if got := second.outcomes("m-2"); len(got) != 1 || got[0] != pipeline.OutcomeExecuted {
		t.Errorf("second member's m-2: %v, want executed", got)
	}
	// Both owners publish m-2's settlement (the first acks after its
	// session ended), under one UUID: a consumer downstream that
	// deduplicates by UUID sees one.
	fp, sp := first.out.published(), second.out.published()
	if len(sp["m-2"]) != 1 || len(fp["m-2"]) > 1 || len(fp["m-2"]) == 1 && fp["m-2"][0] != sp["m-2"][0] {
		t.Errorf("m-2's settlements: first member %v, second %v, want one UUID", fp["m-2"], sp["m-2"])
	}
}

// A topic recreated under a group whose watermark stayed: the stored
// watermark (100) is above the partition's high-water mark (3). Nothing is
// acked as a duplicate: every delivery fails with ErrWatermarkAhead until
// an operator moves the watermark, after which the messages run.
func TestKafkaWatermarkAheadOfHighWaterMark(t *testing.T) {
	t.Parallel()
	r := newWMRig(t)
	r.publish(3)
	if _, _, err := r.st.MoveWatermark(t.Context(), r.group, r.topic, 0, 100, true); err != nil {
		t.Fatal(err)
	}
	m := r.join(memberOpts{})
	ahead := func(e pipeline.Event) bool {
		return e.Outcome == pipeline.OutcomeStoreFailed && errors.Is(e.Err, store.ErrWatermarkAhead)
	}
	eventually(t, limit, func() bool { return m.eventsWith(ahead) >= 3 },
		func() string { return "no delivery failed with ErrWatermarkAhead" })
	if n := len(r.ledgerCounts()); n != 0 {
		t.Fatalf("%d messages ran with the watermark ahead", n)
	}
	if n := m.eventsWith(func(e pipeline.Event) bool { return e.Outcome.Acked() }); n != 0 {
		t.Fatalf("%d deliveries acked with the watermark ahead", n)
	}
	if _, _, err := r.st.MoveWatermark(t.Context(), r.group, r.topic, 0, 0, false); err != nil {
		t.Fatal(err)
	}
	eventually(t, limit, func() bool { return len(r.ledgerCounts()) == 3 },
		func() string { return fmt.Sprintf("ledger %v after the move", r.ledgerCounts()) })
}
