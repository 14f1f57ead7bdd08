package worker

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// newAMQP connects to RabbitMQ through watermill-amqp/v3.
func newAMQP(cfg Config, logger watermill.LoggerAdapter) (*Broker, error) {
	c := amqp.NewDurableQueueConfig(cfg.AMQPURL)
	return NewAMQPBroker(cfg, AMQPClient{
		Connect: func() (Closer, error) { return amqp.NewConnection(c.Connection, logger) },
		Publisher: func(conn Closer) (message.Publisher, error) {
			return amqp.NewPublisherWithConnection(c, logger, conn.(*amqp.ConnectionWrapper))
		},
		Subscriber: func(conn Closer) (QueueSubscriber, error) {
			return amqp.NewSubscriberWithConnection(c, logger, conn.(*amqp.ConnectionWrapper))
		},
	})
}

// Closer is a connection.
type Closer interface{ Close() error }

// QueueSubscriber can declare a queue before anything is published to it.
type QueueSubscriber interface {
	message.Subscriber
	SubscribeInitialize(topic string) error
}

// AMQPClient is what a watermill-amqp major version provides (the soak tool
// also runs /v2), each function bound to one durable-queue config.
type AMQPClient struct {
	Connect    func() (Closer, error)
	Publisher  func(conn Closer) (message.Publisher, error)
	Subscriber func(conn Closer) (QueueSubscriber, error)
}

// NewAMQPBroker uses durable queues, one per topic, that the workers of a
// deployment share (competing consumers). A nacked message is requeued at
// once. Publishing and consuming use separate connections, as RabbitMQ
// recommends.
func NewAMQPBroker(cfg Config, client AMQPClient) (*Broker, error) {
	pubConn, err := client.Connect()
	if err != nil {
		return nil, fmt.Errorf("amqp connection (%s): %w", redactURL(cfg.AMQPURL), err)
	}
	b := &Broker{System: semconv.MessagingSystemRabbitMQ, Closers: []func() error{pubConn.Close}}
	subConn, err := client.Connect()
	if err != nil {
		_ = b.Close()
		return nil, fmt.Errorf("amqp connection (%s): %w", redactURL(cfg.AMQPURL), err)
	}
	b.Closers = append(b.Closers, subConn.Close)
	pub, err := client.Publisher(pubConn)
	if err != nil {
		_ = b.Close()
		return nil, fmt.Errorf("amqp publisher: %w", err)
	}
	b.Pub = pub
	b.Closers = append(b.Closers, pub.Close)
	b.Subscriber = func(string) (message.Subscriber, error) { return client.Subscriber(subConn) }
	b.InitTopics = func(_ context.Context, names []string) error {
		// A durable queue must exist before the first publish, or RabbitMQ
		// drops the message: declare every queue first.
		sub, err := client.Subscriber(subConn)
		if err != nil {
			return fmt.Errorf("amqp subscriber: %w", err)
		}
		defer sub.Close()
		for _, name := range names {
			if err := sub.SubscribeInitialize(name); err != nil {
				return fmt.Errorf("declare amqp queue %s: %w", name, err)
			}
		}
		return nil
	}
	return b, nil
}
