package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/cenkalti/backoff/v5"

	"github.com/oncemill/oncemill/internal/result"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// idempotency is what the two modes of the stage share (Leased,
// Transactional): the key, the answers to a duplicate, rejections, and what a
// failure leaves behind. Each mode adds how it claims, runs and records.
type idempotency struct {
	ttl         retention             // the policy's TTLs
	retentions  map[string]*retention // by handler name (Config.RetentionFor); nil: none
	keys        keygen.Generator
	fingerprint func(*message.Message) string
	scope       string
	scopeOf     func(*message.Message) (string, error) // Config.ScopeFunc; nil: scope
	policy      policy.Policy
	logger      *slog.Logger
	onEvent     func(pipeline.Event)
	validate    func(*message.Message) error
	deadLetter  *deadLetter
	retry       *retrier // nil: one try
	breaker     *breaker // nil: no circuit
	tel         *telemetry
	maxKeyLen   int
	shadow      bool // Config.Shadow: run the handler for every answer but execute (shadow.go)
	// storeFailures counts claims that failed in a row, across
	// deliveries: the pause before their nack grows with it.
	storeFailures atomic.Int32
}

// delivery is one message passing through the stage.
type delivery struct {
	msg    *message.Message
	event  pipeline.Event
	ttl    *retention    // the TTLs its record is written with; set with its key
	stored time.Duration // the TTL of the outcome recorded for it; 0: none recorded
}

// Both modes' Middleware read: refuse what validation refuses; for the
// rest, compute the key, claim and run (the mode's own handle), and report
// the decision. Each mode calls these itself, with no interface call on the
// way: the delivery then stays on the stack.

// refused runs Config.Validation and answers a message it refuses.
func (s *idempotency) refused(msg *message.Message) (msgs []*message.Message, refused bool, err error) {
	if s.validate == nil {
		return nil, false, nil
	}
	if verr := s.validate(msg); verr != nil {
		msgs, err = s.refuse(msg, verr)
		return msgs, true, err
	}
	return nil, false, nil
}

// decided measures and reports what became of the delivery.
func (s *idempotency) decided(d *delivery) {
	s.tel.decided(d.msg.Context(), &d.event, d.stored)
	if d.stored > 0 {
		s.logStored(d)
	}
	if s.onEvent != nil {
		s.onEvent(d.event)
	}
}

// keyed computes the scope and the key. A message without a usable key is
// answered here (done): rejected, run unguarded, or nacked. It keeps the
// common path in one small frame: every message runs on a fresh router
// goroutine, whose stack would otherwise grow and be copied. Rare paths
// live in their own functions.
func (s *idempotency) keyed(d *delivery, h message.HandlerFunc) (msgs []*message.Message, done bool, err error) {
	msg := d.msg
	d.event.Scope = s.scope
	if s.scopeOf != nil {
		if err = s.scopeFor(d); err != nil {
			msgs, err = s.keyFailed(d, h, err)
			return msgs, true, err
		}
	} else if d.event.Scope == "" {
		// A handler name no store can hold is hashed, as a key would be.
		d.event.Scope = keygen.StorableKey(message.HandlerNameFromCtx(msg.Context()), store.MaxScopeLen)
	}
	if len(msg.Payload) > s.policy.MaxPayloadBytes {
		msgs, err = s.tooLarge(d, h)
		return msgs, true, err
	}
	key, err := s.keys.Key(msg)
	if err == nil && key == "" {
		err = keygen.ErrEmptyKey
	}
	if err != nil {
		msgs, err = s.keyFailed(d, h, err)
		return msgs, true, err
	}
	d.event.Key = keygen.StorableKey(key, s.maxKeyLen)
	d.ttl = &s.ttl
	if s.retentions != nil {
		d.ttl = s.retentionOf(msg)
	}
	return nil, false, nil
}

// errEmptyScope: Config.ScopeFunc returned "" without an error. Like an
// empty key, it is a message without a usable identity (keygen.ErrNoKey).
var errEmptyScope = fmt.Errorf("%w: the scope function returned an empty scope", keygen.ErrNoKey)

// scopeFor sets the delivery's scope from Config.ScopeFunc, hashed when no
// store could hold it, as a key is. Its error goes to keyFailed: the scope
// is half of the record's identity.
//
//go:noinline
func (s *idempotency) scopeFor(d *delivery) error {
	scope, err := s.scopeOf(d.msg)
	switch {
	case err != nil:
		return fmt.Errorf("the scope function failed: %w", err)
	case scope == "":
		return errEmptyScope
	}
	d.event.Scope = keygen.StorableKey(scope, store.MaxScopeLen)
	return nil
}

