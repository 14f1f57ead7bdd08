package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// Shadow mode (Config.Shadow) measures what the stage would do without
// doing it: a delivery whose claim says execute runs and is recorded as
// usual, so the records fill as they will under enforcement; every other
// answer of the store runs the handler unguarded instead, and is reported
// (Event.Outcome, oncemill.outcomes) as what enforcement would have done.
// Either way the router gets the handler's own result, so that the trial
// acks, nacks and dead-letters nothing the bare handler would not.

// shadowed runs the handler, unguarded, for a delivery the stage would
// have answered without running it: a replay (or its rejection, under
// policy.FinishedKeyReject), a held key (at once: shadow
// mode never waits for the holder), a mismatch. The record is neither
// claimed nor changed.
func (s *idempotency) shadowed(d *delivery, h message.HandlerFunc, res *store.ClaimResult) ([]*message.Message, error) {
	ctx := d.msg.Context()
	level := slog.LevelDebug // as a replay's line
	switch res.Decision {
	case store.DecisionReplay:
		d.event.Outcome = pipeline.OutcomeReplayed
		switch {
		case s.policy.FinishedKey == policy.FinishedKeyReject:
			d.event.Outcome = pipeline.OutcomeRejected
		case res.Record.Status == store.StatusCachedFailure:
			d.event.Outcome = pipeline.OutcomeCachedFailureReplayed
		}
		s.tel.replayed(ctx, res.Record)
	case store.DecisionHeld:
		switch {
		case res.RetryIn > 0:
			d.event.Outcome = pipeline.OutcomeHeldBack
		case s.policy.HeldKey == policy.HeldKeyReject:
			d.event.Contended, d.event.Outcome = true, pipeline.OutcomeRejected
		default:
			d.event.Contended, d.event.Outcome = true, pipeline.OutcomeHeldKeyNacked
		}
	case store.DecisionMismatch:
		// The one finding that needs a fix before enforcement: a warning.
		d.event.Outcome, level = pipeline.OutcomeRejected, slog.LevelWarn
	default:
		return s.storeFailed(d, fmt.Errorf("unknown decision %d", res.Decision))
	}
	s.tel.shadowed(ctx, &d.event)
	if s.logger.Enabled(ctx, level) {
		s.logger.LogAttrs(ctx, level, "Shadow mode: the handler runs for a delivery oncemill would have answered without it", s.attrs(d,
			slog.String("would", d.event.Outcome.String()),
			slog.String("decision", decisionName(&d.event)),
		)...)
	}
	return s.runShadowed(d, h)
}

// shadowStoreFailed runs the handler, unguarded, for a delivery the store
// could not decide: in shadow mode the store is on trial, and its outage
// must not hold up the consumer. Its Outcome is what enforcement would
// have done (StoreFailed: nacked; Rejected for a request the store
// refuses).
func (s *idempotency) shadowStoreFailed(d *delivery, h message.HandlerFunc, err error) ([]*message.Message, error) {
	d.event.Outcome = pipeline.OutcomeStoreFailed
	if errors.Is(err, store.ErrInvalidRequest) {
		d.event.Outcome = pipeline.OutcomeRejected
	}
	s.logError(d, "The store could not decide the delivery; shadow mode runs the handler unguarded", fmt.Errorf("oncemill: claiming the key: %w", err))
	return s.runShadowed(d, h)
}

// shadowUnkeyed runs the handler, unguarded, for a delivery that has no
// usable key (none, the generator failed, the payload is too large), which
// enforcement would reject, or nack until the generator recovers: a trial
// must neither lose such a message nor hold up the consumer behind it. A
// cached failure of the generator would be rejected, not nacked.
func (s *idempotency) shadowUnkeyed(d *delivery, h message.HandlerFunc, would pipeline.Outcome, err error) ([]*message.Message, error) {
	if would == pipeline.OutcomeKeyFailed && s.policy.Classify(err) == policy.ClassCached {
		would = pipeline.OutcomeRejected
	}
	d.event.Outcome = would
	s.logError(d, "The message has no usable key; shadow mode runs the handler unguarded", err)
	return s.runShadowed(d, h)
}

// runShadowed runs the handler with the retry and breaker as configured,
// records nothing, and returns its result: a success with what it
// produced; a failure, permanent or not, after policy.NackDelay, so that a
// broker that redelivers at once is paced. Event.Err is the handler's
// error.
func (s *idempotency) runShadowed(d *delivery, h message.HandlerFunc) ([]*message.Message, error) {
	d.event.Shadow = true
	msgs, err := s.retry.run(d.msg.Context(), func() ([]*message.Message, error) { return runHandler(h, d.msg) })
	d.event.Err = err
	if err == nil {
		return msgs, nil
	}
	return nil, s.shadowNack(d, err)
}

// shadowFailed answers an execution's failure that enforcement would ack:
// a cached failure, or the last attempt's, dead-lettered or dropped
// (policy.ExhaustedDrop). It is recorded as under enforcement (out), so
// that its duplicates are decided from the record, and counted as what
// enforcement would have done; but nothing is dead-lettered, and the
// handler's error goes back to the router, which nacks it as it would
// without oncemill.
func (s *idempotency) shadowFailed(ctx context.Context, d *delivery, rec recorder, out store.Completion) ([]*message.Message, error) {
	d.event.Outcome, d.event.Shadow = pipeline.OutcomeCachedFailure, true
	if err := rec.cache(ctx, out); err != nil && !errors.Is(err, store.ErrLeaseLost) {
		d.event.Outcome = pipeline.OutcomeStoreFailed
		s.logError(d, "The handler's failure could not be recorded", fmt.Errorf("oncemill: recording failure %q: %w", out.ErrorMessage, err))
	}
	s.countExhausted(d)
	would := "cache the failure and ack"
	switch {
	case s.deadLetter != nil:
		would = "dead-letter and ack"
	case d.event.Exhausted:
		would = "drop: ack without a dead letter (policy.ExhaustedDrop)"
	}
	s.logger.LogAttrs(d.msg.Context(), slog.LevelError, "Shadow mode: the handler failed; the message is nacked, where enforcement would "+would, s.attrs(d,
		slog.String("would", d.event.Outcome.String()),
		slog.Any("error", d.event.Err),
	)...)
	return nil, s.shadowNack(d, d.event.Err)
}

// shadowNack pauses policy.NackDelay before the nack of the handler's err.
func (s *idempotency) shadowNack(d *delivery, err error) error {
	if serr := sleep(d.msg.Context(), s.policy.NackDelay); serr != nil {
		return errors.Join(err, serr)
	}
	return err
}
