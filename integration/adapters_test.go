package integration

// How each Watermill adapter redelivers, as docs/kafka.md, docs/amqp.md,
// docs/sqs.md and docs/nats.md describe it. Each test runs one worker and
// reads the order of its deliveries from its log.

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
)

// A nacked message and the one behind it on the same partition or queue:
// which does the worker see next? Kafka (watermill-kafka) resends the nacked
// message in process and the partition waits: head-of-line blocking. AMQP
// requeues it at once at the head of the queue, so with one consumer and a
// prefetch of 1 it also comes back first. SQS does not delete it; it
// returns after the visibility timeout, and the next message goes first.
// JetStream, with the worker's MaxAckPending of 1, holds B back until A is
// acked or nacked, and redelivers a nacked A first.
func TestNackedMessageRedeliveryOrder(t *testing.T) {
	want := map[string][]string{
		"kafka":   {"A released", "A executed", "B executed"},
		"amqp-v2": {"A released", "A executed", "B executed"},
		"amqp-v3": {"A released", "A executed", "B executed"},
		"sqs":     {"A released", "B executed", "A executed"},
		"nats":    {"A released", "A executed", "B executed"},
	}
	for _, b := range brokerKinds {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, b, storeKinds[1]) // redis: the store does not matter here
			w := h.startSoak("worker")           // its gateway times out once on A
			a := newCommand(t, "A", 100, "transient", 1)
			bb := newCommand(t, "B", 100, "", 1)
			h.publish(a, bb)
			eventually(t, limit, func() bool { return outcomes(w)["executed"] == 2 },
				func() string { return "outcomes " + fmtMap(outcomes(w)) })
			w.stop()
			names := map[string]string{a.UUID: "A", bb.UUID: "B"}
			var got []string
			for _, ev := range w.events() {
				got = append(got, names[ev.MessageUUID]+" "+ev.Outcome)
			}
			if len(got) != 3 || got[0] != want[b.name][0] || got[1] != want[b.name][1] || got[2] != want[b.name][2] {
				t.Errorf("deliveries %q, want %q", got, want[b.name])
			}
		})
	}
}

// watermill-kafka puts the partition and offset of each message on its
// context, and a message it resends after a nack keeps them: topic,
// partition and offset name a Kafka record, across redeliveries.
func TestKafkaMessageContextCarriesPartitionAndOffset(t *testing.T) {
	t.Parallel()
	h := newHarness(t, brokerKinds[0], storeKinds[1])
	topic := h.ns + "-offsets"
	createKafkaTopic(t, topic)

	sub := h.broker.subscriber(t, h.ns+"-offsets")
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	must(t, err)
	h.publishTo(topic, message.NewMessage(watermill.NewUUID(), []byte("one")), message.NewMessage(watermill.NewUUID(), []byte("two")))

	type where struct {
		partition int32
		offset    int64
	}
	read := func() (*message.Message, where) {
		t.Helper()
		select {
		case m := <-ch:
			p, ok1 := kafka.MessagePartitionFromCtx(m.Context())
			o, ok2 := kafka.MessagePartitionOffsetFromCtx(m.Context())
			if !ok1 || !ok2 {
				t.Fatal("no partition or offset on the message context")
			}
			return m, where{p, o}
		case <-ctx.Done():
			t.Fatal("no message")
		}
		return nil, where{}
	}
	first, at := read()
	first.Nack()
	again, atAgain := read()
	if again.UUID != first.UUID || atAgain != at {
		t.Errorf("after a nack got %s at %+v, want %s at %+v again", again.UUID, atAgain, first.UUID, at)
	}
	again.Ack()
	second, next := read()
	second.Ack()
	if next.partition != at.partition || next.offset != at.offset+1 {
		t.Errorf("the next message is at %+v, want offset %d of partition %d", next, at.offset+1, at.partition)
	}
}

// An SQS message keeps its MessageId across redeliveries and its receive
// count rises. watermill-aws does not put either on the Watermill message
// (its UUID comes from a message attribute of Watermill's own); a custom
// Unmarshaler that copies them to metadata makes the MessageId usable as
// the key (keygen.Metadata), for messages other producers send.
func TestSQSMessageIDIsStableAcrossRedeliveries(t *testing.T) {
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
				in.MessageSystemAttributeNames = []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount}
			}
			return in, err
		},
		Unmarshaler: messageIDUnmarshaler{},
	}, logger())
	must(t, err)
	defer sub.Close()
	must(t, sub.SubscribeInitialize(queue))
	t.Cleanup(func() { h.broker.cleanup(t, []string{queue}) })

	// Sent by a producer that is not Watermill: no UUID attribute.
	client := sqs.NewFromConfig(cfg, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	u, err := client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(queue)})
	must(t, err)
	sent, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: u.QueueUrl, MessageBody: aws.String(`{"payment_id":"p-1"}`)})
	must(t, err)

	ch, err := sub.Subscribe(ctx, queue)
	must(t, err)
	var ids, counts []string
	for len(ids) < 2 {
		select {
		case m := <-ch:
			ids = append(ids, m.Metadata.Get("sqs_message_id"))
			counts = append(counts, m.Metadata.Get("sqs_receive_count"))
			if len(ids) == 1 {
				m.Nack() // not deleted: back after the visibility timeout
			} else {
				m.Ack()
			}
		case <-ctx.Done():
			t.Fatalf("got %d deliveries, want 2", len(ids))
		}
	}
	if ids[0] != *sent.MessageId || ids[1] != *sent.MessageId {
		t.Errorf("MessageIds %q, want %q twice", ids, *sent.MessageId)
	}
	if counts[0] != "1" || counts[1] != "2" {
		t.Errorf("ApproximateReceiveCount %q, want 1 then 2", counts)
	}
}

// messageIDUnmarshaler is watermill-aws's default, plus the SQS MessageId
// and receive count in metadata.
type messageIDUnmarshaler struct {
	wsqs.DefaultMarshalerUnmarshaler
}

func (u messageIDUnmarshaler) Unmarshal(m *types.Message) (*message.Message, error) {
	msg, err := u.DefaultMarshalerUnmarshaler.Unmarshal(m)
	if err != nil {
		return nil, err
	}
	msg.Metadata.Set("sqs_message_id", aws.ToString(m.MessageId))
	msg.Metadata.Set("sqs_receive_count", m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)])
	return msg, nil
}
