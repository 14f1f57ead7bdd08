package idempotency

import (
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/oncemill/oncemill/pipeline"
)

// deadLetter forwards messages that will never be processed to a topic of
// their own, once, before they are acked.
type deadLetter struct {
	pub   message.Publisher
	topic string
}

// forward publishes a copy of msg (same UUID, payload and metadata, plus
// why: the kind, the attempt that failed, 0 if none ran, and the last
// error) to the dead-letter topic.
func (d *deadLetter) forward(msg *message.Message, kind pipeline.DeadLetterReason, attempt int, reason error) error {
	out := msg.Copy()
	ctx := msg.Context()
	out.Metadata.Set(middleware.ReasonForPoisonedKey, reason.Error())
	out.Metadata.Set(middleware.PoisonedTopicKey, message.SubscribeTopicFromCtx(ctx))
	out.Metadata.Set(middleware.PoisonedHandlerKey, message.HandlerNameFromCtx(ctx))
	out.Metadata.Set(middleware.PoisonedSubscriberKey, message.SubscriberNameFromCtx(ctx))
	out.Metadata.Set(pipeline.ReasonKindKey, string(kind))
	out.Metadata.Set(pipeline.AttemptKey, strconv.Itoa(attempt))
	if err := d.pub.Publish(d.topic, out); err != nil {
		return fmt.Errorf("oncemill: forwarding to dead-letter topic %q: %w", d.topic, err)
	}
	return nil
}
