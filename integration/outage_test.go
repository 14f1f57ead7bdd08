package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/ThreeDotsLabs/watermill"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/memory"
	"github.com/oncemill/oncemill/store/postgres"
	"github.com/oncemill/oncemill/store/redisstore"
	"github.com/oncemill/oncemill/store/tiered"
)

// TestOutage is issue 23: a short outage of the handler's own database
// must not lose messages under the default policy. Per broker (Kafka,
// RabbitMQ, SQS) and per mode (the lease mode over Redis, the lease mode
// over store/memory, the one-transaction mode over PostgreSQL, the lease
// mode over the tiered store whose truth is PostgreSQL), a handler books
// one ledger row per message in PostgreSQL through a toxiproxy proxy; the
// proxy is cut for 5 s (and, in a second run, 10 s) while outageMessages
// messages flow. Every message must be booked exactly once, none may run
// out of attempts, and all must be done within outageLiveness of the heal.
//
// The policy is the default one (no WithRetry, no WithDeadLetter): the
// point is that the defaults span the outage. The one exception is the
// tiered runs' lease (outageTieredLease).
//
// In the lease modes (redis, memory, tiered) the ledger row commits in a
// statement of its own, apart from oncemill's record: when the cut falls
// between that commit and its reply, the handler sees an error for a row
// that exists. So the handler checks its attempt, as docs/operations.md
// advises (bookOnPool), and every double fails the run in every mode.
//
// Each run logs one row of a markdown table (outageTableHeader), and the
// test logs all the rows at the end.
func TestOutage(t *testing.T) {
	var mu sync.Mutex
	var rows []outageRow
	t.Cleanup(func() { // after every parallel subtest
		sort.Slice(rows, func(i, j int) bool {
			a, b := rows[i], rows[j]
			if a.broker != b.broker {
				return a.broker < b.broker
			}
			if a.mode != b.mode {
				return a.mode < b.mode
			}
			return a.cut < b.cut
		})
		lines := make([]string, len(rows))
		for i, r := range rows {
			lines[i] = r.line
		}
		t.Logf("\n%s\n%s", outageTableHeader, strings.Join(lines, "\n"))
	})
	for _, bk := range outageBrokers(t) {
		for _, mode := range outageModes {
			for _, cut := range []time.Duration{5 * time.Second, 10 * time.Second} {
				name := fmt.Sprintf("%s/%s/cut_%ds", bk.name, mode.name, int(cut.Seconds()))
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					r := runOutage(t, bk, mode, cut)
					row := outageRow{bk.name, mode.name, cut, r.row(bk.name, mode.name, cut)}
					t.Log(row.line)
					mu.Lock()
					rows = append(rows, row)
					mu.Unlock()
				})
			}
		}
	}
}

// outageRow is one run's line of the table.
type outageRow struct {
	broker, mode string
	cut          time.Duration
	line         string
}

// outageTableHeader heads the runs' table: per run, the deliveries beyond
// one per message (redeliveries: nacks during the cut), the time from the
// heal until the last message was acked, and the messages with no ledger
// row (lost) or more than one (doubled).
const outageTableHeader = "| broker | mode | cut | redeliveries | heal → all acked | lost | doubled |\n|---|---|---|---|---|---|---|"

const (
	outageMessages = 300
	// outageCutAfter is how many messages are executed before the cut.
	outageCutAfter = 50
	// outageLiveness bounds the time from the heal until every message is
	// acked (the "within 30 s of the cut ending").
	outageLiveness = 30 * time.Second
	// outageSQSVisibility is the SQS queues' visibility timeout in these
	// tests. The watermill-aws subscriber nacks by leaving the message
	// invisible (it does not reset the visibility), so a nacked message
	// comes back this long after it was received. It must be longer than
	// the longest pause before a nack in play, or the message comes back
	// while its delivery still sleeps: attempt 1's and 2's pauses (3 and
	// 6 s, ±20%: at most 7.2 s) and the store-failure pause (at most 8 s).
	// In a cut of 10 s a message fails at most twice at this visibility.
	// It must also stay under outageLiveness, since a message that failed
	// just before the heal comes back that long after its receive.
	outageSQSVisibility = 20 * time.Second
	// outageTieredLease is the lease of the tiered runs, the one setting
	// that departs from the defaults. Their leases live in the PostgreSQL
	// that is cut: a ClaimLease that committed but whose reply the cut lost, or
	// a Release the cut refused, leaves a lease that no delivery owns, and
	// every redelivery of that message is nacked as held (HeldKeyWait, 5 s,
	// then NackDelay) until it expires. On a serial consumer (a Kafka
	// partition, RabbitMQ with prefetch 1) that holds up every message
	// behind it. With the default 30 s lease, taken at about the cut's
	// start, that measured 25.7 s (RabbitMQ) and 26.7 s (Kafka) after the
	// heal of a 5 s cut, and can pass outageLiveness by a held-key cycle.
	outageTieredLease = 10 * time.Second
)

