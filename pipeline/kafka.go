package pipeline

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/store"
)

// KafkaWatermark configures the watermark mode (receiver's
// WithKafkaWatermark). With watermill-kafka:
//
//	pipeline.KafkaWatermark{
//		Group:         "orders",                          // the subscriber's ConsumerGroup
//		Position:      kafkakeys.Position,
//		HighWaterMark: kafkakeys.HighWaterMark(client), // a sarama.Client
//	}
type KafkaWatermark struct {
	// Group is the subscriber's consumer group: watermill-kafka's message
	// context does not carry it. Required: a consumer without a group reads
	// its partitions from its initial offset on every start, and the
	// offsets it re-reads would all be duplicates.
	Group string
	// Position returns where the message sits: kafkakeys.Position. An error
	// wrapping keygen.ErrNoKey (a message not consumed from Kafka) is
	// handled as policy.MissingKey says. Required.
	Position func(*message.Message) (store.KafkaPosition, error)
	// HighWaterMark returns a partition's high-water mark, checked against
	// the stored watermark once per partition and process, when the first
	// message below the watermark comes (store.KafkaWatermarks).
	// Required.
	HighWaterMark func(ctx context.Context, topic string, partition int32) (int64, error)
}
