// Command nats-postgres records orders read from a NATS JetStream stream
// in PostgreSQL, once per order.
//
// JetStream delivers at least once: a message not acked within its
// consumer's AckWait comes back (a crash, a slow handler), a Nak brings it
// back at once, and a message published twice outside the stream's
// Nats-Msg-Id window is stored twice. oncemill runs in the one-transaction
// mode: the message's key is claimed inside the handler's transaction, so
// the order row and the record of the message commit together or not at
// all. A duplicate replays the stored success and is acked without a second
// row.
//
// An order that can never be booked (a quantity below 1) is a permanent
// failure: oncemill caches it and acks it, so JetStream does not deliver it
// again.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/postgres"
)

type config struct {
	NATSURL     string // NATS_URL: a server with JetStream (nats-server -js)
	Stream      string // NATS_STREAM: the stream and its one subject, created if missing
	Durable     string // NATS_DURABLE: the durable consumer the workers share, created if missing
	DatabaseURL string // DATABASE_URL
	Schema      string // DB_SCHEMA: holds oncemill's records and the orders
	PublishDemo bool   // PUBLISH_DEMO=1: publish three orders (one twice) and a bad one
}

func configFromEnv() config {
	return config{
		NATSURL:     cmp.Or(os.Getenv("NATS_URL"), "nats://127.0.0.1:4222"),
		Stream:      cmp.Or(os.Getenv("NATS_STREAM"), "orders"),
		Durable:     cmp.Or(os.Getenv("NATS_DURABLE"), "book-orders"),
		DatabaseURL: cmp.Or(os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/test"),
		Schema:      cmp.Or(os.Getenv("DB_SCHEMA"), "oncemill_example"),
		PublishDemo: os.Getenv("PUBLISH_DEMO") == "1",
	}
}

// The consumer's settings. AckWait is above oncemill's longest pause
// before a nack (24 s +20% under the default schedule) plus the slowest
// handler, or JetStream delivers a message again while its delivery still
// pauses. MaxDeliver stays unset (no cap): a cap below oncemill's attempts
// (and the nacks of a store outage) makes JetStream stop delivering a
// message before oncemill could dead-letter it.
const (
	ackWait       = time.Minute
	maxAckPending = 1 // per durable consumer: each unacked message is one handler
	streamMaxAge  = 7 * 24 * time.Hour
)

func main() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, configFromEnv(), logger); err != nil {
		logger.Error("stopped", "error", err)
		os.Exit(1)
	}
}