// answer acts on every decision but Execute: it replays, rejects, or waits
// for a key held by another delivery (done false: ask the store again).
func (s *idempotency) answer(d *delivery, w *waiter, res *store.ClaimResult) (msgs []*message.Message, done bool, err error) {
	switch res.Decision {
	case store.DecisionReplay:
		if s.policy.FinishedKey == policy.FinishedKeyReject {
			msgs, err = s.reject(d, pipeline.DeadLetterReasonDuplicateRejected, s.duplicate(d, pipeline.ErrDuplicateRejected, res.Record, nil))
			return msgs, true, err
		}
		msgs, err = s.replay(d, res.Record)
		return msgs, true, err
	case store.DecisionHeld:
		if res.RetryIn > 0 {
			return nil, true, s.heldBack(d, res.RetryIn)
		}
		d.event.Contended = true
		again, err := s.inProgress(d, w, res.Record)
		return nil, !again, err
	case store.DecisionMismatch:
		msgs, err = s.mismatch(d)
		return msgs, true, err
	}
	msgs, err = s.storeFailed(d, fmt.Errorf("unknown decision %d", res.Decision))
	return msgs, true, err
}

func (s *idempotency) mismatch(d *delivery) ([]*message.Message, error) {
	return s.reject(d, pipeline.DeadLetterReasonMismatch, fmt.Errorf("%w: scope %q key %q is stored with another payload fingerprint; use a key that covers the payload or turn fingerprinting off", pipeline.ErrMismatch, d.event.Scope, d.event.Key))
}

func (s *idempotency) tooLarge(d *delivery, h message.HandlerFunc) ([]*message.Message, error) {
	err := fmt.Errorf("%w: %d bytes, limit %d (policy.MaxPayloadBytes)", pipeline.ErrPayloadTooLarge, len(d.msg.Payload), s.policy.MaxPayloadBytes)
	if s.shadow {
		return s.shadowUnkeyed(d, h, pipeline.OutcomeRejected, err)
	}
	return s.reject(d, pipeline.DeadLetterReasonPayloadTooLarge, err)
}

// keyFailed decides what a key generator's error means. A message that has
// no key (keygen.ErrNoKey and the errors wrapping it) is handled as
// policy.MissingKey says. Any other error is the generator's own failure,
// classified by the policy like a handler's: a cached one rejects the
// message; a retryable one (a lookup service down) nacks it after
// NackDelay, so it comes back, and never runs it unguarded.
func (s *idempotency) keyFailed(d *delivery, h message.HandlerFunc, err error) ([]*message.Message, error) {
	if errors.Is(err, keygen.ErrNoKey) {
		return s.noKey(d, h, err)
	}
	if s.shadow {
		return s.shadowUnkeyed(d, h, pipeline.OutcomeKeyFailed, err)
	}
	if s.policy.Classify(err) == policy.ClassCached {
		return s.reject(d, pipeline.DeadLetterReasonKeyFailed, fmt.Errorf("oncemill: cannot compute the idempotency key: %w", err))
	}
	err = fmt.Errorf("oncemill: computing the idempotency key failed; the message is nacked to come back: %w", err)
	d.event.Outcome, d.event.Err = pipeline.OutcomeKeyFailed, err
	s.logError(d, "The key generator failed; the message is nacked to come back after a pause", err)
	if serr := sleep(d.msg.Context(), s.policy.NackDelay); serr != nil {
		return nil, errors.Join(err, serr)
	}
	return nil, err
}

func (s *idempotency) noKey(d *delivery, h message.HandlerFunc, err error) ([]*message.Message, error) {
	if s.policy.MissingKey == policy.MissingKeyRunUnguarded {
		d.event.Outcome, d.event.Err = pipeline.OutcomeUnguarded, err
		return s.retry.run(d.msg.Context(), func() ([]*message.Message, error) { return runHandler(h, d.msg) })
	}
	if s.shadow {
		return s.shadowUnkeyed(d, h, pipeline.OutcomeRejected, err)
	}
	// err says it already: "oncemill: no key: <why>".
	return s.reject(d, pipeline.DeadLetterReasonNoKey, err)
}

