package main

// The brokers: gochannel (in process), Kafka, RabbitMQ and SQS.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/oncemill/oncemill/receiver"
)

// broker is one connected broker.
type broker struct {
	system string // for telemetry: receiver.MessagingSystem*, "" for gochannel
	pub    message.Publisher
	// sub returns the subscriber of one router handler; group is its Kafka
	// consumer group.
	sub func(group string) (message.Subscriber, error)
	// init creates the topics before anything is published (RabbitMQ drops
	// a message published to a queue that does not exist yet).
	init func(ctx context.Context, names []string) error
}

func openBroker(ctx context.Context, cfg config, logger watermill.LoggerAdapter, topics []string) (*broker, error) {
	var b *broker
	var err error
	switch cfg.broker {
	case "kafka":
		b, err = newKafka(cfg, logger)
	case "amqp":
		b, err = newAMQP(cfg, logger)
	case "sqs":
		b, err = newSQS(cfg, logger)
	default:
		ps := gochannel.NewGoChannel(gochannel.Config{}, logger)
		b = &broker{pub: ps, sub: func(string) (message.Subscriber, error) { return ps, nil }, init: func(context.Context, []string) error { return nil }}
	}
	if err != nil {
		return nil, err
	}
	if err := b.init(ctx, topics); err != nil {
		_ = b.pub.Close()
		return nil, err
	}
	return b, nil
}

// newKafka gives each router handler its own consumer group,
// <group>-<topic>, so workers that run the same handlers share its
// partitions. (integration/internal/worker/kafka.go also ends a delivery when
// its partition is revoked, so a rebalance need not wait for it; see
// docs/kafka.md.)
func newKafka(cfg config, logger watermill.LoggerAdapter) (*broker, error) {
	brokers := strings.Split(cfg.kafkaBrokers, ",")
	pc := kafka.DefaultSaramaSyncPublisherConfig()
	pc.Version = sarama.V2_8_0_0
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: pc}, logger)
	if err != nil {
		return nil, fmt.Errorf("kafka publisher (%s): %w", cfg.kafkaBrokers, err)
	}
	c := kafka.DefaultSaramaSubscriberConfig()
	c.Version = sarama.V2_8_0_0
	c.Consumer.Offsets.Initial = sarama.OffsetOldest // messages published before the first worker joined count
	c.Consumer.Offsets.AutoCommit.Interval = 250 * time.Millisecond
	c.Consumer.Group.Session.Timeout = cfg.kafkaSession
	c.Consumer.Group.Heartbeat.Interval = cfg.kafkaSession / 4
	// sarama's 60 s rebalance timeout outlasts its own 30 s read timeout: with
	// workers crashing, the group stalled for minutes. A live member rejoins
	// within a heartbeat.
	c.Consumer.Group.Rebalance.Timeout = cfg.kafkaSession
	// A JoinGroup waits up to the rebalance timeout, nothing else longer; a
	// response that never comes then costs 5 s more, not 30 s.
	c.Net.ReadTimeout = c.Consumer.Group.Rebalance.Timeout + 5*time.Second
	return &broker{
		system: receiver.MessagingSystemKafka,
		pub:    pub,
		sub: func(group string) (message.Subscriber, error) {
			return kafka.NewSubscriber(kafka.SubscriberConfig{
				Brokers: brokers, Unmarshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: c, ConsumerGroup: group,
				NackResendSleep: 100 * time.Millisecond,
			}, logger)
		},
		init: func(_ context.Context, names []string) error {
			admin, err := sarama.NewClusterAdmin(brokers, pc)
			if err != nil {
				return fmt.Errorf("kafka admin (%s): %w", cfg.kafkaBrokers, err)
			}
			defer admin.Close()
			for _, name := range names {
				err := admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: int32(cfg.kafkaPartitions), ReplicationFactor: 1}, false)
				if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
					return fmt.Errorf("create kafka topic %s: %w", name, err)
				}
			}
			return nil
		},
	}, nil
}

// newAMQP uses durable queues, one per topic, that the workers share. A
// nacked message is requeued at once.
func newAMQP(cfg config, logger watermill.LoggerAdapter) (*broker, error) {
	c := amqp.NewDurableQueueConfig(cfg.amqpURL)
	pub, err := amqp.NewPublisher(c, logger)
	if err != nil {
		return nil, fmt.Errorf("amqp publisher: %w", err)
	}
	return &broker{
		system: receiver.MessagingSystemRabbitMQ,
		pub:    pub,
		sub:    func(string) (message.Subscriber, error) { return amqp.NewSubscriber(c, logger) },
		init: func(_ context.Context, names []string) error {
			sub, err := amqp.NewSubscriber(c, logger)
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
		},
	}, nil
}

// newSQS uses a standard queue per topic. A nacked message comes back once
// the queue's VisibilityTimeout has passed.
func newSQS(cfg config, logger watermill.LoggerAdapter) (*broker, error) {
	creds := credentials.NewStaticCredentialsProvider(getenv("AWS_ACCESS_KEY_ID", "test"), getenv("AWS_SECRET_ACCESS_KEY", "test"), "")
	awsCfg := aws.Config{Region: "us-east-1", Credentials: creds}
	endpoint := []func(*sqs.Options){func(o *sqs.Options) { o.BaseEndpoint = aws.String(cfg.sqsEndpoint) }}
	queue := wsqs.QueueConfigAttributes{VisibilityTimeout: strconv.Itoa(int(cfg.sqsVisibility.Seconds()))}
	pub, err := wsqs.NewPublisher(wsqs.PublisherConfig{AWSConfig: awsCfg, OptFns: endpoint, CreateQueueConfig: queue}, logger)
	if err != nil {
		return nil, fmt.Errorf("sqs publisher (%s): %w", cfg.sqsEndpoint, err)
	}
	newSub := func() (*wsqs.Subscriber, error) {
		return wsqs.NewSubscriber(wsqs.SubscriberConfig{
			AWSConfig: awsCfg, OptFns: endpoint, QueueConfigAttributes: queue, ConsumeWorkers: cfg.sqsWorkers,
		}, logger)
	}
	return &broker{
		system: receiver.MessagingSystemSQS,
		pub:    pub,
		sub:    func(string) (message.Subscriber, error) { return newSub() },
		init: func(ctx context.Context, names []string) error {
			sub, err := newSub()
			if err != nil {
				return fmt.Errorf("sqs subscriber: %w", err)
			}
			defer sub.Close()
			for _, name := range names {
				if err := sub.SubscribeInitializeWithContext(ctx, name); err != nil {
					return fmt.Errorf("create sqs queue %s at %s: %w", name, cfg.sqsEndpoint, err)
				}
			}
			return nil
		},
	}, nil
}
