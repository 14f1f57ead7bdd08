package integration

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	amqp2 "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	amqp3 "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/nats-io/nats.go"
	amqp091 "github.com/rabbitmq/amqp091-go"

	rig "github.com/oncemill/oncemill/integration/internal/worker"
)

// brokerKind is one broker as the tests and the workers reach it.
type brokerKind struct {
	name string
	// workerArgs select the broker in the example worker, or in the soak
	// tool when soakOnly (a client the example worker does not have).
	workerArgs func() []string
	soakOnly   bool
	// publisher and subscriber are the test's own, with the same adapter
	// the worker uses. group names a Kafka consumer group.
	publisher  func(t *testing.T) message.Publisher
	subscriber func(t *testing.T, group string) message.Subscriber
	// cleanup removes what a test left on the broker (its queues).
	cleanup func(t *testing.T, topics []string)
}

// Settings every scenario's workers share: short timeouts, so a crash or a
// nack costs seconds, not minutes.
const (
	kafkaSessionTimeout = 2 * time.Second
	sqsVisibility       = time.Second
	// natsAckWait is above the 3 s (+20%) pause of scenario 4's transient
	// error, so the message comes back once, after the nack.
	natsAckWait = 5 * time.Second
)

var brokerKinds = []brokerKind{
	{
		name: "kafka",
		workerArgs: func() []string {
			return []string{"--broker=kafka", "--kafka-brokers=" + env.kafkaAddr, "--kafka-session-timeout=" + kafkaSessionTimeout.String()}
		},
		publisher: func(t *testing.T) message.Publisher {
			c := kafka.DefaultSaramaSyncPublisherConfig()
			c.Version = sarama.V2_8_0_0
			pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: []string{env.kafkaAddr}, Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: c}, logger())
			must(t, err)
			return pub
		},
		subscriber: func(t *testing.T, group string) message.Subscriber {
			c := kafka.DefaultSaramaSubscriberConfig()
			c.Version = sarama.V2_8_0_0
			c.Consumer.Offsets.Initial = sarama.OffsetOldest
			sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
				Brokers: []string{env.kafkaAddr}, Unmarshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: c, ConsumerGroup: group,
			}, logger())
			must(t, err)
			return sub
		},
		cleanup: func(*testing.T, []string) {}, // kfake lives in memory and ends with the tests
	},
	amqpKind("amqp-v2", "v2", func(t *testing.T) message.Publisher {
		pub, err := amqp2.NewPublisher(amqp2.NewDurableQueueConfig(env.amqpURL), logger())
		must(t, err)
		return pub
	}, func(t *testing.T, _ string) message.Subscriber {
		sub, err := amqp2.NewSubscriber(amqp2.NewDurableQueueConfig(env.amqpURL), logger())
		must(t, err)
		return sub
	}),
	amqpKind("amqp-v3", "v3", func(t *testing.T) message.Publisher {
		pub, err := amqp3.NewPublisher(amqp3.NewDurableQueueConfig(env.amqpURL), logger())
		must(t, err)
		return pub
	}, func(t *testing.T, _ string) message.Subscriber {
		sub, err := amqp3.NewSubscriber(amqp3.NewDurableQueueConfig(env.amqpURL), logger())
		must(t, err)
		return sub
	}),
	{
		name: "sqs",
		workerArgs: func() []string {
			return []string{"--broker=sqs", "--sqs-endpoint=" + env.sqsEndpoint,
				"--sqs-visibility-timeout=" + sqsVisibility.String(), "--sqs-workers=1"}
		},
		publisher: func(t *testing.T) message.Publisher {
			cfg, opts, attrs := sqsConfig()
			pub, err := wsqs.NewPublisher(wsqs.PublisherConfig{AWSConfig: cfg, OptFns: opts, CreateQueueConfig: attrs}, logger())
			must(t, err)
			return pub
		},
		subscriber: func(t *testing.T, _ string) message.Subscriber {
			cfg, opts, attrs := sqsConfig()
			sub, err := wsqs.NewSubscriber(wsqs.SubscriberConfig{AWSConfig: cfg, OptFns: opts, QueueConfigAttributes: attrs}, logger())
			must(t, err)
			return sub
		},
		cleanup: func(t *testing.T, topics []string) {
			cfg, opts, _ := sqsConfig()
			client := sqs.NewFromConfig(cfg, opts...)
			for _, name := range topics {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if u, err := client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(name)}); err == nil {
					_, _ = client.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: u.QueueUrl})
				}
				cancel()
			}
		},
	},
	natsKind(),
}

