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
	b := &Broker{System: "kafka", Pub: pub, Closers: []func() error{pub.Close}}
	b.Subscriber = func(group string) (message.Subscriber, error) {
		return kafka.NewSubscriber(kafka.SubscriberConfig{
			Brokers:               brokers,
			Unmarshaler:           kafka.DefaultMarshaler{},
			OverwriteSaramaConfig: kafkaConsumerConfig(cfg),
			ConsumerGroup:         group,
			// A nacked message is sent to the handler again after this
			// pause, in process; the partition waits meanwhile.
			NackResendSleep: 100 * time.Millisecond,
		}, logger)
	}
	b.InitTopics = func(ctx context.Context, names []string) error {
		return createKafkaTopics(brokers, names, cfg.KafkaPartitions)
	}
	return b, nil
}

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
	// rejoins within a heartbeat, so the session timeout is ample.
	c.Consumer.Group.Rebalance.Timeout = cfg.KafkaSessionTimeout
	c.Consumer.Group.Rebalance.Retry.Backoff = 250 * time.Millisecond
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
