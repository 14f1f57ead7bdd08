package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
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
		sessions := &kafkaSessions{byClaim: map[kafkaClaim]context.Context{}}
		sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
			Brokers:               brokers,
			Unmarshaler:           kafka.DefaultMarshaler{},
			OverwriteSaramaConfig: kafkaConsumerConfig(cfg),
			ConsumerGroup:         group,
			// A nacked message is sent to the handler again after this
			// pause, in process; the partition waits meanwhile.
			NackResendSleep: 100 * time.Millisecond,
			// Not a tracer: the hook through which the subscriber tells
			// which group session holds each partition (see kafkaSessions).
			Tracer: sessions,
		}, logger)
		if err != nil {
			return nil, err
		}
		return &kafkaSubscriber{Subscriber: sub, sessions: sessions}, nil
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

// kafkaSubscriber is a watermill-kafka subscriber whose deliveries end when
// their partition is revoked; NewRouter puts its EndOnRevoke middlewares
// around each of its handlers.
type kafkaSubscriber struct {
	*kafka.Subscriber
	sessions *kafkaSessions
}

// EndOnRevoke returns the middlewares that end a delivery when the group
// session that holds its partition ends (see kafkaSessions): outer goes
// outside oncemill's receiver, inner inside it, around the handler.
func (s *kafkaSubscriber) EndOnRevoke() (outer, inner message.HandlerMiddleware) {
	return s.sessions.endOnRevoke, markHandlerRunning
}

// kafkaSessions knows which consumer group session holds each partition of
// a subscriber, so that a rebalance does not wait for a slow delivery.
//
// A rebalance waits until every member's ConsumeClaim has returned.
// watermill-kafka v3.1.4 returns from ConsumeClaim only after the message in
// flight is acked: the message's context is not canceled when the session
// ends (processMessage derives it from the subscriber's context, not from
// the session's), and a nacked message is resent to the handler without
// looking at the session (subscriber.go, processMessage's ResendLoop). While
// the handler's database is down every delivery fails and oncemill pauses
// before each nack, for seconds (the attempt pause), so a member whose
// partition was revoked then rejoined the group seconds after the others,
// and kfake drops the JoinGroup of a member that waits that long
// (TestKfakeDropsJoinOfMemberWhoseSessionExpires): the group stopped until
// sarama's network read timeout (docs/kafka.md, "A rebalance during an
// outage").
//
// endOnRevoke ends such a delivery instead. When the session ends it
// cancels the message's context, but not while the handler runs (a handler
// stopped halfway through an effect outside the store cannot tell whether
// the effect happened, and its redelivery would run it again): at once if
// the handler is not running, when it returns otherwise. oncemill's pause
// then ends and the message is nacked. A message resent after its session
// ended is acked without running the handler: watermill-kafka does not mark
// the offset of a message acked after its session ended, so the
// partition's new owner reads it again, and oncemill keeps that from
// running the effect twice.
type kafkaSessions struct {
	mu      sync.Mutex
	byClaim map[kafkaClaim]context.Context // the session's context
}

type kafkaClaim struct {
	topic     string
	partition int32
}

// session returns the context of the session that holds msg's partition.
func (s *kafkaSessions) session(msg *message.Message) (context.Context, bool) {
	p, ok := kafka.MessagePartitionFromCtx(msg.Context())
	if !ok {
		return nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.byClaim[kafkaClaim{message.SubscribeTopicFromCtx(msg.Context()), p}]
	return sess, ok
}

// revoked reports whether sess ended because the group moved on: a
// rebalance, a failed heartbeat, another claim's end. A session that ends
// because the subscriber closes (its context canceled, no other cause) is
// the worker's shutdown, whose drain lets deliveries finish
// (finishOnShutdown).
func revoked(sess context.Context) bool {
	return sess.Err() != nil && !errors.Is(context.Cause(sess), context.Canceled)
}

// revocation is one delivery's state: whether its handler runs, and
// whether its partition was revoked.
type revocation struct {
	mu      sync.Mutex
	running bool
	revoked bool
	cancel  context.CancelCauseFunc
	cause   error
}

type revocationKey struct{}

// revoke cancels the delivery now, or when its handler returns.
func (r *revocation) revoke(cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.revoked, r.cause = true, cause
	if !r.running {
		r.cancel(cause)
	}
}

func (s *kafkaSessions) endOnRevoke(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		sess, ok := s.session(msg)
		if !ok {
			return h(msg)
		}
		return endWithSession(sess, h, msg)
	}
}

// endWithSession runs h on msg, which the session sess handed out.
func endWithSession(sess context.Context, h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	if revoked(sess) {
		// A resend after a nack, on a partition that is no longer this
		// session's: acked unprocessed, its offset is not committed.
		return nil, nil
	}
	ctx, cancel := context.WithCancelCause(msg.Context())
	defer cancel(nil)
	r := &revocation{cancel: cancel}
	stop := context.AfterFunc(sess, func() {
		if revoked(sess) {
			r.revoke(fmt.Errorf("kafka partition revoked: %w", context.Cause(sess)))
		}
	})
	defer stop()
	msg.SetContext(context.WithValue(ctx, revocationKey{}, r))
	return h(msg)
}

// markHandlerRunning tells endOnRevoke that the handler runs, so that a
// revocation waits for it to return.
func markHandlerRunning(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		r, ok := msg.Context().Value(revocationKey{}).(*revocation)
		if !ok {
			return h(msg)
		}
		r.mu.Lock()
		r.running = true
		r.mu.Unlock()
		defer func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.running = false
			if r.revoked {
				r.cancel(r.cause)
			}
		}()
		return h(msg)
	}
}

// WrapConsumerGroupHandler records the session of each claim while its
// ConsumeClaim runs. The other methods of kafka.SaramaTracer change nothing.
func (s *kafkaSessions) WrapConsumerGroupHandler(h sarama.ConsumerGroupHandler) sarama.ConsumerGroupHandler {
	return claimRecorder{h, s}
}

func (s *kafkaSessions) WrapConsumer(c sarama.Consumer) sarama.Consumer { return c }

func (s *kafkaSessions) WrapPartitionConsumer(pc sarama.PartitionConsumer) sarama.PartitionConsumer {
	return pc
}

func (s *kafkaSessions) WrapSyncProducer(_ *sarama.Config, p sarama.SyncProducer) sarama.SyncProducer {
	return p
}

type claimRecorder struct {
	sarama.ConsumerGroupHandler
	s *kafkaSessions
}

func (r claimRecorder) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	key, ctx := kafkaClaim{claim.Topic(), claim.Partition()}, sess.Context()
	r.s.mu.Lock()
	r.s.byClaim[key] = ctx
	r.s.mu.Unlock()
	defer func() {
		r.s.mu.Lock()
		if r.s.byClaim[key] == ctx {
			delete(r.s.byClaim, key)
		}
		r.s.mu.Unlock()
	}()
	return r.ConsumerGroupHandler.ConsumeClaim(sess, claim)
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
