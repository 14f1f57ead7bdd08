package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	rig "github.com/oncemill/oncemill/integration/internal/worker"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/keygen/kafkakeys"
	"github.com/oncemill/oncemill/keygen/natskeys"
	"github.com/oncemill/oncemill/keygen/sqskeys"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/memory"
)

// keyRun is a router with a receiver keyed by keys over sub's topic. Its
// handler fails the first delivery of the first message it sees, so that
// the broker redelivers it; every delivery's event is kept.
type keyRun struct {
	mu     sync.Mutex
	events []pipeline.Event
	failed bool
}

func startKeyRun(t *testing.T, sub message.Subscriber, topic string, keys keygen.Generator) *keyRun {
	t.Helper()
	st, err := memory.New(memory.Options{})
	must(t, err)
	t.Cleanup(func() { _ = st.Close() })
	run := &keyRun{}
	r, err := receiver.New(st).
		WithScope("keys").
		WithKeyGenerator(keys).
		WithPolicy(policy.Policy{NackDelay: -1}).
		WithEventHandler(func(e pipeline.Event) {
			run.mu.Lock()
			run.events = append(run.events, e)
			run.mu.Unlock()
		}).
		Build()
	must(t, err)
	router, err := message.NewRouter(message.RouterConfig{}, logger())
	must(t, err)
	router.AddMiddleware(r.Middleware)
	router.AddConsumerHandler("keys", topic, sub, func(*message.Message) error {
		run.mu.Lock()
		defer run.mu.Unlock()
		if !run.failed {
			run.failed = true
			return errors.New("gateway timeout") // retryable: nacked, redelivered
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = router.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	<-router.Running()
	return run
}

// byKey waits for n events and returns each key's outcomes and attempts in
// order, as "outcome@attempt".
func (run *keyRun) byKey(t *testing.T, n int) map[string][]string {
	t.Helper()
	eventually(t, limit, func() bool {
		run.mu.Lock()
		defer run.mu.Unlock()
		return len(run.events) >= n
	}, func() string { return fmt.Sprintf("%d of %d deliveries", len(run.events), n) })
	run.mu.Lock()
	defer run.mu.Unlock()
	out := map[string][]string{}
	for _, e := range run.events {
		out[e.Key] = append(out[e.Key], fmt.Sprintf("%v@%d", e.Outcome, e.Attempt))
	}
	return out
}

// Keyed by Kafka offsets through a router: the record the subscriber
// redelivers after a nack keeps its key (topic/partition/offset), so the
// redelivery is that key's second attempt; the same message published twice
// is two records at two offsets, two keys, and runs twice. An offset key
// catches the broker's redeliveries, not the producer's duplicates
// (docs/keys.md).
func TestKafkaOffsetKeys(t *testing.T) {
	t.Parallel()
	h := newHarness(t, brokerKinds[0], storeKinds[1])
	topic := h.ns + "-offsets"
	createKafkaTopic(t, topic)
	sub := h.broker.subscriber(t, h.ns+"-offsets")
	run := startKeyRun(t, sub, topic, kafkakeys.Offset())

	paid := message.NewMessage(watermill.NewUUID(), []byte(`{"payment_id":"p-1"}`))
	h.publishTo(topic, paid, again(paid)) // the producer sends it twice

	got := run.byKey(t, 3)
	first, second := topic+"/0/0", topic+"/0/1"
	if strings.Join(got[first], " ") != "released@1 executed@2" || strings.Join(got[second], " ") != "executed@1" || len(got) != 2 {
		t.Fatalf("deliveries by key: %v; want %s released then executed at attempt 2, and %s executed once", got, first, second)
	}
}

// Keyed by the SQS MessageId (sqskeys.Unmarshaler keeps it): the message
// SQS redelivers after a nack keeps its MessageId, so the redelivery is that
// key's second attempt; the same body sent twice by a producer gets two
// MessageIds and runs twice.
func TestSQSMessageIDKeys(t *testing.T) {
	t.Parallel()
	h := newHarness(t, brokerKinds[3], storeKinds[1])
	queue := h.ns + "-ids"
	cfg, opts, attrs := sqsConfig()
	sub, err := wsqs.NewSubscriber(wsqs.SubscriberConfig{
		AWSConfig: cfg, OptFns: opts, QueueConfigAttributes: attrs,
		GenerateReceiveMessageInput: func(ctx context.Context, u wsqs.QueueURL) (*sqs.ReceiveMessageInput, error) {
			in, err := wsqs.GenerateReceiveMessageInputDefault(ctx, u)
			if in != nil {
				in.WaitTimeSeconds = 1
			}
			return in, err
		},
		Unmarshaler: sqskeys.Unmarshaler{},
	}, logger())
	must(t, err)
	must(t, sub.SubscribeInitialize(queue))
	t.Cleanup(func() { h.broker.cleanup(t, []string{queue}) })

	// Sent by a producer that is not Watermill, twice with the same body.
	client := sqs.NewFromConfig(cfg, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	u, err := client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(queue)})
	must(t, err)
	var ids []string
	for range 2 {
		sent, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: u.QueueUrl, MessageBody: aws.String(`{"payment_id":"p-1"}`)})
		must(t, err)
		ids = append(ids, *sent.MessageId)
	}
	run := startKeyRun(t, sub, queue, sqskeys.MessageID())

	got := run.byKey(t, 3)
	if len(got) != 2 || len(got[ids[0]])+len(got[ids[1]]) != 3 {
		t.Fatalf("deliveries by key: %v; want the two MessageIds %v", got, ids)
	}
	for _, id := range ids {
		switch strings.Join(got[id], " ") {
		case "released@1 executed@2", "executed@1":
		default:
			t.Fatalf("deliveries of %s: %v; want one run, or a release and a second attempt of the same key", id, got[id])
		}
	}
}

// Keyed by the JetStream stream sequence (natskeys.Unmarshaler keeps it),
// through the worker's durable consumer and a router: the message
// JetStream redelivers after a Nak keeps its sequence, so the redelivery is
// that key's second attempt; the same message published twice is stored
// twice, at two sequences, and runs twice.
func TestNATSSequenceKeys(t *testing.T) {
	t.Parallel()
	h := newHarness(t, brokerKindNamed(t, "nats"), storeKinds[1])
	topic := h.ns + "-sequences"
	t.Cleanup(func() { h.broker.cleanup(t, []string{topic}) })
	sub, err := rig.NewNATSSubscriber(rig.NATSSettings{URL: env.natsURL, AckWait: natsAckWait, MaxDeliver: -1, MaxAckPending: 1,
		Unmarshaler: natskeys.Unmarshaler{}}, h.ns+"-sequences", logger())
	must(t, err)
	paid := message.NewMessage(watermill.NewUUID(), []byte(`{"payment_id":"p-1"}`))
	h.publishTo(topic, paid, again(paid)) // the producer sends it twice
	run := startKeyRun(t, sub, topic, natskeys.Sequence())

	got := run.byKey(t, 3)
	first, second := topic+"/1", topic+"/2"
	if strings.Join(got[first], " ") != "released@1 executed@2" || strings.Join(got[second], " ") != "executed@1" || len(got) != 2 {
		t.Fatalf("deliveries by key: %v; want %s released then executed at attempt 2, and %s executed once", got, first, second)
	}
}