// outageBrokers are the brokers of the outage and poison tests: Kafka, one
// AMQP client (v3, the example worker's), SQS and NATS JetStream.
func outageBrokers(t *testing.T) []brokerKind {
	var out []brokerKind
	for _, name := range []string{"kafka", "amqp-v3", "sqs", "nats"} {
		found := false
		for _, b := range brokerKinds {
			if b.name == name {
				out, found = append(out, b), true
			}
		}
		if !found {
			t.Fatalf("no broker kind %q in brokerKinds", name)
		}
	}
	return out
}

// outageMode is one way the receiver keeps its records, and the handler
// that books the ledger row under it.
type outageMode struct {
	name  string
	setup func(t *testing.T, r *outageRun) (*receiver.Builder, message.NoPublishHandlerFunc)
}

var outageModes = []outageMode{
	{"redis", func(t *testing.T, r *outageRun) (*receiver.Builder, message.NoPublishHandlerFunc) {
		// The lease mode with the records in Redis, which stays up: only
		// the handler's database goes away.
		st, err := redisstore.New(redisClient(t), redisstore.Options{Prefix: r.ns})
		must(t, err)
		t.Cleanup(func() { _ = st.Close() })
		return receiver.New(st), r.bookOnPool
	}},
	{"memory", func(t *testing.T, r *outageRun) (*receiver.Builder, message.NoPublishHandlerFunc) {
		// The lease mode with the records in process (store/memory), which
		// the cut cannot reach: only the handler's database goes away, as
		// in the redis mode.
		st, err := memory.New(memory.Options{CleanupInterval: -1})
		must(t, err)
		t.Cleanup(func() { _ = st.Close() })
		return receiver.New(st), r.bookOnPool
	}},
	{"one_tx", func(t *testing.T, r *outageRun) (*receiver.Builder, message.NoPublishHandlerFunc) {
		// The one-transaction mode: the record and the ledger row commit
		// together, through the proxy.
		st := r.pgStore(t)
		return receiver.NewTransactional(st), func(m *message.Message) error {
			tx, ok := postgres.TxFromContext(m.Context())
			if !ok {
				return errors.New("no transaction in the handler's context")
			}
			_, err := tx.Exec(m.Context(), "INSERT INTO "+r.ledger+" (uuid) VALUES ($1)", m.UUID)
			return err
		}
	}},
	{"tiered", func(t *testing.T, r *outageRun) (*receiver.Builder, message.NoPublishHandlerFunc) {
		// The lease mode over the tiered store, whose truth is the same
		// PostgreSQL, through the same proxy: the cut takes the records
		// away as well as the ledger.
		cache := redis.NewClient(&redis.Options{Addr: env.redisAddr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = cache.Close() })
		st, err := tiered.New(r.pgStore(t), cache, tiered.Options{Prefix: r.ns})
		must(t, err)
		t.Cleanup(func() { _ = st.Close() })
		return receiver.New(st).WithPolicy(policy.Policy{LeaseDuration: outageTieredLease}), r.bookOnPool
	}},
}

// outageRun is one run: its namespace, proxy, pool and what it saw.
type outageRun struct {
	ns     string
	ledger string // the ledger table, sanitized
	proxy  *toxiproxy.Proxy
	pool   *pgxpool.Pool // through the proxy

	executed, deliveries, handlerFailures, storeFailures, exhausted, failureCached atomic.Int64

	mu      sync.Mutex
	acked   map[string]bool
	allDone chan struct{}

	cutTime  atomic.Pointer[time.Time]
	timeline []string // failed deliveries, relative to the cut (guarded by mu)

	cutAt    int64 // executed when the cut began
	healedAt int64 // executed when the cut ended
	healTook time.Duration
	lost     int
	doubled  int
	checked  bool // the ledger was read: lost and doubled are known
}

