package main

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/examples/internal/exampletest"
)

// TestRabbitMQRedis runs the program in process against the machine's
// RabbitMQ and Redis, publishes three purchases and a duplicate of one, and
// checks that each customer got their points once.
func TestRabbitMQRedis(t *testing.T) {
	cfg := config{
		AMQPURL:   exampletest.AMQPURL,
		Queue:     exampletest.Name("oncemill-example-purchases-"),
		RedisAddr: exampletest.RedisAddr,
		Prefix:    exampletest.Name("oncemill-example-"),
	}
	rdb := exampletest.Redis(t, cfg.Prefix)
	exampletest.RabbitMQ(t, cfg.Queue)

	// RabbitMQ drops what is published to a queue that does not exist yet:
	// declare it first, as the program's subscriber would.
	amqpConfig := amqp.NewDurableQueueConfig(cfg.AMQPURL)
	sub, err := amqp.NewSubscriber(amqpConfig, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SubscribeInitialize(cfg.Queue); err != nil {
		t.Fatal(err)
	}
	_ = sub.Close()
	pub, err := amqp.NewPublisher(amqpConfig, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	want := map[string]string{"ann": "10", "ben": "20", "cat": "30"}
	var msgs []*message.Message
	for _, customer := range []string{"ann", "ben", "cat"} {
		msgs = append(msgs, message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"customer":%q,"points":%s}`, customer, want[customer])))
	}
	// ann's purchase twice, as a publisher that lost its confirm would send it.
	if err := pub.Publish(cfg.Queue, msgs[0], msgs[0], msgs[1], msgs[2]); err != nil {
		t.Fatal(err)
	}

	log := &exampletest.Log{}
	prog := exampletest.Start(t, log, func(ctx context.Context) error {
		return run(ctx, cfg, slog.New(slog.NewTextHandler(log, nil)))
	})
	exampletest.Eventually(t, 60*time.Second, log, "3 purchases executed and 1 replayed", func() (bool, error) {
		return log.Count("outcome=executed") == 3 && log.Count("outcome=replayed") == 1, prog.Exited()
	})
	if n := log.Count("outcome=replayed", "uuid="+msgs[0].UUID); n != 1 {
		exampletest.Fatalf(t, log, "ann's duplicate replayed %d times, want 1", n)
	}
	if n := log.Count(`msg="awarding points"`); n != 3 {
		exampletest.Fatalf(t, log, "the handler ran %d times, want 3: once per purchase", n)
	}

	got, err := rdb.HGetAll(context.Background(), cfg.Prefix+":points").Result()
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, want) {
		exampletest.Fatalf(t, log, "points %v, want %v: each purchase counted exactly once", got, want)
	}

	prog.Stop()
}
