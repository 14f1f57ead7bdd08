package pipeline

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/oncemill/oncemill"
)

// ReasonKindKey is the metadata key a dead-lettered message carries with the
// kind of reason: one of the Reason* values. The reason itself, the topic,
// handler and subscriber use Watermill's PoisonQueue keys
// (middleware.ReasonForPoisonedKey and the others), so tools written for
// PoisonQueue read oncemill's dead letters too.
const ReasonKindKey = "oncemill_reason_kind"

// Reasons a message is dead-lettered.
const (
	ReasonInvalid       = "invalid"
	ReasonCachedFailure = "cached_failure"
	ReasonMismatch      = "mismatch"
	ReasonRejected      = "rejected"
)

// DeadLetter forwards messages that will never be processed to a topic of
// their own, once, before they are acked.
type DeadLetter struct {
	pub   message.Publisher
	topic string
}

// NewDeadLetter returns a dead-letter destination.
func NewDeadLetter(pub message.Publisher, topic string) (*DeadLetter, error) {
	if pub == nil {
		return nil, oncemill.InvalidConfig("dead letter publisher", "nil; pass the publisher of the dead-letter topic")
	}
	if topic == "" {
		return nil, oncemill.InvalidConfig("dead letter topic", "empty; name the topic to forward to")
	}
	return &DeadLetter{pub: pub, topic: topic}, nil
}

// forward publishes a copy of msg (same UUID, payload and metadata, plus the
// reason) to the dead-letter topic.
func (d *DeadLetter) forward(msg *message.Message, kind string, reason error) error {
	out := msg.Copy()
	ctx := msg.Context()
	out.Metadata.Set(middleware.ReasonForPoisonedKey, reason.Error())
	out.Metadata.Set(middleware.PoisonedTopicKey, message.SubscribeTopicFromCtx(ctx))
	out.Metadata.Set(middleware.PoisonedHandlerKey, message.HandlerNameFromCtx(ctx))
	out.Metadata.Set(middleware.PoisonedSubscriberKey, message.SubscriberNameFromCtx(ctx))
	out.Metadata.Set(ReasonKindKey, kind)
	if err := d.pub.Publish(d.topic, out); err != nil {
		return fmt.Errorf("oncemill: forwarding to dead-letter topic %q: %w", d.topic, err)
	}
	return nil
}