// storeFailed nacks a delivery the store could not decide, so it comes
// back; but a request the store refuses as such (store.ErrInvalidRequest)
// would be refused again on every delivery, so that one is rejected.
//
// Before the nack it pauses, so that a broker that redelivers at once
// (AMQP) does not turn a store outage into a storm of nacks: NackDelay,
// doubling with every ClaimLease that failed in a row, across deliveries, up to
// maxStorePauseDoublings doublings, with ±20% jitter so that the deliveries
// of one outage do not all come back at the same moment. A ClaimLease that
// succeeds starts the count again.
func (s *idempotency) storeFailed(d *delivery, err error) ([]*message.Message, error) {
	if errors.Is(err, store.ErrInvalidRequest) {
		return s.reject(d, pipeline.DeadLetterReasonKeyRefused, fmt.Errorf("the store refuses the message's key: %w", err))
	}
	d.event.Outcome, d.event.Err = pipeline.OutcomeStoreFailed, err
	err = fmt.Errorf("oncemill: claiming the key: %w", err)
	s.logError(d, "The store could not decide the delivery; it is nacked to come back after a pause", err)
	if serr := sleep(d.msg.Context(), s.storePause()); serr != nil {
		return nil, errors.Join(err, serr)
	}
	return nil, err
}

// maxStorePauseDoublings bounds the pause before a store-failure nack at
// 8 × NackDelay: long enough to calm a storm of redeliveries, short enough
// that a store back from an outage is used again within seconds.
const maxStorePauseDoublings = 3

// storePause counts one more store failure in a row and returns the pause
// before its nack.
func (s *idempotency) storePause() time.Duration {
	n := s.storeFailures.Add(1)
	pause := s.policy.NackDelay << min(n-1, maxStorePauseDoublings)
	return time.Duration(float64(pause) * (0.8 + 0.4*rand.Float64()))
}

// storeAnswered ends a run of store failures.
func (s *idempotency) storeAnswered() {
	if s.storeFailures.Load() != 0 {
		s.storeFailures.Store(0)
	}
}

// waiter paces the polling of a key held by another delivery.
type waiter struct {
	pause *backoff.ExponentialBackOff
	until time.Time
}

// inProgress decides what a duplicate does while another delivery holds the
// key (rec, when the store could read it): ask the store again (true), or
// give up with the error to return.
func (s *idempotency) inProgress(d *delivery, w *waiter, rec *store.Record) (again bool, err error) {
	ctx := d.msg.Context()
	switch s.policy.HeldKey {
	case policy.HeldKeyReject:
		_, err := s.reject(d, pipeline.DeadLetterReasonDuplicateRejected, s.duplicate(d, pipeline.ErrDuplicateRejected, rec, w))
		return false, err
	case policy.HeldKeyWait:
		if w.pause == nil {
			w.pause = &backoff.ExponentialBackOff{InitialInterval: 5 * time.Millisecond, RandomizationFactor: 0.3, Multiplier: 2, MaxInterval: 250 * time.Millisecond}
			if w.until.IsZero() { // the one-transaction mode set it before its first claim
				w.until = time.Now().Add(s.policy.HeldKeyTimeout)
			}
		}
		if pause := min(w.pause.NextBackOff(), time.Until(w.until)); pause > 0 {
			if err := sleep(ctx, pause); err != nil {
				d.event.Outcome, d.event.Err = pipeline.OutcomeHeldKeyNacked, err
				return false, err
			}
			return true, nil
		}
	}
	err = s.duplicate(d, pipeline.ErrKeyHeld, rec, w)
	d.event.Outcome, d.event.Err = pipeline.OutcomeHeldKeyNacked, err
	if serr := sleep(ctx, s.policy.NackDelay); serr != nil {
		return false, errors.Join(err, serr)
	}
	return false, err
}

// heldBack nacks a delivery that came before its key's next attempt may
// start (store.ClaimResult.RetryIn): the pause after a retryable failure,
// kept by the store, still runs, and another consumer got the message. It
// is not an attempt. The nack waits for the time left, at most the
// longest pause the stage writes (maxRetryAfter).
func (s *idempotency) heldBack(d *delivery, retryIn time.Duration) error {
	err := fmt.Errorf("oncemill: scope %q key %q: a retryable failure holds the next attempt back for %v", d.event.Scope, d.event.Key, retryIn.Round(time.Millisecond))
	d.event.Outcome, d.event.Err = pipeline.OutcomeHeldBack, err
	if serr := sleep(d.msg.Context(), min(retryIn, s.maxRetryAfter())); serr != nil {
		return errors.Join(err, serr)
	}
	return err
}

