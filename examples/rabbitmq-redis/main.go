// Command rabbitmq-redis awards loyalty points for purchases read from a
// RabbitMQ queue, once per purchase, with oncemill's records in Redis.
//
// RabbitMQ requeues a message that was not acked (a crash, a lost
// connection) and a publisher that lost its confirm sends it again: the
// same purchase arrives twice. oncemill runs in the lease mode here: it
// claims the message's key in Redis with a lease, runs the handler while a
// heartbeat keeps the lease alive, then records the outcome. A duplicate is
// acked without running the handler.
//
// The points live in Redis too, but not in oncemill's record: a crash after
// HINCRBY and before the record is written runs the purchase again. Where
// that matters, keep the effect and the record in one PostgreSQL transaction
// (see examples/kafka-postgres).
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
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/redisstore"
)

type config struct {
	AMQPURL     string // AMQP_URL
	Queue       string // AMQP_QUEUE: a durable queue, declared at start
	RedisAddr   string // REDIS_ADDR
	Prefix      string // REDIS_PREFIX: starts every key, oncemill's and the points'
	PublishDemo bool   // PUBLISH_DEMO=1: publish three purchases, one of them twice
}

func configFromEnv() config {
	return config{
		AMQPURL:     cmp.Or(os.Getenv("AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/"),
		Queue:       cmp.Or(os.Getenv("AMQP_QUEUE"), "purchases"),
		RedisAddr:   cmp.Or(os.Getenv("REDIS_ADDR"), "127.0.0.1:6379"),
		Prefix:      cmp.Or(os.Getenv("REDIS_PREFIX"), "loyalty"),
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

	rdb := redis.NewClient(&redis.Options{Addr: cfg.RedisAddr})
	defer rdb.Close() // the store does not close the client
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis at %s: %w", cfg.RedisAddr, err)
	}
	st, err := redisstore.New(rdb, redisstore.Options{Prefix: cfg.Prefix})
	if err != nil {
		return err
	}
	defer st.Close()

	// Durable queue, persistent messages; a nack requeues at once.
	amqpConfig := amqp.NewDurableQueueConfig(cfg.AMQPURL)
	pub, err := amqp.NewPublisher(amqpConfig, wlog)
	if err != nil {
		return err
	}
	defer pub.Close() // the dead letter's, and the demo's
	r, err := receiver.New(st).
		WithPolicy(policy.Policy{
			SuccessTTL:    24 * time.Hour,   // longer than a message can wait in the queue
			LeaseDuration: 30 * time.Second, // longer than the slowest handler; the heartbeat extends it
		}).
		WithLogger(logger).
		WithMessagingSystem(semconv.MessagingSystemRabbitMQ).
		WithDeadLetter(pub, cfg.Queue+"-dead"). // requeued for good, a poison message would hold up the queue
		WithEventHandler(func(e pipeline.Event) {
			logger.Info("delivery", "uuid", e.MessageUUID, "outcome", e.Outcome.String())
		}).
		Build()
	if err != nil {
		return err
	}

	sub, err := amqp.NewSubscriber(amqpConfig, wlog)
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, wlog)
	if err != nil {
		return err
	}
	router.AddMiddleware(r.Middleware)
	points := cfg.Prefix + ":points" // a hash: customer -> points
	router.AddConsumerHandler("award-points", cfg.Queue, sub, func(msg *message.Message) error {
		var p struct {
			Customer string
			Points   int64
		}
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return policy.Cached(fmt.Errorf("bad purchase: %w", err)) // cached and acked, not retried
		}
		// The fencing token rises with every execution of a key: pass it to
		// a downstream system that can refuse a stale writer.
		lease, _ := pipeline.ClaimFromContext(msg.Context())
		logger.Info("awarding points", "customer", p.Customer, "points", p.Points, "attempt", lease.Attempt, "token", lease.Token)
		// The effect is outside any transaction: make sure the lease is
		// still ours (no other delivery took the key over) right before it.
		if err := pipeline.CheckLease(msg.Context()); err != nil {
			return err
		}
		return rdb.HIncrBy(msg.Context(), points, p.Customer, p.Points).Err()
	})

	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(context.Background()) }() // stopped by Close below
	select {
	case <-router.Running(): // the queue is declared now
	case err := <-routerDone:
		return fmt.Errorf("router: %w", err)
	}
	if cfg.PublishDemo {
		if err := publishDemo(pub, cfg.Queue); err != nil {
			return err
		}
	}

	select {
	case <-ctx.Done():
	case err := <-routerDone:
		return fmt.Errorf("router stopped by itself: %v", err)
	}
	// Close stops consuming and waits for the handlers in flight; anything
	// unacked goes back to the queue, and oncemill replays it next time.
	if err := router.Close(); err != nil {
		return err
	}
	<-routerDone
	logger.Info("stopped cleanly")
	return nil
}

// publishDemo publishes three purchases, the first twice (a publisher's retry).
func publishDemo(pub message.Publisher, queue string) error {
	ann := message.NewMessage(watermill.NewUUID(), []byte(`{"customer":"ann","points":10}`))
	ben := message.NewMessage(watermill.NewUUID(), []byte(`{"customer":"ben","points":20}`))
	cat := message.NewMessage(watermill.NewUUID(), []byte(`{"customer":"cat","points":30}`))
	return pub.Publish(queue, ann, ann, ben, cat)
}
