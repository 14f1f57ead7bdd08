// Command example-worker is oncemill's example: a payments worker on
// Watermill whose handler charges each payment once, however often the
// broker delivers the command. The first part of this file is what to copy
// into a service: the handler, oncemill's receiver around it, the stores.
//
// Without flags it is the demo (--mode=run): on gochannel and the memory
// store it publishes payment commands to itself with the duplicates of
// at-least-once delivery and invalid amounts, waits until each delivery is
// acked, counts the ledger, and ends with
//
//	summary: published=N deliveries=D unique=U effects=E replays=R cached_failures=F double_effects=X lost=L msgs_per_sec=S
//
// --mode=produce publishes that workload to a broker; --mode=consume is the
// deployable worker, with /metrics, /healthz and /readyz on --http-addr and
// a drain on SIGTERM. Exit codes: 0 success, 1 a failed run or a payment
// charged twice or lost, 2 bad flags.
package main

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	amqp091 "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/filestore"
	"github.com/oncemill/oncemill/store/memory"
	"github.com/oncemill/oncemill/store/mysql"
	"github.com/oncemill/oncemill/store/postgres"
	"github.com/oncemill/oncemill/store/redisstore"
)

// command is what the handler consumes. Meta is the envelope: it changes
// when the same command is sent again, so it is not part of the key.
type command struct {
	PaymentID   string `json:"payment_id"`
	Account     string `json:"account"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Meta        struct {
		SentAt  string `json:"sent_at"`
		Attempt int    `json:"attempt"`
	} `json:"meta"`
}

// errInvalidAmount never becomes valid: oncemill caches the failure, and a
// duplicate is acked without running the handler again.
var errInvalidAmount = errors.New("invalid amount: amount_cents must be positive")

// handle charges one payment and returns its payment.settled event.
func (w *worker) handle(msg *message.Message) ([]*message.Message, error) {
	var cmd command
	if err := json.Unmarshal(msg.Payload, &cmd); err != nil {
		return nil, policy.Cached(fmt.Errorf("decode payment command: %w", err))
	}
	if cmd.AmountCents <= 0 {
		return nil, policy.Cached(fmt.Errorf("payment %s: %w (got %d)", cmd.PaymentID, errInvalidAmount, cmd.AmountCents))
	}
	// A process paused longer than the lease (a VM freeze) may have lost its
	// key to a duplicate: confirm the lease right before the effect.
	if err := pipeline.CheckLease(msg.Context()); err != nil {
		return nil, policy.Retryable(fmt.Errorf("payment %s: lease check: %w", cmd.PaymentID, err))
	}
	claim, _ := pipeline.ClaimFromContext(msg.Context())
	if err := w.stores.charge(msg.Context(), cmd.PaymentID, msg.UUID, claim); err != nil {
		return nil, policy.Retryable(fmt.Errorf("payment %s: booking the charge: %w", cmd.PaymentID, err))
	}
	payload, _ := json.Marshal(map[string]any{"payment_id": cmd.PaymentID, "account": cmd.Account, "amount_cents": cmd.AmountCents, "currency": cmd.Currency})
	settled := message.NewMessage(watermill.NewUUID(), payload)
	settled.Metadata.Set("type", "payment.settled")
	if claim.Token != 0 { // lets a downstream system refuse a stale worker's write
		settled.Metadata.Set("fencing_token", strconv.FormatInt(claim.Token, 10))
	}
	return []*message.Message{settled}, nil
}

// newReceiver is oncemill's receiver. With PostgreSQL, the one-transaction
// mode: the ledger row and the "processed" record commit together.
func (w *worker) newReceiver(onEvent func(pipeline.Event)) (*receiver.Receiver, error) {
	// The defaults otherwise: a 30 s lease the heartbeat renews, and a
	// duplicate waits up to 5 s for a delivery of its key still running.
	p := policy.Policy{CachedErrors: []error{errInvalidAmount}}
	// Who a command is: its content without the envelope fields a re-send
	// changes, so the same command under a new UUID is the same key.
	keys, err := keygen.ContentHash(keygen.ContentHashOptions{Exclude: []string{"meta.sent_at", "meta.attempt"}, RejectNonJSON: true})
	if err != nil {
		return nil, err
	}
	b := receiver.New(w.stores.store)
	if w.stores.tx != nil { // the transaction holds the key: no lease
		b = receiver.NewTransactional(w.stores.tx)
	}
	b = b.WithKeyGenerator(keys).WithScope(w.cfg.scope).WithPolicy(p).WithLogger(w.log).WithEventHandler(onEvent).
		WithDeadLetter(w.broker.pub, w.topic("dead-letters")).WithMeterProvider(w.meters)
	if w.tracer != nil {
		b = b.WithTracerProvider(w.tracer)
	}
	return b.WithMessagingSystem(w.broker.system).Build()
}

// stores is the idempotency store and the ledger beside it, the effect that
// must happen once: charge books a charge, counts returns the charges per
// payment_id of the scope, ping is the readiness probe.
type stores struct {
	store  store.Store
	tx     store.Transactional // postgres, mysql: the one-transaction mode
	charge func(ctx context.Context, paymentID, uuid string, c store.Claim) error
	counts func(ctx context.Context) (map[string]int, error)
	ping   func(context.Context) error
	close  func()
}

// openStore opens the store. With PostgreSQL the ledger is a table written
// in the transaction of the record; with the others it is a map in this
// process, standing in for the payment provider a real worker would call.
func openStore(ctx context.Context, cfg config) (*stores, error) {
	var s stores
	switch cfg.store {
	case "postgres":
		return openPostgres(ctx, cfg)
	case "mysql":
		return openMySQL(ctx, cfg)
	case "redis":
		// host:port, or a redis:// or rediss:// URL with a password and a
		// database, as cmd/oncemill reads the same variable.
		opts := &goredis.Options{Addr: cfg.redisAddr}
		if strings.Contains(cfg.redisAddr, "://") {
			var err error
			if opts, err = goredis.ParseURL(cfg.redisAddr); err != nil {
				return nil, fmt.Errorf("--redis-addr: %w", err)
			}
		}
		client := goredis.NewClient(opts)
		if err := client.Ping(ctx).Err(); err != nil { // names no password
			return nil, fmt.Errorf("redis at %s, database %d: %w", opts.Addr, opts.DB, err)
		}
		st, err := redisstore.New(client, redisstore.Options{Prefix: cfg.redisPrefix})
		if err != nil {
			return nil, err
		}
		ping := func(ctx context.Context) error { return client.Ping(ctx).Err() }
		s = stores{store: st, ping: ping, close: func() { _ = client.Close() }}
	case "file": // one worker process, whose records outlive it in one file
		st, err := filestore.New(filestore.Options{Path: cfg.filePath})
		if err != nil {
			return nil, err
		}
		s = stores{store: st, ping: func(context.Context) error { return nil }, close: func() { _ = st.Close() }}
	default:
		st, err := memory.New(memory.Options{})
		if err != nil {
			return nil, err
		}
		s = stores{store: st, ping: func(context.Context) error { return nil }, close: func() { _ = st.Close() }}
	}
	var mu sync.Mutex
	charges := map[string]int{}
	s.charge = func(_ context.Context, id, _ string, _ store.Claim) error {
		mu.Lock()
		defer mu.Unlock()
		charges[id]++
		return nil
	}
	s.counts = func(context.Context) (map[string]int, error) {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(charges), nil
	}
	return &s, nil
}

// openPostgres keeps the ledger in a table beside the records.
func openPostgres(ctx context.Context, cfg config) (*stores, error) {
	pc, err := pgxpool.ParseConfig(cfg.postgresDSN)
	if err != nil {
		return nil, err
	}
	if !strings.Contains(cfg.postgresDSN, "pool_max_conns") {
		pc.MaxConns = int32(cfg.partitions + 4) // each handler holds one for its transaction
	}
	if pc.ConnConfig.ConnectTimeout == 0 {
		// A host that is gone fails a connect, not hangs it: a multi-host
		// string then tries the next (a failover).
		pc.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	st, err := postgres.New(pool, postgres.Options{Schema: cfg.postgresSchema})
	if err == nil {
		err = st.Migrate(ctx)
	}
	// No unique constraint, on purpose: a second charge is a second row.
	table := pgx.Identifier{cfg.postgresSchema, "oncemill_ledger"}.Sanitize()
	if err == nil {
		_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (id bigserial PRIMARY KEY, scope text NOT NULL, payment_id text NOT NULL,
	message_uuid text NOT NULL, fencing_token bigint NOT NULL, attempt integer NOT NULL, charged_at timestamptz NOT NULL DEFAULT now())`)
	}
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return &stores{store: st, tx: st, ping: pool.Ping, close: pool.Close,
		charge: func(ctx context.Context, id, uuid string, c store.Claim) error {
			tx, _ := postgres.TxFromContext(ctx) // the receiver's transaction, which holds the record
			_, err := tx.Exec(ctx, `INSERT INTO `+table+` (scope, payment_id, message_uuid, fencing_token, attempt) VALUES ($1, $2, $3, $4, $5)`,
				cfg.scope, id, uuid, c.Token, c.Attempt)
			return err
		},
		counts: func(ctx context.Context) (map[string]int, error) {
			rows, _ := pool.Query(ctx, `SELECT payment_id, count(*) FROM `+table+` WHERE scope = $1 GROUP BY payment_id`, cfg.scope)
			out, id, n := map[string]int{}, "", 0
			_, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil })
			return out, err
		},
	}, nil
}

