// Command sqs-postgres records orders read from an Amazon SQS queue in
// PostgreSQL, once per order.
//
// SQS delivers at least once: a message that is not deleted within the
// queue's visibility timeout comes back, and a standard queue may hand out a
// copy even after a delete. oncemill runs in the one-transaction mode: the
// message's key is claimed inside the handler's transaction, so the order
// row and the record of the message commit together or not at all. A
// duplicate replays the stored success and is deleted without a second row.
//
// An order that can never be booked (a quantity below 1) is a permanent
// failure: oncemill caches it and acks it, so SQS does not redeliver it every
// visibility timeout until its redrive policy gives up.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/postgres"
)

type config struct {
	SQSEndpoint string // SQS_ENDPOINT: an emulator such as fauxqs (scripts/brokers start)
	Region      string // AWS_REGION
	Queue       string // SQS_QUEUE: created if missing
	DatabaseURL string // DATABASE_URL
	Schema      string // DB_SCHEMA: holds oncemill's records and the orders
	PublishDemo bool   // PUBLISH_DEMO=1: publish three orders (one twice) and a bad one
}

func configFromEnv() config {
	return config{
		SQSEndpoint: cmp.Or(os.Getenv("SQS_ENDPOINT"), "http://127.0.0.1:4566"),
		Region:      cmp.Or(os.Getenv("AWS_REGION"), "us-east-1"),
		Queue:       cmp.Or(os.Getenv("SQS_QUEUE"), "orders"),
		DatabaseURL: cmp.Or(os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/test"),
		Schema:      cmp.Or(os.Getenv("DB_SCHEMA"), "oncemill_example"),
		PublishDemo: os.Getenv("PUBLISH_DEMO") == "1",
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
		// SQS keeps a message up to 14 days (MessageRetentionPeriod): remember longer.
		WithPolicy(policy.Policy{SuccessTTL: 15 * 24 * time.Hour}).
		WithLogger(logger).
		WithMessagingSystem(semconv.MessagingSystemAWSSQS).
		WithEventHandler(func(e pipeline.Event) {
			logger.Info("delivery", "uuid", e.MessageUUID, "outcome", e.Outcome.String())
		}).
		Build()
	if err != nil {
		return err
	}

	// Static credentials and an endpoint for the emulator. On AWS, build
	// awsCfg with config.LoadDefaultConfig (aws-sdk-go-v2/config) and drop
	// the endpoint option.
	awsCfg := aws.Config{Region: cfg.Region, Credentials: credentials.NewStaticCredentialsProvider(
		cmp.Or(os.Getenv("AWS_ACCESS_KEY_ID"), "test"), cmp.Or(os.Getenv("AWS_SECRET_ACCESS_KEY"), "test"), "")}
	endpoint := []func(*sqs.Options){func(o *sqs.Options) { o.BaseEndpoint = aws.String(cfg.SQSEndpoint) }}
	// Longer than the slowest handler, or a second copy arrives while the
	// first still runs (oncemill makes it wait, then replays).
	queue := wsqs.QueueConfigAttributes{VisibilityTimeout: "30"}
	sub, err := wsqs.NewSubscriber(wsqs.SubscriberConfig{
		AWSConfig: awsCfg, OptFns: endpoint, QueueConfigAttributes: queue,
	}, wlog)
	if err != nil {
		return err
	}

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, wlog)
	if err != nil {
		return err
	}
	router.AddMiddleware(r.Middleware)
	router.AddConsumerHandler("book-order", cfg.Queue, sub, func(msg *message.Message) error {
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
		pub, err := wsqs.NewPublisher(wsqs.PublisherConfig{AWSConfig: awsCfg, OptFns: endpoint, CreateQueueConfig: queue}, wlog)
		if err != nil {
			return err
		}
		defer pub.Close()
		if err := pub.Publish(cfg.Queue, demoOrders()...); err != nil {
			return err
		}
	}

	select {
	case <-ctx.Done():
	case err := <-routerDone:
		return fmt.Errorf("router stopped by itself: %v", err)
	}
	// Close stops receiving and waits for the handlers in flight; a message
	// not deleted comes back after its visibility timeout, and is replayed.
	if err := router.Close(); err != nil {
		return err
	}
	<-routerDone
	logger.Info("stopped cleanly")
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
