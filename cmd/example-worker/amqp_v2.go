package main

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
)

// newAMQPv2 connects to RabbitMQ through watermill-amqp/v2 (--amqp-client=v2) with durable
// queues, one per topic, that the workers of a deployment share (competing
// consumers). A nacked message is requeued at once. Publishing and consuming
// use separate connections, as RabbitMQ recommends.
func newAMQPv2(cfg config, logger watermill.LoggerAdapter) (*broker, error) {
	amqpCfg := amqp.NewDurableQueueConfig(cfg.AMQPURL)
	pubConn, err := amqp.NewConnection(amqpCfg.Connection, logger)
	if err != nil {
		return nil, fmt.Errorf("amqp connection (%s): %w", redactURL(cfg.AMQPURL), err)
	}
	b := &broker{system: "rabbitmq", closers: []func() error{pubConn.Close}}
	subConn, err := amqp.NewConnection(amqpCfg.Connection, logger)
	if err != nil {
		_ = b.close()
		return nil, fmt.Errorf("amqp connection (%s): %w", redactURL(cfg.AMQPURL), err)
	}
	b.closers = append(b.closers, subConn.Close)
	pub, err := amqp.NewPublisherWithConnection(amqpCfg, logger, pubConn)
	if err != nil {
		_ = b.close()
		return nil, fmt.Errorf("amqp publisher: %w", err)
	}
	b.pub = pub
	b.closers = append(b.closers, pub.Close)
	b.subscriber = func(string) (message.Subscriber, error) {
		return amqp.NewSubscriberWithConnection(amqpCfg, logger, subConn)
	}
	b.initTopics = func(_ context.Context, names []string) error {
		// A durable queue must exist before the first publish, or RabbitMQ
		// drops the message: declare every queue first.
		sub, err := amqp.NewSubscriberWithConnection(amqpCfg, logger, subConn)
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