func (r *outageRun) row(broker, mode string, cut time.Duration) string {
	if !r.checked {
		return fmt.Sprintf("| %s | %s | %v | %d | – | not checked | not checked |", broker, mode, cut, r.deliveries.Load()-outageMessages)
	}
	return fmt.Sprintf("| %s | %s | %v | %d | %v | %d | %d |", broker, mode, cut, r.deliveries.Load()-outageMessages,
		r.healTook.Round(100*time.Millisecond), r.lost, r.doubled)
}

// bookOnPool is the lease mode's handler: one ledger row, on the proxied
// pool, in a statement of its own, written as docs/operations.md advises
// for an effect outside the record: a cut can lose the answer of an
// insert that committed, and the lease mode cannot tell, so a later attempt
// (pipeline.ClaimFromContext) books only if no earlier one did. The first
// attempt, nearly every message, pays nothing for the check.
func (r *outageRun) bookOnPool(m *message.Message) error {
	ctx, cancel := context.WithTimeout(m.Context(), 5*time.Second)
	defer cancel()
	insert := "INSERT INTO " + r.ledger + " (uuid) VALUES ($1)"
	if lease, _ := pipeline.ClaimFromContext(m.Context()); lease.Attempt > 1 {
		insert = "INSERT INTO " + r.ledger + " (uuid) SELECT $1 WHERE NOT EXISTS (SELECT FROM " + r.ledger + " WHERE uuid = $1)"
	}
	_, err := r.pool.Exec(ctx, insert, m.UUID)
	return err
}

// pgStore is a PostgreSQL store in the run's schema, over the proxied pool.
func (r *outageRun) pgStore(t *testing.T) *postgres.Store {
	st, err := postgres.New(r.pool, postgres.Options{Schema: r.ns, CleanupInterval: -1})
	must(t, err)
	t.Cleanup(func() { _ = st.Close() })
	must(t, st.Migrate(context.Background()))
	return st
}

// onEvent counts what the receiver decided.
func (r *outageRun) onEvent(e pipeline.Event) {
	r.deliveries.Add(1)
	switch e.Outcome {
	case pipeline.OutcomeExecuted:
		r.executed.Add(1)
	case pipeline.OutcomeReleased:
		r.handlerFailures.Add(1)
	case pipeline.OutcomeStoreFailed:
		r.storeFailures.Add(1)
	case pipeline.OutcomeCachedFailure:
		r.failureCached.Add(1)
	}
	if e.Exhausted {
		r.exhausted.Add(1)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.Outcome != pipeline.OutcomeExecuted {
		at := "before the cut"
		if c := r.cutTime.Load(); c != nil {
			at = fmt.Sprintf("+%.1fs", time.Since(*c).Seconds())
		}
		r.timeline = append(r.timeline, fmt.Sprintf("%s %s %.8s attempt %d", at, e.Outcome, e.MessageUUID, e.Attempt))
	}
	if !e.Outcome.Acked() {
		return
	}
	if !r.acked[e.MessageUUID] {
		r.acked[e.MessageUUID] = true
		if len(r.acked) == outageMessages {
			close(r.allDone)
		}
	}
}

func (r *outageRun) ackedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.acked)
}