// reject acks a delivery that must never run, after forwarding it to the
// dead-letter topic if one is set. If forwarding fails it nacks instead, so
// the message is not lost.
func (s *idempotency) reject(d *delivery, reason pipeline.DeadLetterReason, err error) ([]*message.Message, error) {
	d.event.Outcome, d.event.Err = pipeline.OutcomeRejected, policy.Cached(err)
	if ferr := s.toDeadLetter(d, reason, err); ferr != nil {
		d.event.Outcome = pipeline.OutcomeStoreFailed
		return nil, ferr
	}
	s.logError(d, "Message rejected as a permanent failure; it is acked and not run", err)
	return nil, nil
}

func (s *idempotency) toDeadLetter(d *delivery, reason pipeline.DeadLetterReason, err error) error {
	if s.deadLetter == nil {
		return nil
	}
	if ferr := s.deadLetter.forward(d.msg, reason, d.event.Attempt, err); ferr != nil {
		s.logError(d, "Forwarding to the dead-letter topic failed; the message is nacked to come back", ferr)
		return ferr
	}
	s.tel.deadLettered(d.msg.Context(), reason)
	return nil
}

func (s *idempotency) replay(d *delivery, rec *store.Record) ([]*message.Message, error) {
	s.tel.replayed(d.msg.Context(), rec)
	if s.logger.Enabled(d.msg.Context(), slog.LevelDebug) {
		s.logReplay(d, rec)
	}
	if rec.Status == store.StatusCachedFailure {
		d.event.Outcome = pipeline.OutcomeCachedFailureReplayed
		d.event.Err = policy.Cached(fmt.Errorf("cached failure (%s): %s", rec.ErrorKind, rec.ErrorMessage))
		return nil, nil
	}
	d.event.Outcome = pipeline.OutcomeReplayed
	msgs, omitted, err := result.Decode(rec.Result)
	switch {
	case err != nil:
		d.event.Err = err
		s.logError(d, "Stored result cannot be decoded; the duplicate is acked without re-publishing", err)
	case omitted:
		s.logger.LogAttrs(d.msg.Context(), slog.LevelInfo, "Duplicate of a success whose produced messages were too large to store; nothing is re-published", s.attrs(d)...)
	}
	return msgs, nil
}

// successOutcome is what a success stores: the produced messages, or a
// marker that they were too large to keep.
func (s *idempotency) successOutcome(msgs []*message.Message, ttl time.Duration) store.Completion {
	result, err := result.Encode(msgs, s.policy.MaxResultBytes)
	if err != nil {
		s.logger.LogAttrs(context.Background(), slog.LevelError, "Produced messages are not stored; a duplicate will not re-publish them", slog.Any("error", err))
	}
	return store.Completion{Status: store.StatusSucceeded, Result: result, TTL: ttl}
}

// recorder writes what a failed execution leaves behind, the mode's way.
type recorder interface {
	// cache records the failure that answers the key's duplicates.
	cache(ctx context.Context, out store.Completion) error
	// giveBack frees the key after a retryable failure (out:
	// retryOutcome).
	giveBack(ctx context.Context, out store.Completion) error
}

