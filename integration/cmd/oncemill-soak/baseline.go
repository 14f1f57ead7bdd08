package main

// The negative control (--no-idempotency): the payment handler without
// oncemill. It shows that the workload does produce double effects, so a run
// with oncemill that has none proves something; it is also the baseline of
// the throughput benchmark.

import (
	"log/slog"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/integration/internal/worker"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
)

// withoutIdempotency replaces oncemill's receiver: the handler runs as a
// plain Watermill consumer runs it, so every delivery executes. A failure
// marked permanent is logged and acked, as a plain handler must (a nack would
// be redelivered forever); any other failure is nacked and redelivered. It
// reports the same events as oncemill, so the accounting is shared.
func withoutIdempotency(_ worker.Config, d worker.ReceiverDeps) (message.HandlerMiddleware, error) {
	logger := d.Log
	if logger == nil {
		logger = slog.Default()
	}
	var classify policy.Policy
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			msgs, err := h(msg)
			ev := pipeline.Event{MessageUUID: msg.UUID, Outcome: pipeline.OutcomeExecuted, Err: err}
			switch {
			case err == nil:
			case classify.Classify(err) == policy.ClassCached:
				ev.Outcome = pipeline.OutcomeCachedFailure
				logger.Error("Handler failed permanently; the message is acked", "message_uuid", msg.UUID, "error", err)
				msgs, err = nil, nil
			default:
				ev.Outcome = pipeline.OutcomeReleased
			}
			d.OnEvent(ev)
			return msgs, err
		}
	}, nil
}