func runOutage(t *testing.T, bk brokerKind, mode outageMode, cut time.Duration) *outageRun {
	var raw [5]byte
	_, _ = rand.Read(raw[:])
	r := &outageRun{ns: "it_outage_" + hex.EncodeToString(raw[:]), acked: map[string]bool{}, allDone: make(chan struct{})}
	r.ledger = pgx.Identifier{r.ns, "ledger"}.Sanitize()
	topic := r.ns + "-in"
	// Registered first, so they run last: after the router, stores and
	// pools are closed.
	t.Cleanup(func() {
		bk.cleanup(t, []string{topic})
		storeKindNamed(t, "postgres").cleanup(t, r.ns) // the schema
		storeKindNamed(t, "redis").cleanup(t, r.ns)    // the Redis keys
	})

	direct := pgPool(t)
	_, err := direct.Exec(context.Background(), "CREATE SCHEMA "+pgx.Identifier{r.ns}.Sanitize())
	must(t, err)
	_, err = direct.Exec(context.Background(), "CREATE TABLE "+r.ledger+" (id bigserial PRIMARY KEY, uuid text NOT NULL)")
	must(t, err)

	r.proxy = faultProxy(t, pgUpstream(t))
	r.pool = proxiedPool(t, r.proxy, 4, 2*time.Second) // the consumers are serial; many runs share the server

	b, handler := mode.setup(t, r)
	rc, err := b.WithScope("outage").WithEventHandler(r.onEvent).Build()
	must(t, err)

	if bk.name == "kafka" {
		createKafkaTopic(t, topic)
	}
	pub := outagePublisher(t, bk, outageSQSVisibility)
	sub := outageSubscriber(t, bk, r.ns, outageSQSVisibility)
	stop := startRouter(t, topic, sub, rc.Middleware, handler)
	defer stop()

	// The cut, once outageCutAfter messages are executed, and the heal.
	var healAt atomic.Pointer[time.Time]
	cutDone := make(chan struct{})
	go func() {
		defer close(cutDone)
		deadline := time.Now().Add(limit)
		for r.executed.Load() < outageCutAfter {
			if time.Now().After(deadline) {
				t.Errorf("only %d messages executed after %v; the cut never came", r.executed.Load(), limit)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
		r.proxy.Stop() // every connection dropped, new ones refused
		cutTime := time.Now()
		r.cutTime.Store(&cutTime)
		r.cutAt = r.executed.Load()
		time.Sleep(cut)
		r.healedAt = r.executed.Load()
		if err := r.proxy.Start(); err != nil {
			t.Errorf("healing the proxy: %v", err)
		}
		healTime := time.Now()
		healAt.Store(&healTime)
	}()

	ids := make([]string, outageMessages)
	for i := range ids {
		ids[i] = watermill.NewUUID()
		if err := pub.Publish(topic, message.NewMessage(ids[i], []byte(`{"cents":100}`))); err != nil {
			t.Fatalf("publishing message %d: %v", i, err)
		}
	}
	<-cutDone
	if t.Failed() {
		return r
	}
	if r.cutAt >= outageMessages {
		t.Fatalf("all %d messages were executed before the cut: it met no message", r.cutAt)
	}
	heal := *healAt.Load()
	select {
	case <-r.allDone:
		r.healTook = time.Since(heal)
	case <-time.After(limit):
		r.healTook = time.Since(heal)
		t.Errorf("%d of %d messages acked %v after the heal", r.ackedCount(), outageMessages, r.healTook.Round(time.Millisecond))
	}
	stop()

	// The ledger, read directly (not through the proxy).
	booked := map[string]int{}
	rows, err := direct.Query(context.Background(), "SELECT uuid, count(*)::int FROM "+r.ledger+" GROUP BY uuid")
	must(t, err)
	var id string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { booked[id] = n; return nil })
	must(t, err)
	var lost, doubled []string
	r.mu.Lock()
	for _, id := range ids {
		switch n := booked[id]; {
		case n == 0:
			lost = append(lost, id)
		case n == 1:
		default:
			doubled = append(doubled, fmt.Sprintf("%s×%d", id, n))
		}
	}
	timeline := strings.Join(r.timeline, "; ")
	r.mu.Unlock()
	r.lost, r.doubled, r.checked = len(lost), len(doubled), true

	t.Logf("cut after %d executed for %v; %d deliveries, %d handler failures, %d store failures, %d exhausted, %d failures cached; all acked %v after the heal",
		r.cutAt, cut, r.deliveries.Load(), r.handlerFailures.Load(), r.storeFailures.Load(), r.exhausted.Load(), r.failureCached.Load(),
		r.healTook.Round(time.Millisecond))
	t.Logf("failed deliveries (time after the cut, outcome, message, attempt): %s", timeline)
	// The consumers are serial: during the cut at most the delivery under
	// way when it began can finish (its insert committed before the cut,
	// and its record went to Redis, or was retried until the heal).
	if n := r.healedAt - r.cutAt; n > 1 {
		t.Errorf("%d messages executed during the cut: it did not cut the handler's database", n)
	}
	if len(lost) > 0 {
		t.Errorf("%d of %d messages have no ledger row (lost), e.g. %s", len(lost), outageMessages, strings.Join(lost[:min(3, len(lost))], ", "))
	}
	if len(doubled) > 0 {
		t.Errorf("%d messages have more than one ledger row: %s", len(doubled), strings.Join(doubled[:min(3, len(doubled))], ", "))
	}
	if n := r.exhausted.Load(); n > 0 {
		t.Errorf("%d deliveries ran out of attempts (Event.Exhausted)", n)
	}
	if n := r.failureCached.Load(); n > 0 {
		t.Errorf("%d deliveries were acked as failures (OutcomeCachedFailure)", n)
	}
	if r.healTook > outageLiveness {
		t.Errorf("all messages acked %v after the heal; want within %v", r.healTook.Round(time.Millisecond), outageLiveness)
	}
	return r
}

func storeKindNamed(t *testing.T, name string) storeKind {
	for _, k := range storeKinds {
		if k.name == name {
			return k
		}
	}
	t.Fatalf("no store kind %q in storeKinds", name)
	return storeKind{}
}

// pgUpstream is the host:port of the test PostgreSQL.
func pgUpstream(t *testing.T) string {
	u, err := url.Parse(env.postgresDSN)
	must(t, err)
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), "5432")
	}
	return u.Host
}