// run consumes until ctx ends, then lets the handlers in flight finish.
func run(ctx context.Context, cfg config, logger *slog.Logger) error {
	wlog := watermill.NewSlogLogger(logger)

	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	st, err := postgres.New(pool, postgres.Options{Schema: cfg.Schema})
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil { // idempotent; safe from every worker at once
		return err
	}
	orders := pgx.Identifier{cfg.Schema, "orders"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+orders+` (
		message_uuid text NOT NULL, sku text NOT NULL, quantity int NOT NULL)`); err != nil {
		return err
	}

	r, err := receiver.NewTransactional(st).
		// The stream keeps a message up to streamMaxAge: remember longer.
		WithPolicy(policy.Policy{SuccessTTL: streamMaxAge + 24*time.Hour}).
		WithLogger(logger).
		WithMessagingSystem(semconv.MessagingSystemKey.String("nats")).
		WithEventHandler(func(e pipeline.Event) {
			logger.Info("delivery", "uuid", e.MessageUUID, "outcome", e.Outcome.String())
		}).
		Build()
	if err != nil {
		return err
	}

	if err := setUp(cfg); err != nil {
		return err
	}
	sub, err := wnats.NewSubscriber(wnats.SubscriberConfig{
		URL:              cfg.NATSURL,
		QueueGroupPrefix: cfg.Durable, // the consumer's deliver group
		AckWaitTimeout:   ackWait,     // watermill-nats's own wait for the router's ack
		JetStream: wnats.JetStreamConfig{
			// Else nats.go acks every message once watermill-nats hands it
			// back, also one it gave up on without an ack.
			SubscribeOptions:  []nats.SubOpt{nats.ManualAck()},
			DurablePrefix:     cfg.Durable,
			DurableCalculator: func(prefix, _ string) string { return prefix },
		},
	}, wlog)
	if err != nil {
		return err
	}

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, wlog)
	if err != nil {
		return err
	}
	router.AddMiddleware(r.Middleware)
	router.AddConsumerHandler("book-order", cfg.Stream, sub, func(msg *message.Message) error {
		var o struct {
			SKU      string
			Quantity int
		}
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return policy.Cached(fmt.Errorf("bad order: %w", err))
		}
		if o.Quantity < 1 {
			return policy.Cached(fmt.Errorf("order for %d × %s: quantity must be 1 or more", o.Quantity, o.SKU))
		}
		tx, _ := postgres.TxFromContext(msg.Context()) // oncemill's transaction for this message
		_, err := tx.Exec(msg.Context(), `INSERT INTO `+orders+` VALUES ($1, $2, $3)`, msg.UUID, o.SKU, o.Quantity)
		return err // nil commits the row with the record; an error rolls both back
	})

	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(context.Background()) }() // stopped by Close below
	select {
	case <-router.Running():
	case err := <-routerDone:
		return fmt.Errorf("router: %w", err)
	}
	if cfg.PublishDemo {
		// Without TrackMsgId: with it, the stream would drop the second
		// copy of the first order (the same UUID) within its 2 min window.
		pub, err := wnats.NewPublisher(wnats.PublisherConfig{URL: cfg.NATSURL}, wlog)
		if err != nil {
			return err
		}
		defer pub.Close()
		if err := pub.Publish(cfg.Stream, demoOrders()...); err != nil {
			return err
		}
	}

	select {
	case <-ctx.Done():
	case err := <-routerDone:
		return fmt.Errorf("router stopped by itself: %v", err)
	}
	// Close stops consuming and waits for the handlers in flight; a message
	// not acked comes back after AckWait, and is replayed.
	if err := router.Close(); err != nil {
		return err
	}
	<-routerDone
	logger.Info("stopped cleanly")
	return nil
}

// setUp creates the stream (one subject, its name) and the durable push
// consumer if they are missing. The program creates the consumer, not
// nats.go: a consumer nats.go creates, it deletes when the subscription
// ends, and the group's position with it.
func setUp(cfg config) error {
	nc, err := nats.Connect(cfg.NATSURL, nats.Timeout(5*time.Second))
	if err != nil {
		return fmt.Errorf("nats at %s: %w", cfg.NATSURL, err)
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err != nil {
		return err
	}
	if err := ensureStream(js, cfg.Stream); err != nil {
		return err
	}
	_, err = js.AddConsumer(cfg.Stream, &nats.ConsumerConfig{
		Durable:        cfg.Durable,
		DeliverSubject: "deliver." + cfg.Stream + "." + cfg.Durable,
		DeliverGroup:   cfg.Durable,
		DeliverPolicy:  nats.DeliverAllPolicy,
		AckPolicy:      nats.AckExplicitPolicy,
		AckWait:        ackWait,
		MaxDeliver:     -1,
		MaxAckPending:  maxAckPending,
		FilterSubject:  cfg.Stream,
	})
	if err != nil { // an existing consumer with other settings is not changed
		return fmt.Errorf("durable consumer %s on %s: %w", cfg.Durable, cfg.Stream, err)
	}
	return nil
}

// ensureStream creates the stream of subject name if it is missing: a
// publish to a subject without a stream fails.
func ensureStream(js nats.JetStreamManager, name string) error {
	_, err := js.StreamInfo(name)
	if errors.Is(err, nats.ErrStreamNotFound) {
		_, err = js.AddStream(&nats.StreamConfig{Name: name, Subjects: []string{name}, MaxAge: streamMaxAge})
	}
	if err != nil {
		return fmt.Errorf("stream %s: %w", name, err)
	}
	return nil
}

// demoOrders are three orders, the first twice (a producer's retry), and
// one that can never be booked.
func demoOrders() []*message.Message {
	books := message.NewMessage(watermill.NewUUID(), []byte(`{"sku":"book","quantity":2}`))
	return []*message.Message{books, books,
		message.NewMessage(watermill.NewUUID(), []byte(`{"sku":"pen","quantity":10}`)),
		message.NewMessage(watermill.NewUUID(), []byte(`{"sku":"lamp","quantity":1}`)),
		message.NewMessage(watermill.NewUUID(), []byte(`{"sku":"desk","quantity":0}`)),
	}
}
