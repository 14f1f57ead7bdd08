package kafkakeys

import (
	"context"
	"fmt"
	"strconv"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/store"
)

// errNoOffset: the message was not consumed from Kafka by a Watermill router
// (its context holds no partition and offset), so it has no offset key.
var errNoOffset = fmt.Errorf("%w: the message's context holds no Kafka partition and offset (not consumed by watermill-kafka through a router)", keygen.ErrNoKey)

// Offset keys a message by where it sits in Kafka: topic, partition and
// offset, as "<topic>/<partition>/<offset>". The topic is the router's
// subscribe topic; partition and offset come from watermill-kafka's message
// context.
//
// An offset identifies one record of the log, so it catches exactly the
// redeliveries of that record: a rebalance or a crash before the offset
// commit. It does not catch a duplicate the producer wrote twice (a retry
// after a lost ack, an outbox relayed twice): those are two records at two
// offsets. Key those by the message UUID or its content (docs/keys.md).
func Offset() keygen.Generator { return keygen.Func(offsetKey) }

func offsetKey(msg *message.Message) (string, error) {
	if msg == nil {
		return "", fmt.Errorf("%w: message is nil", keygen.ErrNoKey)
	}
	ctx := msg.Context()
	partition, okP := kafka.MessagePartitionFromCtx(ctx)
	offset, okO := kafka.MessagePartitionOffsetFromCtx(ctx)
	if !okP || !okO {
		return "", errNoOffset
	}
	b := make([]byte, 0, 64)
	b = append(b, message.SubscribeTopicFromCtx(ctx)...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(partition), 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, offset, 10)
	return string(b), nil
}

// Position is where a message consumed by watermill-kafka sits: the
// router's subscribe topic, and the partition and offset of its message
// context. It is the watermark mode's pipeline.KafkaWatermark.Position
// (receiver.Builder.WithKafkaWatermark); an error wrapping keygen.ErrNoKey
// for a message not consumed from Kafka.
func Position(msg *message.Message) (store.KafkaPosition, error) {
	if msg == nil {
		return store.KafkaPosition{}, fmt.Errorf("%w: message is nil", keygen.ErrNoKey)
	}
	ctx := msg.Context()
	partition, okP := kafka.MessagePartitionFromCtx(ctx)
	offset, okO := kafka.MessagePartitionOffsetFromCtx(ctx)
	if !okP || !okO {
		return store.KafkaPosition{}, errNoOffset
	}
	return store.KafkaPosition{Topic: message.SubscribeTopicFromCtx(ctx), Partition: partition, Offset: offset}, nil
}

// HighWaterMark asks client for a partition's high-water mark (the offset
// the next record produced to it gets), for the watermark mode's check of
// a recreated topic (pipeline.KafkaWatermark.HighWaterMark). client is a
// sarama.Client of the cluster the subscriber reads; its answer comes from
// the partition's leader.
func HighWaterMark(client sarama.Client) func(ctx context.Context, topic string, partition int32) (int64, error) {
	return func(_ context.Context, topic string, partition int32) (int64, error) {
		return client.GetOffset(topic, partition, sarama.OffsetNewest)
	}
}
