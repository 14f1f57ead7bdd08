package main

import (
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/integration/internal/worker"
)

// newAMQPv2 connects to RabbitMQ through watermill-amqp/v2
// (--amqp-client=v2), where the example worker uses /v3.
func newAMQPv2(cfg worker.Config, logger watermill.LoggerAdapter) (*worker.Broker, error) {
	c := amqp.NewDurableQueueConfig(cfg.AMQPURL)
	return worker.NewAMQPBroker(cfg, worker.AMQPClient{
		Connect: func() (worker.Closer, error) { return amqp.NewConnection(c.Connection, logger) },
		Publisher: func(conn worker.Closer) (message.Publisher, error) {
			return amqp.NewPublisherWithConnection(c, logger, conn.(*amqp.ConnectionWrapper))
		},
		Subscriber: func(conn worker.Closer) (worker.QueueSubscriber, error) {
			return amqp.NewSubscriberWithConnection(c, logger, conn.(*amqp.ConnectionWrapper))
		},
	})
}
