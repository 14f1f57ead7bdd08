package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// NATSSettings are the JetStream consumer's settings, the same for every
// durable consumer the worker (and the tests' own subscribers) create.
type NATSSettings struct {
	URL string
	// AckWait is how long JetStream waits for a delivery's ack before it
	// delivers the message again (and watermill-nats waits for the
	// router's ack before giving up on the delivery).
	AckWait time.Duration
	// MaxDeliver caps the deliveries of one message; -1: no cap.
	MaxDeliver int
	// MaxAckPending is how many deliveries of a consumer may wait for
	// their ack at once, across the workers sharing it.
	MaxAckPending int
	// Unmarshaler reads the messages (nil: watermill-nats's NATSMarshaler).
	Unmarshaler wnats.Unmarshaler
}

// newNATS connects to NATS JetStream through watermill-nats v2's pkg/nats.
// Each topic is a stream of one subject (both named after the topic); each
// consumer group a durable push consumer with a deliver group, which the
// workers of a deployment share (competing consumers).
func newNATS(cfg Config, logger watermill.LoggerAdapter) (*Broker, error) {
	s := cfg.NATS()
	pub, err := NewNATSPublisher(s.URL, logger)
	if err != nil {
		return nil, err
	}
	b := &Broker{System: semconv.MessagingSystemKey.String("nats"), Pub: pub, Closers: []func() error{pub.Close}}
	b.Subscriber = func(group string) (message.Subscriber, error) { return NewNATSSubscriber(s, group, logger) }
	b.InitTopics = func(ctx context.Context, names []string) error {
		nc, err := nats.Connect(s.URL, nats.Timeout(5*time.Second))
		if err != nil {
			return fmt.Errorf("nats connection (%s): %w", s.URL, err)
		}
		defer nc.Close()
		js, err := nc.JetStream(nats.Context(ctx))
		if err != nil {
			return fmt.Errorf("nats jetstream (%s): %w", s.URL, err)
		}
		for _, name := range names {
			if err := EnsureNATSStream(js, name); err != nil {
				return err
			}
		}
		return nil
	}
	return b, nil
}

// NewNATSPublisher publishes to JetStream: each Publish waits for the
// stream's ack. It does not set Nats-Msg-Id (watermill-nats's TrackMsgId):
// the stream's de-duplication would drop the same UUID published twice
// within its window, and the tests publish duplicates on purpose.
func NewNATSPublisher(url string, logger watermill.LoggerAdapter) (*wnats.Publisher, error) {
	pub, err := wnats.NewPublisher(wnats.PublisherConfig{
		URL:         url,
		NatsOptions: []nats.Option{nats.Timeout(5 * time.Second)},
		JetStream:   wnats.JetStreamConfig{},
	}, logger)
	if err != nil {
		return nil, fmt.Errorf("nats publisher (%s): %w", url, err)
	}
	return pub, nil
}

// EnsureNATSStream creates the stream of topic (one subject, the topic) if
// it does not exist: a publish to a subject without a stream fails.
func EnsureNATSStream(js nats.JetStreamManager, topic string) error {
	if _, err := js.StreamInfo(topic); err == nil {
		return nil
	} else if !errors.Is(err, nats.ErrStreamNotFound) {
		return fmt.Errorf("nats stream %s: %w", topic, err)
	}
	_, err := js.AddStream(&nats.StreamConfig{Name: topic, Subjects: []string{topic}, Storage: nats.FileStorage})
	if err != nil && !errors.Is(err, nats.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("create nats stream %s: %w", topic, err)
	}
	return nil
}

// NATSDurable is the durable consumer's name of a consumer group on a
// topic: the group, with the characters JetStream refuses in a name
// replaced.
func NATSDurable(group string) string {
	return strings.NewReplacer(".", "_", "*", "_", ">", "_", " ", "_").Replace(group)
}

// NewNATSSubscriber is the subscriber of one consumer group: a durable
// push consumer per topic, created before watermill-nats subscribes to it,
// with explicit acks, s.AckWait and s.MaxDeliver. Created here rather than
// by nats.go: a consumer nats.go creates, it deletes on Unsubscribe, so a
// worker that stops would take the group's position with it. ManualAck:
// else nats.go acks every message once watermill-nats's callback returns,
// also one it gave up on (its AckWaitTimeout, a shutdown) without an ack.
func NewNATSSubscriber(s NATSSettings, group string, logger watermill.LoggerAdapter) (message.Subscriber, error) {
	durable := NATSDurable(group)
	sub, err := wnats.NewSubscriber(wnats.SubscriberConfig{
		URL:              s.URL,
		QueueGroupPrefix: durable,
		NatsOptions:      []nats.Option{nats.Timeout(5 * time.Second)},
		// watermill-nats's own wait for the router's ack, after which it
		// drops the delivery (JetStream redelivers it after AckWait).
		AckWaitTimeout: s.AckWait,
		CloseTimeout:   10 * time.Second,
		Unmarshaler:    s.Unmarshaler,
		JetStream: wnats.JetStreamConfig{
			SubscribeOptions:  []nats.SubOpt{nats.ManualAck()},
			DurablePrefix:     durable,
			DurableCalculator: func(prefix, _ string) string { return prefix },
		},
	}, logger)
	if err != nil {
		return nil, fmt.Errorf("nats subscriber (%s): %w", s.URL, err)
	}
	nc, err := nats.Connect(s.URL, nats.Timeout(5*time.Second))
	if err != nil {
		_ = sub.Close()
		return nil, fmt.Errorf("nats connection (%s): %w", s.URL, err)
	}
	js, err := nc.JetStream()
	if err != nil {
		nc.Close()
		_ = sub.Close()
		return nil, fmt.Errorf("nats jetstream (%s): %w", s.URL, err)
	}
	return &natsSubscriber{Subscriber: sub, nc: nc, js: js, s: s, durable: durable}, nil
}

// natsSubscriber creates the stream and the durable consumer of a topic
// before subscribing to it.
type natsSubscriber struct {
	*wnats.Subscriber
	nc      *nats.Conn
	js      nats.JetStreamContext
	s       NATSSettings
	durable string
}

func (n *natsSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := EnsureNATSStream(n.js, topic); err != nil {
		return nil, err
	}
	maxDeliver := n.s.MaxDeliver
	if maxDeliver == 0 {
		maxDeliver = -1
	}
	_, err := n.js.AddConsumer(topic, &nats.ConsumerConfig{
		Durable:        n.durable,
		DeliverSubject: "oncemill.deliver." + topic + "." + n.durable, // one per stream and consumer
		DeliverGroup:   n.durable,
		DeliverPolicy:  nats.DeliverAllPolicy,
		AckPolicy:      nats.AckExplicitPolicy,
		AckWait:        n.s.AckWait,
		MaxDeliver:     maxDeliver,
		MaxAckPending:  n.s.MaxAckPending,
		FilterSubject:  topic,
	})
	if err != nil {
		return nil, fmt.Errorf("nats durable consumer %s on %s (an existing one with other settings is not changed): %w", n.durable, topic, err)
	}
	return n.Subscriber.Subscribe(ctx, topic)
}

func (n *natsSubscriber) Close() error {
	err := n.Subscriber.Close()
	n.nc.Close()
	return err
}
