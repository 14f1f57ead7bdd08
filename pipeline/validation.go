package pipeline

import (
	"fmt"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill"
)

// ValidationConfig configures the validation stage.
type ValidationConfig struct {
	// Validate returns an error for a message that can never be processed.
	Validate func(*message.Message) error
	// DeadLetter, when set, receives each invalid message once.
	DeadLetter *DeadLetter
	// Logger receives an info line per invalid message, and an error line
	// per dead letter that could not be forwarded; nil means slog.Default().
	Logger *slog.Logger
	// OnEvent is called with an Invalid event for each invalid message.
	OnEvent   func(Event)
	Telemetry *Telemetry
}

// Validation is the first stage: an invalid message is never stored and never
// retried. It is acked, counted, and dead-lettered if a destination is set.
type Validation struct {
	cfg ValidationConfig
}

// NewValidation returns the validation stage.
func NewValidation(cfg ValidationConfig) (*Validation, error) {
	if cfg.Validate == nil {
		return nil, oncemill.InvalidConfig("ValidationConfig.Validate", "nil; pass a func(*message.Message) error")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Telemetry == nil {
		cfg.Telemetry = defaultTelemetry()
	}
	return &Validation{cfg: cfg}, nil
}

// Middleware is the stage as a Watermill middleware.
func (v *Validation) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if err := v.cfg.Validate(msg); err != nil {
			return v.refuse(msg, err)
		}
		return h(msg)
	}
}

// refuse acks an invalid message. A frame of its own, so that the valid
// path's frame, on every delivery's stack, stays small.
//
//go:noinline
func (v *Validation) refuse(msg *message.Message, err error) ([]*message.Message, error) {
	invalid := fmt.Errorf("%w: %w", ErrInvalidMessage, err)
	if v.cfg.DeadLetter != nil {
		if ferr := v.cfg.DeadLetter.forward(msg, DeadLetterReasonInvalid, invalid); ferr != nil {
			// Not forwarded: nack, so the message is not lost.
			v.cfg.Logger.LogAttrs(msg.Context(), slog.LevelError, "Forwarding to the dead-letter topic failed; the message is nacked to come back",
				slog.String("message_uuid", msg.UUID), slog.String("reason", err.Error()), slog.Any("error", ferr))
			return nil, ferr
		}
		v.cfg.Telemetry.deadLettered(msg.Context(), DeadLetterReasonInvalid)
	}
	v.cfg.Telemetry.invalid(msg.Context())
	v.cfg.Logger.LogAttrs(msg.Context(), slog.LevelInfo, "Invalid message acked without processing", slog.String("message_uuid", msg.UUID), slog.String("reason", err.Error()))
	if v.cfg.OnEvent != nil {
		v.cfg.OnEvent(Event{MessageUUID: msg.UUID, Outcome: OutcomeInvalid, Err: invalid})
	}
	return nil, nil
}
