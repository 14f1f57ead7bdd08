package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/oncemill/oncemill/keygen/kafkakeys"
)

// kafkaVersion is the protocol version sarama speaks: Kafka 2.8 and later
// (the apache/kafka image of docker-compose.yml, and kfake) understand it.
var kafkaVersion = sarama.V2_8_0_0

// newKafka connects to Kafka through watermill-kafka (sarama). Each router
// handler gets its own consumer group, <group>-<topic>, so workers that run
// the same handlers share its partitions, and a rebalance of one topic does
// not stop the others.
func newKafka(cfg Config, logger watermill.LoggerAdapter) (*Broker, error) {
	brokers := strings.Split(cfg.KafkaBrokers, ",")
	pubCfg := kafka.DefaultSaramaSyncPublisherConfig()
	pubCfg.Version = kafkaVersion
	pubCfg.Metadata.Retry.Backoff = 250 * time.Millisecond
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               brokers,
		Marshaler:             kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: pubCfg,
	}, logger)
	if err != nil {
		return nil, fmt.Errorf("kafka publisher (%s): %w", cfg.KafkaBrokers, err)
	}
	b := &Broker{System: semconv.MessagingSystemKafka, Pub: pub, Closers: []func() error{pub.Close}}
	b.Subscriber = func(group string) (message.Subscriber, error) {
		sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
			Brokers:               brokers,
			Unmarshaler:           kafka.DefaultMarshaler{},
			OverwriteSaramaConfig: kafkaConsumerConfig(cfg),
			ConsumerGroup:         group,
			// A nacked message is sent to the handler again after this
			// pause, in process; the partition waits meanwhile.
			NackResendSleep: 100 * time.Millisecond,
		}, logger)
		if err != nil {
			return nil, err
		}
		return sub, nil
	}
	b.InitTopics = func(ctx context.Context, names []string) error {
		return createKafkaTopics(brokers, names, cfg.KafkaPartitions)
	}
	if cfg.KafkaWatermark {
		cc := sarama.NewConfig()
		cc.Version = kafkaVersion
		cc.Metadata.Retry.Backoff = 250 * time.Millisecond
		client, err := sarama.NewClient(brokers, cc)
		if err != nil {
			_ = b.Close()
			return nil, fmt.Errorf("kafka client (%s): %w", cfg.KafkaBrokers, err)
		}
		b.Closers = append(b.Closers, client.Close)
		b.HighWaterMark = kafkakeys.HighWaterMark(client)
	}
	return b, nil
}

// kafkaReadTimeoutMargin is how much longer than the rebalance timeout a
// consumer waits for a response.
const kafkaReadTimeoutMargin = 5 * time.Second

// kafkaConsumerConfig is the sarama configuration of a consumer.
func kafkaConsumerConfig(cfg Config) *sarama.Config {
	c := kafka.DefaultSaramaSubscriberConfig()
	c.Version = kafkaVersion
	// A new group starts at the beginning of the topic: messages published
	// before the first worker joined are consumed, not skipped.
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	// After a crash the group waits this long before another member takes
	// the partitions over (and redelivers what was not committed).
	c.Consumer.Group.Session.Timeout = cfg.KafkaSessionTimeout
	c.Consumer.Group.Heartbeat.Interval = cfg.KafkaSessionTimeout / 4
	// A rebalance waits at most this long for the members to rejoin. Sarama's
	// default (60 s) outlasts its own 30 s network read timeout: with workers
	// crashing every few seconds the JoinGroup call timed out, the member
	// rejoined, the coordinator waited again, and the group made no progress
	// for minutes (TestKafkaGroupProgressesWhileWorkersCrash). A live member
	// rejoins within a heartbeat. Half the session timeout, not all of it:
	// a member that rejoined stops heartbeating, and kfake removes it, its
	// JoinGroup unanswered, when its session runs out before the rebalance
	// ends (TestKfakeDropsJoinOfMemberWhoseSessionExpires); every join
	// restarts the rebalance timer, so with workers crashing every 1–3 s a
	// rebalance as long as the session dropped members and the group went
	// 11–18 s without progress (TestKafkaGroupProgressesAfterDatabaseOutage,
	// docs/kafka.md).
	c.Consumer.Group.Rebalance.Timeout = cfg.KafkaSessionTimeout / 2
	c.Consumer.Group.Rebalance.Retry.Backoff = 250 * time.Millisecond
	// How long sarama waits for any response, sarama's default 30 s
	// otherwise. A JoinGroup legitimately waits up to the rebalance timeout;
	// nothing else waits longer than a fetch's MaxWaitTime (500 ms). A
	// response that never comes costs this long: kfake drops, without an
	// answer, the JoinGroup of a member whose session timer runs out while
	// it waits for a slower member to rejoin
	// (TestKfakeDropsJoinOfMemberWhoseSessionExpires), and with the 30 s
	// default a group stopped until that timeout after a database outage
	// (docs/kafka.md, "A rebalance during an outage").
	c.Net.ReadTimeout = c.Consumer.Group.Rebalance.Timeout + kafkaReadTimeoutMargin
	// Ack marks the offset; the commit follows within this interval. A
	// crash inside it redelivers the marked messages: oncemill replays them.
	c.Consumer.Offsets.AutoCommit.Interval = 250 * time.Millisecond
	c.Metadata.Retry.Backoff = 250 * time.Millisecond
	return c
}

// createKafkaTopics creates the topics that do not exist yet.
func createKafkaTopics(brokers, names []string, partitions int) error {
	c := sarama.NewConfig()
	c.Version = kafkaVersion
	admin, err := sarama.NewClusterAdmin(brokers, c)
	if err != nil {
		return fmt.Errorf("kafka admin (%s): %w", strings.Join(brokers, ","), err)
	}
	defer admin.Close()
	for _, name := range names {
		err := admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: int32(partitions), ReplicationFactor: 1}, false)
		if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			return fmt.Errorf("create kafka topic %s: %w", name, err)
		}
	}
	return nil
}
