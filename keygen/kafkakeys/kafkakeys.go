package kafkakeys

import (
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/keygen"
)

// ErrNoOffset: the message was not consumed from Kafka by a Watermill router
// (its context holds no partition and offset), so it has no offset key.
var ErrNoOffset = fmt.Errorf("%w: the message's context holds no Kafka partition and offset (not consumed by watermill-kafka through a router)", keygen.ErrNoKey)

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
		return "", ErrNoOffset
	}
	b := make([]byte, 0, 64)
	b = append(b, message.SubscribeTopicFromCtx(ctx)...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(partition), 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, offset, 10)
	return string(b), nil
}
