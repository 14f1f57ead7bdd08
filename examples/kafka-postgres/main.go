// Command kafka-postgres books payments from Kafka in a PostgreSQL ledger,
// exactly once. oncemill runs in the one-transaction mode: the message's key
// is claimed by the first statement of the handler's own transaction, so the
// ledger row and the record of the message commit together or not at all. A
// payment delivered again, or published twice, is acked without a second row.
// GET /healthz answers 200 while the router runs; SIGTERM or SIGINT drains:
// stop consuming, finish the handlers in flight, close everything, exit 0.
//
// With WATERMARK=1 it runs the watermark mode instead (docs/kafka.md): one
// row per partition of the consumer group holds the next offset to process,
// moved in the handler's transaction, and no record is kept per message. A
// payment published twice is then two offsets, which the watermark does not
// tell apart: the ledger's unique message_uuid absorbs the second.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/oncemill/oncemill/keygen/kafkakeys"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/postgres"
)

type config struct {
	Brokers     []string // KAFKA_BROKERS, comma-separated
	Topic       string   // KAFKA_TOPIC
	Group       string   // KAFKA_GROUP: the consumer group
	DatabaseURL string   // DATABASE_URL
	Schema      string   // DB_SCHEMA: holds oncemill's records and the ledger
	HTTPAddr    string   // HTTP_ADDR: where /healthz listens
	PublishDemo bool     // PUBLISH_DEMO=1: publish three payments, one of them twice
	Watermark   bool     // WATERMARK=1: the watermark mode
}

func configFromEnv() config {
	return config{
		Brokers:     strings.Split(cmp.Or(os.Getenv("KAFKA_BROKERS"), "127.0.0.1:9092"), ","),
		Topic:       cmp.Or(os.Getenv("KAFKA_TOPIC"), "payments"),
		Group:       cmp.Or(os.Getenv("KAFKA_GROUP"), "ledger"),
		DatabaseURL: cmp.Or(os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/test"),
		Schema:      cmp.Or(os.Getenv("DB_SCHEMA"), "oncemill_example"),
		HTTPAddr:    cmp.Or(os.Getenv("HTTP_ADDR"), "127.0.0.1:8080"),
		PublishDemo: os.Getenv("PUBLISH_DEMO") == "1",
		Watermark:   os.Getenv("WATERMARK") == "1",
	}
}

func main() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, configFromEnv(), logger); err != nil {
		logger.Error("stopped", "error", err)
		os.Exit(1)
	}
}

