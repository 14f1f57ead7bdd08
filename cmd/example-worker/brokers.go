package main

// The brokers: gochannel (in process), Kafka, RabbitMQ and SQS.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
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
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// broker is one connected broker. sub returns the subscriber of one router
// handler (group: its Kafka consumer group); init creates the topics before
// anything is published (RabbitMQ drops a message sent to no queue).
type broker struct {
	system attribute.KeyValue // semconv.MessagingSystem*; none for gochannel
	pub    message.Publisher
	sub    func(group string) (message.Subscriber, error)
	init   func(ctx context.Context, names []string) error
}

func openBroker(ctx context.Context, cfg config, logger watermill.LoggerAdapter, topics []string) (b *broker, err error) {
	switch cfg.broker {
	case "kafka":
		b, err = newKafka(cfg, logger)
	case "amqp":
		c := amqp.NewDurableQueueConfig(cfg.amqpURL) // durable queues the workers share
		b = &broker{system: semconv.MessagingSystemRabbitMQ, sub: func(string) (message.Subscriber, error) { return amqp.NewSubscriber(c, logger) }}
		b.pub, err = amqp.NewPublisher(c, logger)
	case "sqs":
		// A queue per topic. A nacked message comes back after the
		// queue's VisibilityTimeout.
		creds := credentials.NewStaticCredentialsProvider(cmp.Or(os.Getenv("AWS_ACCESS_KEY_ID"), "test"), cmp.Or(os.Getenv("AWS_SECRET_ACCESS_KEY"), "test"), "")
		awsCfg := aws.Config{Region: "us-east-1", Credentials: creds}
		endpoint := []func(*sqs.Options){func(o *sqs.Options) { o.BaseEndpoint = aws.String(cfg.sqsEndpoint) }}
		queue := wsqs.QueueConfigAttributes{VisibilityTimeout: strconv.Itoa(int(cfg.sqsVisibility.Seconds()))}
		b = &broker{system: semconv.MessagingSystemAWSSQS, sub: func(string) (message.Subscriber, error) {
			return wsqs.NewSubscriber(wsqs.SubscriberConfig{AWSConfig: awsCfg, OptFns: endpoint, QueueConfigAttributes: queue, ConsumeWorkers: 4}, logger)
		}}
		b.pub, err = wsqs.NewPublisher(wsqs.PublisherConfig{AWSConfig: awsCfg, OptFns: endpoint, CreateQueueConfig: queue}, logger)
	default:
		ps := gochannel.NewGoChannel(gochannel.Config{}, logger)
		b = &broker{pub: ps, sub: func(string) (message.Subscriber, error) { return ps, nil }, init: func(context.Context, []string) error { return nil }}
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.broker, err)
	}
	if b.init == nil { // amqp, sqs: a subscriber declares the queues
		b.init = func(_ context.Context, names []string) error {
			sub, err := b.sub("")
			if err != nil {
				return err
			}
			defer sub.Close()
			for _, name := range names {
				if err := sub.(message.SubscribeInitializer).SubscribeInitialize(name); err != nil {
					return err
				}
			}
			return nil
		}
	}
	if err := b.init(ctx, topics); err != nil {
		_ = b.pub.Close()
		return nil, fmt.Errorf("%s: creating the topics: %w", cfg.broker, err)
	}
	return b, nil
}

// newKafka gives each router handler its own consumer group,
// <group>-<topic>, so workers that run the same handlers share its
// partitions. (integration/internal/worker/kafka.go also ends a delivery
// when its partition is revoked, so that a rebalance need not wait for it.)
func newKafka(cfg config, logger watermill.LoggerAdapter) (*broker, error) {
	brokers := strings.Split(cfg.kafkaBrokers, ",")
	pc := kafka.DefaultSaramaSyncPublisherConfig()
	pc.Version = sarama.V2_8_0_0
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: pc}, logger)
	if err != nil {
		return nil, err
	}
	c := kafka.DefaultSaramaSubscriberConfig()
	c.Version = sarama.V2_8_0_0
	c.Consumer.Offsets.Initial = sarama.OffsetOldest // what was published before the first worker joined counts
	c.Consumer.Offsets.AutoCommit.Interval = 250 * time.Millisecond
	c.Consumer.Group.Session.Timeout = cfg.kafkaSession
	c.Consumer.Group.Heartbeat.Interval = cfg.kafkaSession / 4
	// sarama's 60 s rebalance timeout outlasts its own 30 s read timeout:
	// with workers crashing, a group stalled for minutes. A live member
	// rejoins within a heartbeat.
	c.Consumer.Group.Rebalance.Timeout = cfg.kafkaSession
	// A JoinGroup waits up to the rebalance timeout, nothing else longer: a
	// response that never comes costs 5 s more, not 30 s (docs/kafka.md).
	c.Net.ReadTimeout = c.Consumer.Group.Rebalance.Timeout + 5*time.Second
	return &broker{system: semconv.MessagingSystemKafka, pub: pub,
		sub: func(group string) (message.Subscriber, error) {
			return kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: brokers, Unmarshaler: kafka.DefaultMarshaler{},
				OverwriteSaramaConfig: c, ConsumerGroup: group, NackResendSleep: 100 * time.Millisecond}, logger)
		},
		init: func(_ context.Context, names []string) error {
			admin, err := sarama.NewClusterAdmin(brokers, pc)
			if err != nil {
				return err
			}
			defer admin.Close()
			for _, name := range names {
				err := admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false)
				if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
					return err
				}
			}
			return nil
		},
	}, nil
}
