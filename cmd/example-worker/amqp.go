package main

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
)

// newAMQP connects to RabbitMQ through watermill-amqp/v3.
func newAMQP(cfg config, logger watermill.LoggerAdapter) (*broker, error) {
	c := amqp.NewDurableQueueConfig(cfg.AMQPURL)
	return newAMQPBroker(cfg, logger, amqpClient{
		connect: func() (closer, error) { return amqp.NewConnection(c.Connection, logger) },
		publisher: func(conn closer) (message.Publisher, error) {
			return amqp.NewPublisherWithConnection(c, logger, conn.(*amqp.ConnectionWrapper))
		},
		subscriber: func(conn closer) (queueSubscriber, error) {
			return amqp.NewSubscriberWithConnection(c, logger, conn.(*amqp.ConnectionWrapper))
		},
	})
}

type closer interface{ Close() error }

// queueSubscriber can declare a queue before anything is published to it.
type queueSubscriber interface {
	message.Subscriber
	SubscribeInitialize(topic string) error
}

// amqpClient is what differs between watermill-amqp/v2 and /v3: the same
// functions in two packages. Each closure is bound to one durable-queue
// config.
type amqpClient struct {
	connect    func() (closer, error)
	publisher  func(conn closer) (message.Publisher, error)
	subscriber func(conn closer) (queueSubscriber, error)
}

// newAMQPBroker uses durable queues, one per topic, that the workers of a
// deployment share (competing consumers). A nacked message is requeued at
// once. Publishing and consuming use separate connections, as RabbitMQ
// recommends.
func newAMQPBroker(cfg config, logger watermill.LoggerAdapter, client amqpClient) (*broker, error) {
	pubConn, err := client.connect()
	if err != nil {
		return nil, fmt.Errorf("amqp connection (%s): %w", redactURL(cfg.AMQPURL), err)
	}
	b := &broker{system: "rabbitmq", closers: []func() error{pubConn.Close}}
	subConn, err := client.connect()
	if err != nil {
		_ = b.close()
		return nil, fmt.Errorf("amqp connection (%s): %w", redactURL(cfg.AMQPURL), err)
	}
	b.closers = append(b.closers, subConn.Close)
	pub, err := client.publisher(pubConn)
	if err != nil {
		_ = b.close()
		return nil, fmt.Errorf("amqp publisher: %w", err)
	}
	b.pub = pub
	b.closers = append(b.closers, pub.Close)
	b.subscriber = func(string) (message.Subscriber, error) { return client.subscriber(subConn) }
	b.initTopics = func(_ context.Context, names []string) error {
		// A durable queue must exist before the first publish, or RabbitMQ
		// drops the message: declare every queue first.
		sub, err := client.subscriber(subConn)
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