// openMySQL keeps the ledger in a table beside the records, in the DSN's
// database.
func openMySQL(ctx context.Context, cfg config) (*stores, error) {
	db, err := sql.Open("mysql", cfg.mysqlDSN)
	if err != nil {
		return nil, fmt.Errorf("--mysql-dsn: %w", err)
	}
	db.SetMaxOpenConns(cfg.partitions + 4) // each handler holds one for its transaction
	st, err := mysql.New(db, mysql.Options{})
	if err == nil {
		err = st.Migrate(ctx)
	}
	// No unique constraint, on purpose: a second charge is a second row.
	if err == nil {
		_, err = db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS oncemill_ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY,
	scope VARCHAR(255) NOT NULL, payment_id VARCHAR(255) NOT NULL, message_uuid VARCHAR(255) NOT NULL,
	fencing_token BIGINT NOT NULL, attempt INT NOT NULL, charged_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))`)
	}
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("mysql: %w", err)
	}
	return &stores{store: st, tx: st, ping: db.PingContext, close: func() { _ = st.Close(); _ = db.Close() },
		charge: func(ctx context.Context, id, uuid string, c store.Claim) error {
			tx, _ := mysql.TxFromContext(ctx) // the receiver's transaction, which holds the record
			_, err := tx.ExecContext(ctx, `INSERT INTO oncemill_ledger (scope, payment_id, message_uuid, fencing_token, attempt) VALUES (?, ?, ?, ?, ?)`,
				cfg.scope, id, uuid, c.Token, c.Attempt)
			return err
		},
		counts: func(ctx context.Context) (map[string]int, error) {
			rows, err := db.QueryContext(ctx, `SELECT payment_id, COUNT(*) FROM oncemill_ledger WHERE scope = ? GROUP BY payment_id`, cfg.scope)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			out := map[string]int{}
			for rows.Next() {
				var id string
				var n int
				if err := rows.Scan(&id, &n); err != nil {
					return nil, err
				}
				out[id] = n
			}
			return out, rows.Err()
		},
	}, nil
}

// drainTimeout bounds the drain on SIGTERM; docker-compose.yml's
// stop_grace_period (40 s) is above it.
const drainTimeout = 30 * time.Second

// config is what the flags say.
type config struct {
	mode, broker, store, httpAddr, otlpEndpoint, scope, topicPrefix, group string
	postgresDSN, postgresSchema, mysqlDSN, redisAddr, redisPrefix          string
	filePath                                                               string
	kafkaBrokers, amqpURL, sqsEndpoint, natsURL                            string
	partitions, count                                                      int
	sqsVisibility, natsAckWait                                             time.Duration
}

func parseFlags(args []string, out io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("example-worker", flag.ContinueOnError)
	fs.SetOutput(out)
	env := func(p *string, name, variable, def, usage string) { // the default from $variable when set
		fs.StringVar(p, name, cmp.Or(os.Getenv(variable), def), usage+" [$"+variable+"]")
	}
	fs.StringVar(&c.mode, "mode", "run", "run (the demo), produce (publish the demo's workload) or consume (the deployable worker)")
	fs.StringVar(&c.broker, "broker", "gochannel", "gochannel (run mode only), kafka, amqp, sqs or nats (JetStream)")
	fs.StringVar(&c.store, "store", "memory", "memory, file (one worker process; --file-path), postgres or mysql (the one-transaction mode), or redis")
	env(&c.httpAddr, "http-addr", "ONCEMILL_HTTP_ADDR", ":8080", "consume mode: address of /metrics, /healthz and /readyz")
	env(&c.otlpEndpoint, "otlp-endpoint", "ONCEMILL_OTLP_ENDPOINT", "", "OTLP/HTTP endpoint for traces, e.g. http://jaeger:4318")
	env(&c.scope, "scope", "ONCEMILL_SCOPE", "payments", "oncemill scope and ledger scope (run mode: payment IDs fresh per run, so runs on a shared store replay none of each other's)")
	env(&c.topicPrefix, "topic-prefix", "ONCEMILL_TOPIC_PREFIX", "", "prefix of the topics payments-0, payments-1, ..., settlements, dead-letters")
	env(&c.group, "consumer-group", "ONCEMILL_CONSUMER_GROUP", "oncemill-worker", "Kafka: each topic is read by the consumer group <group>-<topic>")
	env(&c.postgresDSN, "postgres-dsn", "ONCEMILL_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL")
	env(&c.postgresSchema, "postgres-schema", "ONCEMILL_POSTGRES_SCHEMA", "public", "schema of the records and ledger tables (public: the library's default and the oncemill CLI's)")
	env(&c.mysqlDSN, "mysql-dsn", "ONCEMILL_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test", "MySQL or MariaDB: a go-sql-driver DSN, user:password@tcp(host:port)/database")
	env(&c.redisAddr, "redis-addr", "ONCEMILL_REDIS_ADDR", "127.0.0.1:6379", "Redis: host:port, or a redis:// or rediss:// URL with password and database")
	env(&c.redisPrefix, "redis-prefix", "ONCEMILL_REDIS_PREFIX", "oncemill", "prefix of the records keys")
	env(&c.filePath, "file-path", "ONCEMILL_FILE_PATH", "oncemill.db", "file of the file store, held by one process at a time")
	env(&c.kafkaBrokers, "kafka-brokers", "ONCEMILL_KAFKA_BROKERS", "127.0.0.1:9092", "comma-separated Kafka brokers")
	env(&c.amqpURL, "amqp-url", "ONCEMILL_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ")
	env(&c.sqsEndpoint, "sqs-endpoint", "ONCEMILL_SQS_ENDPOINT", "http://127.0.0.1:4566", "SQS (region us-east-1, static credentials)")
	env(&c.natsURL, "nats-url", "ONCEMILL_NATS_URL", "nats://127.0.0.1:4222", "NATS with JetStream")
	fs.IntVar(&c.partitions, "partitions", 8, "router handlers, each on its own topic: payments-0, payments-1, ...")
	fs.IntVar(&c.count, "count", 10000, "payment commands to publish (run and produce modes)")
	fs.DurationVar(&c.sqsVisibility, "sqs-visibility-timeout", 30*time.Second, "SQS: when a nacked message comes back (whole seconds)")
	fs.DurationVar(&c.natsAckWait, "nats-ack-wait", 30*time.Second, "NATS: the consumers' AckWait, when JetStream delivers an unacked message again")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	for name, v := range map[string]string{"mode": c.mode + "|run|produce|consume",
		"broker": c.broker + "|gochannel|kafka|amqp|sqs|nats", "store": c.store + "|memory|file|postgres|mysql|redis"} {
		if allowed := strings.Split(v, "|"); !slices.Contains(allowed[1:], allowed[0]) {
			return c, fmt.Errorf("--%s=%q is not available; choose one of: %s", name, allowed[0], strings.Join(allowed[1:], ", "))
		}
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected argument %q: example-worker takes flags only", fs.Arg(0))
	case c.count < 1 || c.partitions < 1:
		return c, fmt.Errorf("--count=%d --partitions=%d: each must be at least 1", c.count, c.partitions)
	case c.mode != "run" && c.broker == "gochannel":
		return c, fmt.Errorf("--mode=%s with --broker=gochannel: gochannel lives in one process; choose kafka, amqp, sqs or nats", c.mode)
	}
	return c, nil
}

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	} else if err != nil {
		fmt.Fprintf(stderr, "example-worker: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	w, err := open(ctx, cfg, stderr)
	if err == nil {
		defer w.close()
		switch cfg.mode {
		case "produce":
			var deliveries int
			if deliveries, _, err = w.publish(); err == nil {
				fmt.Fprintf(stdout, "produced: commands=%d deliveries=%d expected_effects=%d topics=%s..%s\n",
					cfg.count, deliveries, cfg.count-(cfg.count+46)/50, w.payments(0), w.payments(cfg.partitions-1))
			}
		case "consume":
			err = w.consume(ctx, stdout)
		default:
			err = w.demo(ctx, stdout)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "example-worker: FAIL: %v\n", err)
		return 1
	}
	return 0
}

// worker is what every mode runs on.
type worker struct {
	cfg    config
	run    string // the demo's run: its payment IDs are p-<run>-000001, ...
	log    *slog.Logger
	stores *stores
	broker *broker
	meters *sdkmetric.MeterProvider // oncemill's metrics, to Prometheus' default registry
	tracer *sdktrace.TracerProvider // nil without --otlp-endpoint
}

func (w *worker) topic(name string) string { return w.cfg.topicPrefix + name }

func (w *worker) payments(i int) string { return w.topic(fmt.Sprintf("payments-%d", i)) }

// paymentID is the ID of the workload's i-th payment.
func (w *worker) paymentID(i int) string {
	if w.run != "" {
		return fmt.Sprintf("p-%s-%06d", w.run, i+1)
	}
	return fmt.Sprintf("p-%06d", i+1)
}

// open connects the store and the broker. The demo keeps the scope, where
// the runbook's "oncemill list --scope payments" looks, and gets payment IDs
// and topics of its own: a shared store or broker may hold those of other
// runs, and a payment of an earlier run would be replayed, not charged.
func open(ctx context.Context, cfg config, stderr io.Writer) (w *worker, err error) {
	var run string
	if cfg.mode == "run" {
		run = watermill.NewShortUUID()
		cfg.topicPrefix = cmp.Or(cfg.topicPrefix, "oncemill-run-"+run+"-")
	}
	w = &worker{cfg: cfg, run: run, log: slog.New(slog.DiscardHandler)}
	if cfg.mode == "consume" { // the deployable worker logs in JSON, info and above
		w.log = slog.New(slog.NewJSONHandler(stderr, nil))
	}
	exp, err := otelprom.New()
	if err != nil {
		return nil, err
	}
	w.meters = sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	if cfg.otlpEndpoint != "" {
		spans, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(cfg.otlpEndpoint+"/v1/traces"))
		if err != nil {
			return nil, err
		}
		w.tracer = sdktrace.NewTracerProvider(sdktrace.WithBatcher(spans))
	}
	if w.stores, err = openStore(ctx, cfg); err != nil {
		return nil, err
	}
	if w.broker, err = w.openBroker(); err != nil {
		w.stores.close()
		return nil, err
	}
	return w, nil
}

func (w *worker) close() {
	_ = w.broker.pub.Close()
	w.stores.close()
	_ = w.meters.Shutdown(context.Background())
	if w.tracer != nil {
		_ = w.tracer.Shutdown(context.Background()) // flushes the spans
	}
}

// broker is one connected broker. sub returns the subscriber of one router
// handler (group: its Kafka consumer group).
type broker struct {
	system attribute.KeyValue // OpenTelemetry's messaging.system
	pub    message.Publisher
	sub    func(group string) (message.Subscriber, error)
}

func (w *worker) openBroker() (b *broker, err error) {
	cfg, logger := w.cfg, watermill.NewSlogLogger(w.log)
	switch cfg.broker {
	case "gochannel": // in this process only
		ps := gochannel.NewGoChannel(gochannel.Config{}, logger)
		sub := func(string) (message.Subscriber, error) { return ps, nil }
		return &broker{system: semconv.MessagingSystemKey.String("gochannel"), pub: ps, sub: sub}, nil
	case "kafka":
		// Each router handler has its own consumer group, <group>-<topic>,
		// so workers that run the same handlers share its partitions.
		brokers := strings.Split(cfg.kafkaBrokers, ",")
		pc, c := kafka.DefaultSaramaSyncPublisherConfig(), kafka.DefaultSaramaSubscriberConfig()
		pc.Version, c.Version = sarama.V2_8_0_0, sarama.V2_8_0_0
		c.Consumer.Offsets.Initial = sarama.OffsetOldest // what was published before the first worker joined counts
		// sarama's 60 s rebalance timeout outlasts its own 30 s read timeout:
		// with workers crashing, a group stalled for minutes. A live member
		// rejoins within a heartbeat; half the session timeout (10 s) is
		// enough, and ends a rebalance before the session of a member
		// waiting in it runs out (docs/kafka.md, Recommended settings).
		c.Consumer.Group.Rebalance.Timeout = c.Consumer.Group.Session.Timeout / 2
		// A JoinGroup waits up to the rebalance timeout, nothing else longer: a
		// response that never comes costs 5 s more, not 30 s (docs/kafka.md).
		c.Net.ReadTimeout = c.Consumer.Group.Rebalance.Timeout + 5*time.Second
		topic := &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1} // a topic is one router handler's
		b = &broker{system: semconv.MessagingSystemKafka, sub: func(group string) (message.Subscriber, error) {
			return kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: brokers, OverwriteSaramaConfig: c, ConsumerGroup: group,
				InitializeTopicDetails: topic}, logger)
		}}
		b.pub, err = kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, OverwriteSaramaConfig: pc}, logger)
	case "amqp":
		c := amqp.NewDurableQueueConfig(cfg.amqpURL) // durable queues the workers share
		// A quorum queue adds an integer x-delivery-count to a redelivery,
		// which the DefaultMarshaler refuses: the delivery would be nacked
		// unseen until the broker's delivery limit drops it. Copied as a
		// string, it is read like any header (docs/amqp.md, Quorum queues).
		c.Marshaler = amqp.DefaultMarshaler{PreprocessDelivery: func(d amqp091.Delivery) amqp091.Delivery {
			if n, ok := d.Headers["x-delivery-count"]; ok {
				d.Headers["x-delivery-count"] = fmt.Sprint(n)
			}
			return d
		}}
		b = &broker{system: semconv.MessagingSystemRabbitMQ, sub: func(string) (message.Subscriber, error) { return amqp.NewSubscriber(c, logger) }}
		b.pub, err = amqp.NewPublisher(c, logger)
	case "sqs":
		// A queue per topic; a nacked message comes back after its VisibilityTimeout.
		creds := credentials.NewStaticCredentialsProvider(cmp.Or(os.Getenv("AWS_ACCESS_KEY_ID"), "test"), cmp.Or(os.Getenv("AWS_SECRET_ACCESS_KEY"), "test"), "")
		awsCfg := aws.Config{Region: "us-east-1", Credentials: creds}
		endpoint := []func(*sqs.Options){func(o *sqs.Options) { o.BaseEndpoint = aws.String(cfg.sqsEndpoint) }}
		queue := wsqs.QueueConfigAttributes{VisibilityTimeout: strconv.Itoa(int(cfg.sqsVisibility.Seconds()))}
		b = &broker{system: semconv.MessagingSystemAWSSQS, sub: func(string) (message.Subscriber, error) {
			return wsqs.NewSubscriber(wsqs.SubscriberConfig{AWSConfig: awsCfg, OptFns: endpoint, QueueConfigAttributes: queue, ConsumeWorkers: 4}, logger)
		}}
		b.pub, err = wsqs.NewPublisher(wsqs.PublisherConfig{AWSConfig: awsCfg, OptFns: endpoint, CreateQueueConfig: queue}, logger)
	case "nats":
		// A stream per topic; a durable consumer per router handler,
		// <group>-<topic>, shared by the workers (nats.go).
		b = &broker{system: semconv.MessagingSystemKey.String("nats"), sub: func(group string) (message.Subscriber, error) {
			return newNATSSubscriber(cfg.natsURL, group, cfg.natsAckWait, logger)
		}}
		b.pub, err = newNATSPublisher(cfg.natsURL, logger)
	}
	// Create the topics before anything is published: RabbitMQ drops a
	// message sent to no queue, and a Kafka consumer group needs its topic.
	topics := []string{w.topic("settlements"), w.topic("dead-letters")}
	for i := range cfg.partitions {
		topics = append(topics, w.payments(i))
	}
	var sub message.Subscriber
	if err == nil {
		sub, err = b.sub("")
	}
	for i := 0; i < len(topics) && err == nil; i++ {
		err = sub.(message.SubscribeInitializer).SubscribeInitialize(topics[i])
	}
	if sub != nil {
		_ = sub.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.broker, err)
	}
	return b, nil
}

// NATS JetStream through watermill-nats v2: each topic is a stream of one
// subject (both named after the topic), each router handler's consumer
// group a durable push consumer with a deliver group, which the workers of
// a deployment share (competing consumers). docs/nats.md says how AckWait
// and MaxDeliver meet oncemill's attempts.

// newNATSPublisher publishes to JetStream, each Publish waiting for the
// stream's ack. Without Nats-Msg-Id (watermill-nats's TrackMsgId): the
// stream would drop a UUID published again within its window, and the
// demo sends duplicates on purpose.
func newNATSPublisher(url string, logger watermill.LoggerAdapter) (message.Publisher, error) {
	return wnats.NewPublisher(wnats.PublisherConfig{URL: url, NatsOptions: []nats.Option{nats.Timeout(5 * time.Second)}}, logger)
}

// natsSubscriber subscribes a consumer group. It creates the stream and
// the durable consumer of a topic before watermill-nats subscribes: a
// consumer nats.go creates, it deletes when the subscription ends, and the
// group's position with it. ManualAck: else nats.go acks every message
// once watermill-nats's callback returns, also one it gave up on without
// the router's ack.
type natsSubscriber struct {
	*wnats.Subscriber
	nc      *nats.Conn
	js      nats.JetStreamContext
	durable string
	ackWait time.Duration
}

func newNATSSubscriber(url, group string, ackWait time.Duration, logger watermill.LoggerAdapter) (message.Subscriber, error) {
	durable := strings.NewReplacer(".", "_", "*", "_", ">", "_", " ", "_").Replace(group) // what JetStream takes as a name
	sub, err := wnats.NewSubscriber(wnats.SubscriberConfig{
		URL:              url,
		QueueGroupPrefix: durable,
		NatsOptions:      []nats.Option{nats.Timeout(5 * time.Second)},
		AckWaitTimeout:   ackWait, // watermill-nats's own wait for the router's ack
		CloseTimeout:     10 * time.Second,
		JetStream: wnats.JetStreamConfig{
			SubscribeOptions:  []nats.SubOpt{nats.ManualAck()},
			DurablePrefix:     durable,
			DurableCalculator: func(prefix, _ string) string { return prefix },
		},
	}, logger)
	if err != nil {
		return nil, err
	}
	n := &natsSubscriber{Subscriber: sub, durable: durable, ackWait: ackWait}
	if n.nc, err = nats.Connect(url, nats.Timeout(5*time.Second)); err == nil {
		if n.js, err = n.nc.JetStream(); err != nil {
			n.nc.Close()
		}
	}
	if err != nil {
		_ = sub.Close()
		return nil, err
	}
	return n, nil
}

// SubscribeInitialize creates the stream of topic if it is missing: a
// publish to a subject without a stream fails.
func (n *natsSubscriber) SubscribeInitialize(topic string) error {
	if _, err := n.js.StreamInfo(topic); !errors.Is(err, nats.ErrStreamNotFound) {
		return err
	}
	_, err := n.js.AddStream(&nats.StreamConfig{Name: topic, Subjects: []string{topic}, Storage: nats.FileStorage})
	if errors.Is(err, nats.ErrStreamNameAlreadyInUse) {
		return nil // another worker's, meanwhile
	}
	return err
}

func (n *natsSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := n.SubscribeInitialize(topic); err != nil {
		return nil, err
	}
	_, err := n.js.AddConsumer(topic, &nats.ConsumerConfig{
		Durable:        n.durable,
		DeliverSubject: "oncemill.deliver." + topic + "." + n.durable, // one per stream and consumer
		DeliverGroup:   n.durable,
		DeliverPolicy:  nats.DeliverAllPolicy,
		AckPolicy:      nats.AckExplicitPolicy,
		AckWait:        n.ackWait,
		MaxDeliver:     -1,   // oncemill's policy bounds the attempts
		MaxAckPending:  1000, // deliveries waiting for their ack, across the group's workers
		FilterSubject:  topic,
	})
	if err != nil {
		return nil, fmt.Errorf("durable consumer %s on %s (an existing one with other settings is not changed): %w", n.durable, topic, err)
	}
	return n.Subscriber.Subscribe(ctx, topic)
}

func (n *natsSubscriber) Close() error {
	err := n.Subscriber.Close()
	n.nc.Close()
	return err
}

// router runs the handler behind oncemill's receiver on every payments
// topic; it returns once the router consumes. Closing the router stops
// taking messages and waits up to drain for those in flight.
func (w *worker) router(drain time.Duration, onEvent func(pipeline.Event)) (*message.Router, error) {
	r, err := w.newReceiver(onEvent)
	if err != nil {
		return nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: drain}, watermill.NewSlogLogger(w.log))
	for i := 0; i < w.cfg.partitions && err == nil; i++ {
		var sub message.Subscriber
		if sub, err = w.broker.sub(w.cfg.group + "-" + w.payments(i)); err == nil {
			router.AddHandler(w.payments(i), w.payments(i), sub, w.topic("settlements"), keepOpen{w.broker.pub}, w.handle).
				AddMiddleware(finishOnShutdown, r.Middleware)
		}
	}
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
		return router, nil
	case err := <-done:
		return nil, fmt.Errorf("router stopped before running: %w", err)
	}
}

// keepOpen is the publisher the handlers share: the router closes each
// handler's publisher when the handler stops.
type keepOpen struct{ message.Publisher }

func (keepOpen) Close() error { return nil }

// finishOnShutdown lets a delivery in flight finish during the drain
// (closing a subscriber cancels its messages' contexts). oncemill still
// cancels the handler if its lease is lost.
func finishOnShutdown(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		msg.SetContext(context.WithoutCancel(msg.Context()))
		return h(msg)
	}
}

// publish sends the workload: --count commands, 2% with an invalid amount,
// 20% delivered twice (the same message) and 10% sent again under a new
// UUID, as at-least-once delivery does. It returns the deliveries and the
// messages among them (distinct UUIDs).
func (w *worker) publish() (deliveries, messages int, err error) {
	for i := range w.cfg.count {
		cmd := command{PaymentID: w.paymentID(i), Account: fmt.Sprintf("acc-%d", i%50+1), AmountCents: int64(i*7919%100000 + 1), Currency: "EUR"}
		if i%50 == 3 {
			cmd.AmountCents = -int64(i % 100)
		}
		var msgs []*message.Message
		for cmd.Meta.Attempt = 1; cmd.Meta.Attempt == 1 || cmd.Meta.Attempt == 2 && i%10 == 3; cmd.Meta.Attempt++ {
			cmd.Meta.SentAt = time.Now().UTC().Format(time.RFC3339Nano)
			payload, _ := json.Marshal(cmd)
			msgs = append(msgs, message.NewMessage(watermill.NewUUID(), payload))
		}
		messages += len(msgs)
		if i%5 == 0 {
			msgs = append(msgs, msgs[0])
		}
		for _, msg := range msgs {
			deliveries++
			if err := w.broker.pub.Publish(w.payments(i%w.cfg.partitions), message.NewMessage(msg.UUID, msg.Payload)); err != nil {
				return deliveries, messages, err
			}
		}
	}
	return deliveries, messages, nil
}

// demo publishes the workload to its own router, waits until every message
// is acked, and checks the ledger: each valid payment charged exactly once,
// and one key per command however it was sent. It waits for messages, not
// deliveries: a broker's own redelivery (an SQS visibility timeout that ran
// out under load) adds acks, and a count of them would stop the wait before
// every message had one.
func (w *worker) demo(ctx context.Context, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // the demo fails if its workload is not done by then
	defer cancel()
	var ackedMessages, replays, failures atomic.Int64
	var keys, ackedUUIDs sync.Map
	router, err := w.router(10*time.Second, func(ev pipeline.Event) {
		switch ev.Outcome {
		case pipeline.OutcomeReplayed:
			replays.Add(1)
		case pipeline.OutcomeCachedFailure, pipeline.OutcomeCachedFailureReplayed:
			failures.Add(1)
		}
		if ev.Outcome.Acked() {
			keys.Store(ev.Key, true)
			if _, seen := ackedUUIDs.LoadOrStore(ev.MessageUUID, true); !seen {
				ackedMessages.Add(1)
			}
		}
	})
	if err != nil {
		return err
	}
	defer router.Close()
	start := time.Now()
	deliveries, messages, err := w.publish()
	for err == nil && ackedMessages.Load() < int64(messages) {
		time.Sleep(10 * time.Millisecond)
		if ctx.Err() != nil {
			err = fmt.Errorf("%w: %d of %d messages acked", ctx.Err(), ackedMessages.Load(), messages)
		}
	}
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	counts, err := w.stores.counts(ctx)
	if err != nil {
		return fmt.Errorf("reading the ledger: %w", err)
	}
	n, unique, effects, doubled, lost := w.cfg.count, 0, 0, 0, 0
	for i := range n {
		c := counts[w.paymentID(i)]
		if effects, doubled = effects+c, doubled+max(c-1, 0); c == 0 && i%50 != 3 {
			lost++
		}
	}
	keys.Range(func(_, _ any) bool { unique++; return true })
	fmt.Fprintf(stdout, "records: scope=%s payment_ids=%s..%s\n", w.cfg.scope, w.paymentID(0), w.paymentID(n-1))
	fmt.Fprintf(stdout, "summary: published=%d deliveries=%d unique=%d effects=%d replays=%d cached_failures=%d double_effects=%d lost=%d msgs_per_sec=%.0f\n",
		n, deliveries, unique, effects, replays.Load(), failures.Load(), doubled, lost, float64(deliveries)/elapsed.Seconds())
	if doubled > 0 || lost > 0 || unique != n {
		return fmt.Errorf("double_effects=%d lost=%d unique=%d: want 0, 0 and %d", doubled, lost, unique, n)
	}
	return nil
}

// consume is the deployable worker: it consumes until SIGTERM, then stops
// taking messages and waits up to drainTimeout for those in flight. A
// delivery that finishes during the drain may lose its ack and come back
// after the restart: oncemill replays it.
func (w *worker) consume(ctx context.Context, stdout io.Writer) error {
	var deliveries atomic.Int64
	router, err := w.router(drainTimeout, func(pipeline.Event) { deliveries.Add(1) })
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.Handler()) // the default registry: oncemill's metrics, the Go runtime's
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprintln(rw, "ok") })
	mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, r *http.Request) {
		if !router.IsRunning() || w.stores.ping(r.Context()) != nil { // consuming, and the store answers
			http.Error(rw, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(rw, "ready")
	})
	ln, err := net.Listen("tcp", w.cfg.httpAddr)
	if err != nil {
		_ = router.Close()
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	fmt.Fprintf(stdout, "listening: http://%s\n", ln.Addr())
	fmt.Fprintln(stdout, "consuming:", w.payments(0), "to", w.payments(w.cfg.partitions-1))
	<-ctx.Done()
	err = router.Close()
	fmt.Fprintf(stdout, "consumed: deliveries=%d\n", deliveries.Load())
	return err
}
