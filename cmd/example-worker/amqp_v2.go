package main

import (
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
)

// newAMQPv2 connects to RabbitMQ through watermill-amqp/v2 (--amqp-client=v2).
func newAMQPv2(cfg config, logger watermill.LoggerAdapter) (*broker, error) {
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