// fail decides what a failed execution leaves behind. A retryable failure
// with attempts left gives the key back (keeping the attempt count) and
// nacks after the attempt's pause. A cached failure, and a retryable one
// that used the last attempt, is dead-lettered if a dead letter is set,
// recorded and acked; without a dead letter, an exhausted message is
// dropped only under policy.ExhaustedDrop, and kept otherwise. Under
// policy.NeverCacheFailures every failure is retryable and an exhausted
// message is kept, dead letter or not. Shadow mode records the same but
// acks no failure: see shadowFailed.
func (s *idempotency) fail(ctx context.Context, d *delivery, rec recorder, herr error) ([]*message.Message, error) {
	d.event.Err = herr
	if errors.Is(herr, pipeline.ErrCircuitOpen) {
		return s.circuitOpen(ctx, d, rec, herr)
	}
	kind := store.ErrorKindCached
	if s.policy.NeverCacheFailures || s.policy.Classify(herr) != policy.ClassCached {
		if d.event.Attempt < s.policy.MaxAttempts {
			return s.retryLater(ctx, d, rec, herr)
		}
		d.event.Exhausted, kind = true, store.ErrorKindAttemptsExhausted
		if s.policy.NeverCacheFailures || s.deadLetter == nil && s.policy.Exhausted == policy.ExhaustedKeep {
			return s.keep(ctx, d, rec, herr)
		}
	}
	out := store.Completion{Status: store.StatusCachedFailure, ErrorKind: kind, ErrorMessage: herr.Error(), TTL: d.ttl.failure}
	if s.shadow {
		return s.shadowFailed(ctx, d, rec, out)
	}
	reason := pipeline.DeadLetterReasonCachedFailure
	if d.event.Exhausted {
		reason = pipeline.DeadLetterReasonAttemptsExhausted
	}
	// Forwarded before it is recorded: a failed forward releases the key and
	// nacks, so the failure is decided again and forwarded on redelivery.
	if ferr := s.toDeadLetter(d, reason, herr); ferr != nil {
		d.event.Outcome = pipeline.OutcomeStoreFailed
		_ = rec.giveBack(ctx, retryOutcome(d, 0, false))
		return nil, ferr
	}
	d.event.Outcome = pipeline.OutcomeCachedFailure
	if err := rec.cache(ctx, out); err != nil && !errors.Is(err, store.ErrLeaseLost) {
		// Not recorded: nack, so the failure is decided again on redelivery
		// rather than forgotten.
		d.event.Outcome = pipeline.OutcomeStoreFailed
		err = fmt.Errorf("oncemill: recording failure %q: %w", herr.Error(), err)
		s.logError(d, "The handler's failure could not be recorded; the message is nacked to be decided again", err)
		return nil, err
	}
	s.countExhausted(d)
	switch {
	case !d.event.Exhausted:
		s.logError(d, "Handler failed permanently; the failure is cached and the message acked", herr)
	case s.deadLetter != nil:
		s.logError(d, "Handler failed on its last attempt; the message is dead-lettered and acked", herr)
	default:
		s.logError(d, "Handler failed on its last attempt; the message is DROPPED (policy.ExhaustedDrop): acked without a dead letter", herr)
	}
	return nil, nil
}

// countExhausted counts a failure on the last attempt that enforcement
// acks (fail, and shadowFailed for what enforcement would do) by its
// action: dead-lettered, or dropped (policy.ExhaustedDrop).
func (s *idempotency) countExhausted(d *delivery) {
	if !d.event.Exhausted {
		return
	}
	action := exhaustedDropped
	if s.deadLetter != nil {
		action = exhaustedDeadLettered
	}
	s.tel.exhausted(d.msg.Context(), action)
}

// retryLater gives the key back after a retryable failure and nacks, after
// the attempt's pause (attemptPause).
func (s *idempotency) retryLater(ctx context.Context, d *delivery, rec recorder, herr error) ([]*message.Message, error) {
	d.event.Outcome = pipeline.OutcomeReleased
	return s.pauseThenNack(ctx, d, rec, herr, s.attemptPause(d.event.Attempt), false)
}

// circuitOpen gives the key back without spending an attempt: the breaker
// refused the delivery before the handler ran. It pauses until the circuit
// may let a call through: the time it has left open, at least NackDelay,
// at most maxCircuitPause.
func (s *idempotency) circuitOpen(ctx context.Context, d *delivery, rec recorder, herr error) ([]*message.Message, error) {
	d.event.Outcome = pipeline.OutcomeHeldBack
	return s.pauseThenNack(ctx, d, rec, herr, min(max(s.breaker.openFor(), s.policy.NackDelay), maxCircuitPause), true)
}

// pauseThenNack gives the key back with its next attempt held back for
// pause, by the store, so that another consumer that gets the message
// sooner (a rebalance, a requeue, a crash) waits it out too; then it nacks
// after the same pause.
func (s *idempotency) pauseThenNack(ctx context.Context, d *delivery, rec recorder, herr error, pause time.Duration, uncounted bool) ([]*message.Message, error) {
	if err := rec.giveBack(ctx, retryOutcome(d, pause, uncounted)); err != nil && !errors.Is(err, store.ErrLeaseLost) {
		// The lease will expire on its own; the redelivery then takes over.
		s.logError(d, "Could not release the key after a retryable failure", err)
	}
	if serr := sleep(d.msg.Context(), pause); serr != nil {
		return nil, errors.Join(herr, serr)
	}
	return nil, herr
}

// maxCircuitPause bounds the pause of a delivery the circuit refused:
// gobreaker's default open state lasts a minute.
const maxCircuitPause = time.Minute