// proxiedPool is a pool to the test PostgreSQL through p, with maxConns
// connections whose connects fail within connectTimeout: a cut makes a
// caller fail fast, not hang.
func proxiedPool(t *testing.T, p *toxiproxy.Proxy, maxConns int32, connectTimeout time.Duration) *pgxpool.Pool {
	u, err := url.Parse(env.postgresDSN)
	must(t, err)
	u.Host = p.Listen
	cfg, err := pgxpool.ParseConfig(u.String())
	must(t, err)
	cfg.MaxConns = maxConns
	cfg.ConnConfig.ConnectTimeout = connectTimeout
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	must(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// outagePublisher and outageSubscriber are the broker kind's own, except
// that SQS queues get the visibility timeout vis, JetStream consumers an
// AckWait of vis, and the Kafka consumer group the short session timeout
// of the scenarios.
func outagePublisher(t *testing.T, bk brokerKind, vis time.Duration) message.Publisher {
	var pub message.Publisher
	if bk.name == "sqs" {
		cfg, opts, _ := sqsConfig()
		p, err := wsqs.NewPublisher(wsqs.PublisherConfig{AWSConfig: cfg, OptFns: opts, CreateQueueConfig: sqsAttrs(vis)}, logger())
		must(t, err)
		pub = p
	} else {
		pub = bk.publisher(t)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

func outageSubscriber(t *testing.T, bk brokerKind, group string, vis time.Duration) message.Subscriber {
	var sub message.Subscriber
	switch bk.name {
	case "sqs":
		cfg, opts, _ := sqsConfig()
		s, err := wsqs.NewSubscriber(wsqs.SubscriberConfig{AWSConfig: cfg, OptFns: opts, QueueConfigAttributes: sqsAttrs(vis)}, logger())
		must(t, err)
		sub = s
	case "nats":
		sub = natsSubscriber(t, group, vis)
	case "kafka":
		c := kafka.DefaultSaramaSubscriberConfig()
		c.Version = sarama.V2_8_0_0
		c.Consumer.Offsets.Initial = sarama.OffsetOldest
		c.Consumer.Group.Session.Timeout = kafkaSessionTimeout
		c.Consumer.Group.Heartbeat.Interval = kafkaSessionTimeout / 4
		s, err := kafka.NewSubscriber(kafka.SubscriberConfig{
			Brokers: []string{env.kafkaAddr}, Unmarshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: c, ConsumerGroup: group,
		}, logger())
		must(t, err)
		sub = s
	default:
		sub = bk.subscriber(t, group)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

func sqsAttrs(vis time.Duration) wsqs.QueueConfigAttributes {
	return wsqs.QueueConfigAttributes{VisibilityTimeout: strconv.Itoa(int(vis.Seconds()))}
}

// startRouter runs a router with one handler of topic on sub, through mw,
// until the returned stop (also a cleanup) closes it.
func startRouter(t *testing.T, topic string, sub message.Subscriber, mw message.HandlerMiddleware, h message.NoPublishHandlerFunc) (stop func()) {
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger())
	must(t, err)
	router.AddConsumerHandler("outage", topic, sub, h).AddMiddleware(mw)
	done := make(chan error, 1)
	go func() { done <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
	case err := <-done:
		t.Fatalf("router: %v", err)
	case <-time.After(limit):
		t.Fatalf("router not running after %v", limit)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = router.Close()
			<-done
		})
	}
	t.Cleanup(stop)
	return stop
}
