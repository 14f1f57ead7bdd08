package main

// The broker: where commands are published and consumed. Each kind is one
// file (gochannel here, kafka.go, amqp.go, amqp_v2.go, sqs.go).

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

type broker struct {
	// system is the OpenTelemetry messaging.system of the broker.
	system string
	pub    message.Publisher
	// subscriber returns the subscriber of one router handler. group names
	// its consumer group where the broker has them (Kafka).
	subscriber func(group string) (message.Subscriber, error)
	// initTopics creates topics and queues before anything is published, so
	// that no message is dropped for want of a queue (AMQP drops a message
	// published to a queue that does not exist yet).
	initTopics func(ctx context.Context, names []string) error
	closers    []func() error
}

// close closes what the broker opened, the last opened first.
func (b *broker) close() error {
	var errs []error
	for i := len(b.closers) - 1; i >= 0; i-- {
		errs = append(errs, b.closers[i]())
	}
	return errors.Join(errs...)
}

// handlerPublisher is the publisher to give router handlers. The router
// closes a handler's publisher when that handler stops; all handlers share
// this one (and so does the dead-letter stage), so it must outlive each of
// them: broker.close closes it, last.
func (b *broker) handlerPublisher() message.Publisher { return keepOpen{b.pub} }

type keepOpen struct{ message.Publisher }

func (keepOpen) Close() error { return nil }

func newBroker(cfg config, logger watermill.LoggerAdapter) (*broker, error) {
	switch cfg.Broker {
	case "gochannel":
		return newGoChannel(logger), nil
	case "kafka":
		return newKafka(cfg, logger)
	case "amqp":
		if cfg.AMQPClient == "v2" {
			return newAMQPv2(cfg, logger)
		}
		return newAMQP(cfg, logger)
	case "sqs":
		return newSQS(cfg, logger)
	}
	return nil, fmt.Errorf("--broker=%q is not built in", cfg.Broker)
}

// newGoChannel is the in-process broker. It delivers to each subscriber one
// message at a time and redelivers a nacked message at once; concurrency
// comes from the partitions. Publishing does not wait for the ack, and the
// producer limits what is in flight itself.
func newGoChannel(logger watermill.LoggerAdapter) *broker {
	ps := gochannel.NewGoChannel(gochannel.Config{}, logger)
	return &broker{
		system:     "gochannel",
		pub:        ps,
		subscriber: func(string) (message.Subscriber, error) { return ps, nil },
		initTopics: func(context.Context, []string) error { return nil },
		closers:    []func() error{ps.Close},
	}
}