// retryOutcome is what a retryable failure leaves behind: the attempt
// count, for the failure TTL, with the key's next attempt held back for
// pause (no longer than the record lives); uncounted gives the attempt back.
func retryOutcome(d *delivery, pause time.Duration, uncounted bool) store.Completion {
	return store.Completion{Status: store.StatusRetryable, TTL: d.ttl.failure, RetryAfter: min(pause, d.ttl.failure), Uncounted: uncounted}
}

// maxRetryAfter is the longest pause the stage writes with a release: the
// attempt schedule's cap with its jitter, or the circuit's.
func (s *idempotency) maxRetryAfter() time.Duration {
	return max(time.Duration(float64(s.policy.MaxAttemptDelay)*(1+attemptPauseJitter)), maxCircuitPause)
}

// keep nacks a message whose attempts ran out, under policy.ExhaustedKeep
// without a dead letter, or under policy.NeverCacheFailures: it is never
// acked, and comes back at the pace of the attempt schedule's cap.
func (s *idempotency) keep(ctx context.Context, d *delivery, rec recorder, herr error) ([]*message.Message, error) {
	s.tel.exhausted(d.msg.Context(), exhaustedKept)
	if s.policy.NeverCacheFailures {
		s.logError(d, "Handler failed on its last attempt or later and no failure is cached; the message is nacked, not acked, and runs again after the pause (policy.NeverCacheFailures)", herr)
	} else {
		s.logError(d, "Handler failed on its last attempt and no dead letter is set; the message is nacked, not acked, and runs again after the pause (policy.ExhaustedKeep)", herr)
	}
	return s.retryLater(ctx, d, rec, herr)
}

// Jitter of the pause before the nack of a retryable failure: ±20%.
const attemptPauseJitter = 0.2

// attemptPause is the pause before the nack of the given attempt's
// retryable failure: policy.AttemptDelay doubling per attempt, capped by
// MaxAttemptDelay, with jitter, so that a failing key comes back at a pace
// that spans an outage (the default 5 attempts: 45 s nominal) rather than
// the broker's (AMQP requeues at once, Kafka resends after 100 ms). It is
// the attempt-th wait of backoff/v5's exponential schedule.
func (s *idempotency) attemptPause(attempt int) time.Duration {
	if s.policy.AttemptDelay == 0 {
		return 0
	}
	b := &backoff.ExponentialBackOff{
		InitialInterval:     s.policy.AttemptDelay,
		RandomizationFactor: attemptPauseJitter,
		Multiplier:          2,
		MaxInterval:         s.policy.MaxAttemptDelay,
	}
	b.Reset()
	// The 64th doubling of any positive delay is past any cap.
	for range min(attempt, 64) - 1 {
		b.NextBackOff()
	}
	return b.NextBackOff()
}

// logReplay logs a replay at debug level, beside the executions' progress
// lines, with what a reader needs to tell a redelivery from a wrong key:
// the original outcome and its age.
//
//go:noinline
func (s *idempotency) logReplay(d *delivery, rec *store.Record) {
	s.logger.LogAttrs(d.msg.Context(), slog.LevelDebug, "Duplicate replayed; the handler did not run", s.attrs(d,
		slog.String("original", rec.Status.String()),
		slog.Int("original_attempt", rec.Attempt),
		slog.String("age", time.Since(rec.UpdatedAt).Round(time.Millisecond).String()),
	)...)
}

// logError logs msg at error level with the delivery's fields and err.
func (s *idempotency) logError(d *delivery, msg string, err error) {
	s.logger.LogAttrs(d.msg.Context(), slog.LevelError, msg, s.attrs(d, slog.Any("error", err))...)
}

// attrs are the delivery's fields, then extra.
func (s *idempotency) attrs(d *delivery, extra ...slog.Attr) []slog.Attr {
	return append(append(make([]slog.Attr, 0, 4+len(extra)),
		slog.String("message_uuid", d.event.MessageUUID),
		slog.String("scope", d.event.Scope),
		slog.String("key", d.event.Key),
		slog.Int("attempt", d.event.Attempt),
	), extra...)
}

// runHandler turns a panic into an error the way middleware.Recoverer does.
func runHandler(h message.HandlerFunc, msg *message.Message) (msgs []*message.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			msgs, err = nil, middleware.RecoveredPanicError{V: r, Stacktrace: string(debug.Stack())}
		}
	}()
	return h(msg)
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