// run consumes until ctx ends, then drains and returns nil.
func run(ctx context.Context, cfg config, logger *slog.Logger) error {
	wlog := watermill.NewSlogLogger(logger)

	// One pool for oncemill and the handler: a message in flight holds one connection.
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close() // the store never closes the pool
	st, err := postgres.New(pool, postgres.Options{Schema: cfg.Schema})
	if err != nil {
		return err
	}
	defer st.Close()                        // waits for the store's operations under way
	if err := st.Migrate(ctx); err != nil { // idempotent; safe from every worker at once
		return err
	}
	// In the key mode no unique constraint on message_uuid: oncemill alone
	// keeps it to one row.
	ledger := pgx.Identifier{cfg.Schema, "ledger"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+ledger+` (
		id bigserial PRIMARY KEY, message_uuid text NOT NULL, account text NOT NULL, cents bigint NOT NULL)`); err != nil {
		return err
	}
	insert := `INSERT INTO ` + ledger + ` (message_uuid, account, cents) VALUES ($1, $2, $3)`
	if cfg.Watermark {
		// The watermark tells redeliveries (the same offset) from new
		// work; a payment published twice is a new offset. The business
		// key, unique, absorbs it in the same transaction: one index entry
		// per payment, which the ledger keeps anyway.
		if _, err := pool.Exec(ctx, `CREATE UNIQUE INDEX IF NOT EXISTS ledger_message_uuid ON `+ledger+` (message_uuid)`); err != nil {
			return err
		}
		insert += ` ON CONFLICT (message_uuid) DO NOTHING`
	}

	pc := kafka.DefaultSaramaSyncPublisherConfig()
	pc.Version = sarama.V2_8_0_0
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: cfg.Brokers, Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: pc}, wlog)
	if err != nil {
		return err
	}
	defer pub.Close() // the dead letter's, and the demo's
	b := receiver.NewTransactional(st)
	if cfg.Watermark {
		// The high-water mark of a partition, to refuse a watermark ahead of
		// it (a topic recreated) rather than ack every message unrun.
		cc := sarama.NewConfig()
		cc.Version = sarama.V2_8_0_0
		client, err := sarama.NewClient(cfg.Brokers, cc)
		if err != nil {
			return err
		}
		defer client.Close()
		b = b.WithKafkaWatermark(pipeline.KafkaWatermark{
			Group:         cfg.Group, // the subscriber's, below
			Position:      kafkakeys.Position,
			HighWaterMark: kafkakeys.HighWaterMark(client),
		})
	}
	r, err := b.
		WithPolicy(policy.Policy{SuccessTTL: 7 * 24 * time.Hour}). // longer than Kafka could redeliver: lag, a group rewound
		WithLogger(logger).
		WithMessagingSystem(semconv.MessagingSystemKafka).
		WithDeadLetter(pub, cfg.Topic+"-dead"). // nacked for good, a poison message would hold up its partition
		WithEventHandler(func(e pipeline.Event) {
			logger.Info("delivery", "uuid", e.MessageUUID, "outcome", e.Outcome.String())
		}).
		Build()
	if err != nil {
		return err
	}

	sc := kafka.DefaultSaramaSubscriberConfig()
	sc.Version = sarama.V2_8_0_0
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest // a new group reads what came before it
	// Bound rebalances and unanswered requests (docs/kafka.md, "A rebalance during an outage").
	sc.Consumer.Group.Session.Timeout = 10 * time.Second
	sc.Consumer.Group.Rebalance.Timeout = sc.Consumer.Group.Session.Timeout / 2
	sc.Net.ReadTimeout = sc.Consumer.Group.Rebalance.Timeout + 5*time.Second
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: cfg.Brokers, Unmarshaler: kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: sc, ConsumerGroup: cfg.Group}, wlog)
	if err != nil {
		return err
	}

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, wlog)
	if err != nil {
		return err
	}
	router.AddMiddleware(r.Middleware)
	router.AddConsumerHandler("ledger", cfg.Topic, sub, func(msg *message.Message) error {
		var p struct {
			Account string
			Cents   int64
		}
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return policy.Cached(fmt.Errorf("bad payment: %w", err)) // cached and acked, never retried
		}
		// The transaction oncemill opened for this message; returning nil
		// commits this insert together with the record of the message.
		tx, _ := postgres.TxFromContext(msg.Context())
		_, err := tx.Exec(msg.Context(), insert, msg.UUID, p.Account, p.Cents)
		return err
	})

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !router.IsRunning() || router.IsClosed() {
			w.WriteHeader(http.StatusServiceUnavailable) // starting, or draining
		} // else 200
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }() // ErrServerClosed once closed
	defer srv.Close()
	logger.Info("serving /healthz", "addr", ln.Addr().String())

	// Not ctx: Close (below) stops the router without cancelling handlers.
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
	case err := <-routerDone:
		return fmt.Errorf("router: %w", err)
	}
	if cfg.PublishDemo {
		if err := publishDemo(cfg.Topic, pub); err != nil {
			return err
		}
	}

	select {
	case <-ctx.Done():
	case err := <-routerDone:
		return errors.Join(errors.New("router stopped by itself"), err)
	}
	// Drain: stop consuming, wait for the handlers in flight. An ack that
	// watermill-kafka drops meanwhile is read again after a restart, and replayed.
	logger.Info("draining")
	if err := router.Close(); err != nil {
		return err
	}
	<-routerDone
	logger.Info("drained")
	return nil // the deferred calls close the HTTP server, the store and the pool
}

// publishDemo publishes three payments, the first twice (a producer's retry).
func publishDemo(topic string, pub message.Publisher) error {
	alice := message.NewMessage(watermill.NewUUID(), []byte(`{"account":"alice","cents":100}`))
	return pub.Publish(topic, alice, alice,
		message.NewMessage(watermill.NewUUID(), []byte(`{"account":"bob","cents":200}`)),
		message.NewMessage(watermill.NewUUID(), []byte(`{"account":"carol","cents":300}`)))
}
