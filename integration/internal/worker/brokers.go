package worker

// The broker: where commands are published and consumed. Each kind is one
// file (gochannel here, kafka.go, amqp.go, sqs.go, nats.go).

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// Broker is one connected broker.
type Broker struct {
	// System is the OpenTelemetry messaging.system of the broker.
	System attribute.KeyValue
	Pub    message.Publisher
	// Subscriber returns the subscriber of one router handler. group names
	// its consumer group where the broker has them (Kafka).
	Subscriber func(group string) (message.Subscriber, error)
	// InitTopics creates topics and queues before anything is published, so
	// that no message is dropped for want of a queue (AMQP drops a message
	// published to a queue that does not exist yet).
	InitTopics func(ctx context.Context, names []string) error
	// HighWaterMark returns a partition's high-water mark (Kafka only), for
	// the watermark mode.
	HighWaterMark func(ctx context.Context, topic string, partition int32) (int64, error)
	// Closers close what the broker opened; Close calls them last first.
	Closers []func() error
}

// Close closes what the broker opened, the last opened first.
func (b *Broker) Close() error {
	var errs []error
	for i := len(b.Closers) - 1; i >= 0; i-- {
		errs = append(errs, b.Closers[i]())
	}
	return errors.Join(errs...)
}

// HandlerPublisher is the publisher to give router handlers. The router
// closes a handler's publisher when that handler stops; all handlers share
// this one (and so does the dead-letter stage), so it must outlive each of
// them: Close closes it, last.
func (b *Broker) HandlerPublisher() message.Publisher { return keepOpen{b.Pub} }

type keepOpen struct{ message.Publisher }

func (keepOpen) Close() error { return nil }

// NewBroker connects to cfg.Broker.
func NewBroker(cfg Config, logger watermill.LoggerAdapter) (*Broker, error) {
	switch cfg.Broker {
	case "gochannel":
		return newGoChannel(logger), nil
	case "kafka":
		return newKafka(cfg, logger)
	case "amqp":
		return newAMQP(cfg, logger)
	case "sqs":
		return newSQS(cfg, logger)
	case "nats":
		return newNATS(cfg, logger)
	}
	return nil, fmt.Errorf("--broker=%q is not built in", cfg.Broker)
}

// newGoChannel is the in-process broker. It delivers to each subscriber one
// message at a time and redelivers a nacked message at once; concurrency
// comes from the partitions. Publishing does not wait for the ack, and the
// producer limits what is in flight itself.
func newGoChannel(logger watermill.LoggerAdapter) *Broker {
	ps := gochannel.NewGoChannel(gochannel.Config{}, logger)
	return &Broker{
		System:     semconv.MessagingSystemKey.String("gochannel"),
		Pub:        ps,
		Subscriber: func(string) (message.Subscriber, error) { return ps, nil },
		InitTopics: func(context.Context, []string) error { return nil },
		Closers:    []func() error{ps.Close},
	}
}

// Topics names the worker's topics (Kafka topics, AMQP queues, SQS queues).
// Names use letters, digits, '-' and '_' only, which every broker accepts
// (SQS refuses dots).
type Topics struct {
	Prefix string
}

// Payments is the topic of partition i's commands: payments-0, payments-1, ...
func (t Topics) Payments(partition int) string {
	return fmt.Sprintf("%spayments-%d", t.Prefix, partition)
}

// Settlements receives the payment.settled events the handler produces.
func (t Topics) Settlements() string { return t.Prefix + "settlements" }

// DeadLetters receives the commands that will never be processed (cached
// failures and rejected messages), once each.
func (t Topics) DeadLetters() string { return t.Prefix + "dead-letters" }

// All lists every topic of a worker with the given partitions.
func (t Topics) All(partitions int) []string {
	out := []string{t.Settlements(), t.DeadLetters()}
	for i := range partitions {
		out = append(out, t.Payments(i))
	}
	return out
}
