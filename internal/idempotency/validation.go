package idempotency

import (
	"fmt"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/pipeline"
)

// refuse acks a message that Config.Validation refused: it is never stored
// and never retried; it is counted, and dead-lettered if a dead letter is
// set. A frame of its own, so that the valid path's frame, on every
// delivery's stack, stays small.
//
//go:noinline
func (s *idempotency) refuse(msg *message.Message, err error) ([]*message.Message, error) {
	invalid := fmt.Errorf("%w: %w", pipeline.ErrInvalidMessage, err)
	if s.deadLetter != nil {
		if ferr := s.deadLetter.forward(msg, pipeline.DeadLetterReasonInvalid, 0, invalid); ferr != nil {
			// Not forwarded: nack, so the message is not lost.
			s.logger.LogAttrs(msg.Context(), slog.LevelError, "Forwarding to the dead-letter topic failed; the message is nacked to come back",
				slog.String("message_uuid", msg.UUID), slog.String("reason", err.Error()), slog.Any("error", ferr))
			return nil, ferr
		}
		s.tel.deadLettered(msg.Context(), pipeline.DeadLetterReasonInvalid)
	}
	s.tel.invalid(msg.Context())
	s.logger.LogAttrs(msg.Context(), slog.LevelInfo, "Invalid message acked without processing", slog.String("message_uuid", msg.UUID), slog.String("reason", err.Error()))
	if s.onEvent != nil {
		s.onEvent(pipeline.Event{MessageUUID: msg.UUID, Outcome: pipeline.OutcomeInvalid, Err: invalid})
	}
	return nil, nil
}