// natsKind is NATS JetStream through watermill-nats v2 (pkg/nats), with
// the worker's own stream and durable-consumer setup.
func natsKind() brokerKind {
	return brokerKind{
		name: "nats",
		workerArgs: func() []string {
			return []string{"--broker=nats", "--nats-url=" + env.natsURL, "--nats-ack-wait=" + natsAckWait.String()}
		},
		publisher: func(t *testing.T) message.Publisher { return natsPublisher(t) },
		subscriber: func(t *testing.T, group string) message.Subscriber {
			return natsSubscriber(t, group, natsAckWait)
		},
		cleanup: func(t *testing.T, topics []string) {
			js := natsJS(t)
			for _, name := range topics {
				if err := js.DeleteStream(name); err != nil && !errors.Is(err, nats.ErrStreamNotFound) {
					t.Logf("deleting stream %s: %v", name, err)
				}
			}
		},
	}
}

// natsPublisher is the worker's publisher; it creates each topic's stream
// before its first publish (natsStreams).
func natsPublisher(t *testing.T) message.Publisher {
	pub, err := rig.NewNATSPublisher(env.natsURL, logger())
	must(t, err)
	return &natsStreams{Publisher: pub, js: natsJS(t), made: map[string]bool{}}
}

// natsSubscriber is the worker's subscriber of a consumer group, with
// AckWait ackWait.
func natsSubscriber(t *testing.T, group string, ackWait time.Duration) message.Subscriber {
	sub, err := rig.NewNATSSubscriber(rig.NATSSettings{URL: env.natsURL, AckWait: ackWait, MaxDeliver: -1, MaxAckPending: 1}, group, logger())
	must(t, err)
	return sub
}

type natsStreams struct {
	message.Publisher
	js   nats.JetStreamManager
	mu   sync.Mutex
	made map[string]bool
}

func (p *natsStreams) Publish(topic string, msgs ...*message.Message) error {
	p.mu.Lock()
	if !p.made[topic] {
		if err := rig.EnsureNATSStream(p.js, topic); err != nil {
			p.mu.Unlock()
			return err
		}
		p.made[topic] = true
	}
	p.mu.Unlock()
	return p.Publisher.Publish(topic, msgs...)
}

// natsJS is a JetStream manager on a connection of the test's own.
func natsJS(t *testing.T) nats.JetStreamContext {
	nc, err := nats.Connect(env.natsURL, nats.Timeout(5*time.Second))
	must(t, err)
	t.Cleanup(nc.Close)
	js, err := nc.JetStream()
	must(t, err)
	return js
}

// amqpKind is RabbitMQ through a watermill-amqp major: v3 as the example
// worker has it, v2 through the soak tool's --amqp-client=v2.
func amqpKind(name, client string, pub func(*testing.T) message.Publisher, sub func(*testing.T, string) message.Subscriber) brokerKind {
	return brokerKind{
		name: name,
		workerArgs: func() []string {
			args := []string{"--broker=amqp", "--amqp-url=" + env.amqpURL}
			if client != "v3" {
				args = append(args, "--amqp-client="+client)
			}
			return args
		},
		soakOnly:   client != "v3",
		publisher:  pub,
		subscriber: sub,
		cleanup: func(t *testing.T, topics []string) {
			conn, err := amqp091.Dial(env.amqpURL)
			if err != nil {
				t.Logf("deleting queues: %v", err)
				return
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				t.Logf("deleting queues: %v", err)
				return
			}
			defer ch.Close()
			for _, q := range topics {
				_, _ = ch.QueueDelete(q, false, false, false)
			}
		},
	}
}

func sqsConfig() (aws.Config, []func(*sqs.Options), wsqs.QueueConfigAttributes) {
	cfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")}
	opts := []func(*sqs.Options){func(o *sqs.Options) { o.BaseEndpoint = aws.String(env.sqsEndpoint) }}
	return cfg, opts, wsqs.QueueConfigAttributes{VisibilityTimeout: strconv.Itoa(int(sqsVisibility.Seconds()))}
}

// kafkaAdmin connects an admin client to the test cluster.
func kafkaAdmin() (sarama.ClusterAdmin, error) {
	c := sarama.NewConfig()
	c.Version = sarama.V2_8_0_0
	return sarama.NewClusterAdmin([]string{env.kafkaAddr}, c)
}

// createKafkaTopic creates topic with one partition on the test cluster.
func createKafkaTopic(t *testing.T, topic string) {
	t.Helper()
	admin, err := kafkaAdmin()
	must(t, err)
	defer admin.Close()
	must(t, admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false))
}

// kafkaGroupReady reports whether the consumer group has n members that
// each hold at least one partition.
func kafkaGroupReady(t *testing.T, group string, n int) bool {
	admin, err := kafkaAdmin()
	if err != nil {
		t.Logf("kafka admin: %v", err)
		return false
	}
	defer admin.Close()
	groups, err := admin.DescribeConsumerGroups([]string{group})
	if err != nil || len(groups) != 1 || groups[0].State != "Stable" || len(groups[0].Members) != n {
		return false
	}
	for _, m := range groups[0].Members {
		a, err := m.GetMemberAssignment()
		if err != nil || a == nil {
			return false
		}
		total := 0
		for _, ps := range a.Topics {
			total += len(ps)
		}
		if total == 0 {
			return false
		}
	}
	return true
}

func logger() watermill.LoggerAdapter { return watermill.NopLogger{} }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
