package pipeline

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

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// Errors the idempotency stage reports. Permanent ones are acked and carried
// in Event.Err; ErrKeyHeld goes back to the router, which nacks.
var (
	// ErrKeyHeld: another delivery holds the key past the wait bound.
	ErrKeyHeld = errors.New("oncemill: key is held by another delivery")
	// ErrMismatch: the key is known with a different payload.
	ErrMismatch = errors.New("oncemill: key reused with a different payload")
	// ErrPayloadTooLarge: the payload is over policy.MaxPayloadBytes.
	ErrPayloadTooLarge = errors.New("oncemill: payload too large")
	// ErrDuplicateRejected: a duplicate whose key is held, under
	// policy.HeldKeyReject.
	ErrDuplicateRejected = errors.New("oncemill: duplicate rejected while its key is held by another delivery")
	// ErrInvalidMessage wraps the validation stage's reason for refusing a message.
	ErrInvalidMessage = errors.New("oncemill: invalid message")
)

// IdempotencyConfig configures the idempotency stage.
type IdempotencyConfig struct {
	// Store keeps the records in the lease mode: a separately committed
	// claim, a heartbeat, and a completion after the handler.
	Store store.Store
	// TxStore, instead of Store, chooses the one-transaction mode: the key
	// is claimed by the first statement of the handler's own transaction,
	// and the success commits with it (docs/stores.md). The chain then ends
	// each attempt's transaction innermost, after the handler (Chain).
	TxStore store.Transactional
	// Keys computes the key; required.
	Keys keygen.Generator
	// Fingerprint identifies the payload for mismatch detection. Nil uses
	// keygen.FingerprintOf(Keys, msg); return "" to turn detection off.
	Fingerprint func(*message.Message) string
	// Scope names the key space. Empty uses the Watermill handler name from
	// the message context, so two handlers of one topic each run a message once.
	Scope string
	// Policy decides TTLs, leases and classification; validated here. Its
	// zero fields mean their defaults.
	Policy policy.Policy
	// Logger receives the stage's lines; nil means slog.Default(), so a
	// message acked without running (rejected, dropped), a dead letter that
	// could not be forwarded and a store that could not decide a delivery
	// are never silent.
	Logger *slog.Logger
	// ReplayLogLevel, when set, is the level at which each replay is
	// logged through Logger, with its scope, key, original outcome and age:
	// a slog.Level (slog.LevelInfo) or a *slog.LevelVar. Nil logs no
	// replays, and costs the replay path nothing: the line allocates per
	// duplicate when the logger takes its level.
	ReplayLogLevel slog.Leveler
	// OnEvent, when set, is called once per delivery, after the decision and
	// before the router acks or nacks. It must be quick and safe for
	// concurrent use.
	OnEvent func(Event)
	// DeadLetter, when set, receives each cached failure (the first time it
	// is cached) and each rejected message (mismatch, no key, too large)
	// once, before the delivery is acked.
	DeadLetter *DeadLetter
	// Telemetry defaults to one over the global OpenTelemetry providers.
	Telemetry *Telemetry
}

// Idempotency is the idempotency stage.
type Idempotency struct {
	store       store.Store         // lease mode
	txStore     store.Transactional // one-transaction mode
	retain      time.Duration       // how long a record is kept at least: the longest outcome TTL
	keys        keygen.Generator
	fingerprint func(*message.Message) string
	scope       string
	policy      policy.Policy
	logger      *slog.Logger
	replayLevel slog.Leveler // nil: replays are not logged
	onEvent     func(Event)
	deadLetter  *DeadLetter
	tel         *Telemetry
	beats       *heartbeats
	maxKeyLen   int
	// storeFailures counts Begins (claims) that failed in a row, across
	// deliveries: the pause before their nack grows with it.
	storeFailures atomic.Int32
}

// NewIdempotency validates cfg and returns the stage.
func NewIdempotency(cfg IdempotencyConfig) (*Idempotency, error) {
	switch {
	case cfg.Store == nil && cfg.TxStore == nil:
		return nil, oncemill.InvalidConfig("IdempotencyConfig.Store", "nil; pass a store such as memory.New(memory.Options{}), or a TxStore for the one-transaction mode")
	case cfg.Store != nil && cfg.TxStore != nil:
		return nil, oncemill.InvalidConfig("IdempotencyConfig.TxStore", "set together with Store; set Store for the lease mode or TxStore for the one-transaction mode")
	case cfg.Keys == nil:
		return nil, oncemill.InvalidConfig("IdempotencyConfig.Keys", "nil; pass a key generator such as keygen.UUID()")
	case !keygen.Storable(cfg.Scope) || len(cfg.Scope) > store.MaxScopeLen:
		return nil, oncemill.InvalidConfig("scope", "%.40q is not a scope every store holds: use valid UTF-8 without NUL bytes, at most %d bytes (store.MaxScopeLen)", cfg.Scope, store.MaxScopeLen)
	}
	if err := cfg.Policy.Validate(); err != nil {
		return nil, err
	}
	cfg.Policy = cfg.Policy.WithDefaults()
	var limits store.Limits
	if cfg.TxStore != nil {
		limits = cfg.TxStore.Limits()
	} else {
		limits = cfg.Store.Limits()
	}
	if limits.MaxResultBytes > 0 && cfg.Policy.MaxResultBytes > limits.MaxResultBytes {
		// A success whose produced messages fit the policy but not the
		// store could not be recorded at all.
		return nil, oncemill.InvalidConfig("policy.MaxResultBytes", "%d is above the store's limit of %d; lower it, or raise the store's (its Options.MaxResultBytes)",
			cfg.Policy.MaxResultBytes, limits.MaxResultBytes)
	}
	s := &Idempotency{
		store:       cfg.Store,
		txStore:     cfg.TxStore,
		retain:      max(cfg.Policy.SuccessTTL, cfg.Policy.FailureTTL),
		keys:        cfg.Keys,
		fingerprint: cfg.Fingerprint,
		scope:       cfg.Scope,
		policy:      cfg.Policy,
		logger:      cfg.Logger,
		replayLevel: cfg.ReplayLogLevel,
		onEvent:     cfg.OnEvent,
		deadLetter:  cfg.DeadLetter,
		tel:         cfg.Telemetry,
		maxKeyLen:   limits.MaxKeyLen,
	}
	if s.tel == nil {
		s.tel = defaultTelemetry()
	}
	if cfg.Store != nil { // the one-transaction mode has no lease to keep alive
		s.beats = newHeartbeats(cfg.Policy.Heartbeat, cfg.Policy.LeaseDuration)
	}
	if s.fingerprint == nil {
		keys := cfg.Keys
		s.fingerprint = func(m *message.Message) string { return keygen.FingerprintOf(keys, m) }
	}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	return s, nil
}

// delivery is one message passing through the stage.
type delivery struct {
	msg   *message.Message
	event Event
}

// Middleware is the stage as a Watermill middleware.
func (s *Idempotency) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		d := &delivery{msg: msg, event: Event{MessageUUID: msg.UUID}}
		msgs, err := s.handle(d, h)
		s.tel.decided(msg.Context(), &d.event)
		if s.onEvent != nil {
			s.onEvent(d.event)
		}
		return msgs, err
	}
}

// handle keeps the common path (execute or replay) in one small frame: every
// message runs on a fresh router goroutine, whose stack would otherwise grow
// and be copied. Rare paths live in their own functions.
func (s *Idempotency) handle(d *delivery, h message.HandlerFunc) ([]*message.Message, error) {
	msg := d.msg
	d.event.Scope = s.scope
	if d.event.Scope == "" {
		// A handler name no store can hold is hashed, as a key would be.
		d.event.Scope = keygen.StorableKey(message.HandlerNameFromCtx(msg.Context()), store.MaxScopeLen)
	}
	if len(msg.Payload) > s.policy.MaxPayloadBytes {
		return s.tooLarge(d)
	}
	key, err := s.keys.Key(msg)
	if err == nil && key == "" {
		err = keygen.ErrEmptyKey
	}
	if err != nil {
		return s.keyFailed(d, h, err)
	}
	d.event.Key = keygen.StorableKey(key, s.maxKeyLen)
	if s.txStore != nil {
		return s.handleTx(d, h)
	}
	req := store.LeaseRequest{
		Scope:         d.event.Scope,
		Key:           d.event.Key,
		Fingerprint:   s.fingerprint(msg),
		LeaseDuration: s.policy.LeaseDuration,
		Retain:        s.retain,
	}
	var w waiter
	for {
		res, err := s.begin(msg.Context(), &req)
		if err != nil {
			return s.storeFailed(d, err)
		}
		d.event.Decision = res.Decision
		if res.Decision == store.DecisionExecute {
			return s.execute(d, h, &res)
		}
		if msgs, done, err := s.answer(d, &w, &res); done {
			return msgs, err
		}
	}
}

// answer acts on every decision but Execute: it replays, rejects, or waits
// for a key held by another delivery (done false: ask the store again).
func (s *Idempotency) answer(d *delivery, w *waiter, res *store.ClaimResult) (msgs []*message.Message, done bool, err error) {
	switch res.Decision {
	case store.DecisionReplay:
		msgs, err = s.replay(d, res.Record)
		return msgs, true, err
	case store.DecisionHeld:
		d.event.Contended = true
		again, err := s.inProgress(d, w)
		return nil, !again, err
	case store.DecisionMismatch:
		msgs, err = s.mismatch(d)
		return msgs, true, err
	}
	msgs, err = s.storeFailed(d, fmt.Errorf("unknown decision %d", res.Decision))
	return msgs, true, err
}

func (s *Idempotency) mismatch(d *delivery) ([]*message.Message, error) {
	return s.reject(d, DeadLetterReasonMismatch, fmt.Errorf("%w: scope %q key %q is stored with another payload fingerprint; use a key that covers the payload or turn fingerprinting off", ErrMismatch, d.event.Scope, d.event.Key))
}

func (s *Idempotency) tooLarge(d *delivery) ([]*message.Message, error) {
	return s.reject(d, DeadLetterReasonRejected, fmt.Errorf("%w: %d bytes, limit %d (policy.MaxPayloadBytes)", ErrPayloadTooLarge, len(d.msg.Payload), s.policy.MaxPayloadBytes))
}

// keyFailed decides what a key generator's error means. A message that has
// no key (keygen.ErrNoKey and the errors wrapping it) is handled as
// policy.MissingKey says. Any other error is the generator's own failure,
// classified by the policy like a handler's: a cached one rejects the
// message; a retryable one (a lookup service down) nacks it after
// NackDelay, so it comes back, and never runs it unguarded.
func (s *Idempotency) keyFailed(d *delivery, h message.HandlerFunc, err error) ([]*message.Message, error) {
	if errors.Is(err, keygen.ErrNoKey) {
		return s.noKey(d, h, err)
	}
	if s.policy.Classify(err) == policy.ClassCached {
		return s.reject(d, DeadLetterReasonRejected, fmt.Errorf("oncemill: cannot compute the idempotency key: %w", err))
	}
	err = fmt.Errorf("oncemill: computing the idempotency key failed; the message is nacked to come back: %w", err)
	d.event.Outcome, d.event.Err = OutcomeKeyFailed, err
	s.logError(d, "The key generator failed; the message is nacked to come back after a pause", err)
	if serr := sleep(d.msg.Context(), s.policy.NackDelay); serr != nil {
		return nil, errors.Join(err, serr)
	}
	return nil, err
}

func (s *Idempotency) noKey(d *delivery, h message.HandlerFunc, err error) ([]*message.Message, error) {
	if s.policy.MissingKey == policy.MissingKeyRunUnguarded {
		d.event.Outcome, d.event.Err = OutcomeUnguarded, err
		return runHandler(h, d.msg)
	}
	// err says it already: "oncemill: no key: <why>".
	return s.reject(d, DeadLetterReasonRejected, err)
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
func (s *Idempotency) storeFailed(d *delivery, err error) ([]*message.Message, error) {
	if errors.Is(err, store.ErrInvalidRequest) {
		return s.reject(d, DeadLetterReasonRejected, fmt.Errorf("the store refuses the message's key: %w", err))
	}
	d.event.Outcome, d.event.Err = OutcomeStoreFailed, err
	err = fmt.Errorf("oncemill: store begin: %w", err)
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
func (s *Idempotency) storePause() time.Duration {
	n := s.storeFailures.Add(1)
	pause := s.policy.NackDelay << min(n-1, maxStorePauseDoublings)
	return time.Duration(float64(pause) * (0.8 + 0.4*rand.Float64()))
}

// storeAnswered ends a run of store failures.
func (s *Idempotency) storeAnswered() {
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
// key: ask the store again (true), or give up with the error to return.
func (s *Idempotency) inProgress(d *delivery, w *waiter) (again bool, err error) {
	ctx := d.msg.Context()
	switch s.policy.HeldKey {
	case policy.HeldKeyReject:
		_, err := s.reject(d, DeadLetterReasonRejected, ErrDuplicateRejected)
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
				d.event.Outcome, d.event.Err = OutcomeHeldKeyNacked, err
				return false, err
			}
			return true, nil
		}
	}
	err = fmt.Errorf("%w: scope %q key %q", ErrKeyHeld, d.event.Scope, d.event.Key)
	d.event.Outcome, d.event.Err = OutcomeHeldKeyNacked, err
	if serr := sleep(ctx, s.policy.NackDelay); serr != nil {
		return false, errors.Join(err, serr)
	}
	return false, err
}

// reject acks a delivery that must never run, after forwarding it to the
// dead-letter topic if one is set. If forwarding fails it nacks instead, so
// the message is not lost.
func (s *Idempotency) reject(d *delivery, reason DeadLetterReason, err error) ([]*message.Message, error) {
	d.event.Outcome, d.event.Err = OutcomeRejected, policy.Cached(err)
	if ferr := s.toDeadLetter(d, reason, err); ferr != nil {
		d.event.Outcome = OutcomeStoreFailed
		return nil, ferr
	}
	s.logError(d, "Message rejected as a permanent failure; it is acked and not run", err)
	return nil, nil
}

func (s *Idempotency) toDeadLetter(d *delivery, reason DeadLetterReason, err error) error {
	if s.deadLetter == nil {
		return nil
	}
	if ferr := s.deadLetter.forward(d.msg, reason, err); ferr != nil {
		s.logError(d, "Forwarding to the dead-letter topic failed; the message is nacked to come back", ferr)
		return ferr
	}
	s.tel.deadLettered(d.msg.Context(), reason)
	return nil
}

// begin, release and extend are the store's calls, measured.
func (s *Idempotency) begin(ctx context.Context, req *store.LeaseRequest) (store.ClaimResult, error) {
	ctx, m := s.tel.startStore(ctx, opBegin)
	res, err := s.store.ClaimLease(ctx, *req)
	m.end(ctx, err)
	if err == nil {
		s.storeAnswered()
	}
	return res, err
}

func (s *Idempotency) release(ctx context.Context, lease store.Claim) error {
	ctx, m := s.tel.startStore(ctx, opRelease)
	err := s.store.Release(ctx, lease, s.policy.FailureTTL)
	m.end(ctx, err)
	return err
}

func (s *Idempotency) replay(d *delivery, rec *store.Record) ([]*message.Message, error) {
	s.tel.replayed(d.msg.Context(), rec)
	if s.replayLevel != nil {
		s.logReplay(d, rec)
	}
	if rec.Status == store.StatusCachedFailure {
		d.event.Outcome = OutcomeCachedFailureReplayed
		d.event.Err = policy.Cached(fmt.Errorf("cached failure (%s): %s", rec.ErrorKind, rec.ErrorMessage))
		return nil, nil
	}
	d.event.Outcome = OutcomeReplayed
	msgs, omitted, err := decodeResult(rec.Result)
	switch {
	case err != nil:
		d.event.Err = err
		s.logError(d, "Stored result cannot be decoded; the duplicate is acked without re-publishing", err)
	case omitted:
		s.logger.LogAttrs(d.msg.Context(), slog.LevelInfo, "Duplicate of a success whose produced messages were too large to store; nothing is re-published", s.attrs(d)...)
	}
	return msgs, nil
}

func (s *Idempotency) execute(d *delivery, h message.HandlerFunc, res *store.ClaimResult) ([]*message.Message, error) {
	lease := res.Claim
	d.event.Attempt, d.event.Token, d.event.Takeover = lease.Attempt, lease.Token, res.Takeover

	orig := d.msg.Context()
	e := newExecution(orig, lease, s)
	e.confirmedAt(monotonicNow())
	d.msg.SetContext(e)
	e.startHeartbeat()
	started := s.tel.leaseTaken(orig)
	msgs, herr := runHandler(h, d.msg)
	s.tel.leaseDone(orig, started)
	e.stopHeartbeat()
	e.finish()
	d.msg.SetContext(orig)

	if herr == nil {
		return s.succeed(&e.detached, d, e, msgs)
	}
	return s.fail(&e.detached, d, e, herr)
}

func (s *Idempotency) succeed(ctx context.Context, d *delivery, e *execution, msgs []*message.Message) ([]*message.Message, error) {
	d.event.Outcome = OutcomeExecuted
	if err := s.finish(ctx, e, s.successOutcome(msgs)); err != nil {
		// The effect happened: nacking now would run it again after the lease
		// expires. Ack, and let the router publish what the handler produced.
		d.event.Err = err
		s.logError(d, "Handler succeeded but the success could not be recorded while the lease was held; a duplicate delivered after the lease expires runs again", err)
	}
	return msgs, nil
}

// successOutcome is what a success stores: the produced messages, or a
// marker that they were too large to keep.
func (s *Idempotency) successOutcome(msgs []*message.Message) store.Completion {
	result, err := encodeResult(msgs, s.policy.MaxResultBytes)
	if err != nil {
		s.logger.LogAttrs(context.Background(), slog.LevelError, "Produced messages are not stored; a duplicate will not re-publish them", slog.Any("error", err))
	}
	return store.Completion{Status: store.StatusSucceeded, Result: result, TTL: s.policy.SuccessTTL}
}

// fail decides what a failed execution leaves behind. A retryable failure
// with attempts left gives the key back (keeping the attempt count) and
// nacks after the attempt's pause. A cached failure, and a retryable one
// that used the last attempt, is dead-lettered if a dead letter is set,
// recorded and acked; without a dead letter, an exhausted message is
// dropped only under policy.ExhaustedDrop, and kept otherwise.
func (s *Idempotency) fail(ctx context.Context, d *delivery, e *execution, herr error) ([]*message.Message, error) {
	d.event.Err = herr
	kind := store.ErrorKindCached
	if s.policy.Classify(herr) != policy.ClassCached {
		if e.lease.Attempt < s.policy.MaxAttempts {
			return s.retryLater(ctx, d, e, herr)
		}
		d.event.Exhausted, kind = true, store.ErrorKindAttemptsExhausted
		if s.deadLetter == nil && s.policy.Exhausted == policy.ExhaustedKeep {
			return s.keep(ctx, d, e, herr)
		}
	}
	// Forwarded before it is recorded: a failed forward releases the key and
	// nacks, so the failure is decided again and forwarded on redelivery.
	if ferr := s.toDeadLetter(d, DeadLetterReasonCachedFailure, herr); ferr != nil {
		d.event.Outcome = OutcomeStoreFailed
		_ = s.giveBack(ctx, e)
		return nil, ferr
	}
	d.event.Outcome = OutcomeCachedFailure
	out := store.Completion{Status: store.StatusCachedFailure, ErrorKind: kind, ErrorMessage: herr.Error(), TTL: s.policy.FailureTTL}
	var err error
	if e.claim != nil {
		err = s.recordRollback(ctx, e, out)
	} else {
		err = s.finish(ctx, e, out)
	}
	if err != nil && !errors.Is(err, store.ErrLeaseLost) {
		// Not recorded: nack, so the failure is decided again on redelivery
		// rather than forgotten.
		d.event.Outcome = OutcomeStoreFailed
		err = fmt.Errorf("oncemill: recording failure %q: %w", herr.Error(), err)
		s.logError(d, "The handler's failure could not be recorded; the message is nacked to be decided again", err)
		return nil, err
	}
	switch {
	case !d.event.Exhausted:
		s.logError(d, "Handler failed permanently; the failure is cached and the message acked", herr)
	case s.deadLetter != nil:
		s.tel.exhausted(d.msg.Context(), exhaustedDeadLettered)
		s.logError(d, "Handler failed on its last attempt; the message is dead-lettered and acked", herr)
	default:
		s.tel.exhausted(d.msg.Context(), exhaustedDropped)
		s.logError(d, "Handler failed on its last attempt; the message is DROPPED (policy.ExhaustedDrop): acked without a dead letter", herr)
	}
	return nil, nil
}

// retryLater gives the key back after a retryable failure and nacks, after
// the attempt's pause (attemptPause).
func (s *Idempotency) retryLater(ctx context.Context, d *delivery, e *execution, herr error) ([]*message.Message, error) {
	d.event.Outcome = OutcomeReleased
	if err := s.giveBack(ctx, e); err != nil && !errors.Is(err, store.ErrLeaseLost) {
		// The lease will expire on its own; the redelivery then takes over.
		s.logError(d, "Could not release the key after a retryable failure", err)
	}
	if serr := sleep(d.msg.Context(), s.attemptPause(e.lease.Attempt)); serr != nil {
		return nil, errors.Join(herr, serr)
	}
	return nil, herr
}

// keep nacks a message whose attempts ran out, under policy.ExhaustedKeep
// without a dead letter: it is never acked, and comes back at the pace of
// the attempt schedule's cap.
func (s *Idempotency) keep(ctx context.Context, d *delivery, e *execution, herr error) ([]*message.Message, error) {
	s.tel.exhausted(d.msg.Context(), exhaustedKept)
	s.logError(d, "Handler failed on its last attempt and no dead letter is set; the message is nacked, not acked, and runs again after the pause (policy.ExhaustedKeep)", herr)
	return s.retryLater(ctx, d, e, herr)
}

// Jitter of the pause before the nack of a retryable failure: ±20%.
const attemptPauseJitter = 0.2

// attemptPause is the pause before the nack of the given attempt's
// retryable failure: policy.AttemptDelay doubling per attempt, capped by
// MaxAttemptDelay, with jitter, so that a failing key comes back at a pace
// that spans an outage (the default 5 attempts: 45 s nominal) rather than
// the broker's (AMQP requeues at once, Kafka resends after 100 ms). It is
// the attempt-th wait of backoff/v5's exponential schedule.
func (s *Idempotency) attemptPause(attempt int) time.Duration {
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

// giveBack frees the key after a retryable failure, keeping its attempt
// count for the failure TTL.
func (s *Idempotency) giveBack(ctx context.Context, e *execution) error {
	if e.claim != nil {
		return s.recordRollback(ctx, e, store.Completion{Status: store.StatusRetryable, TTL: s.policy.FailureTTL})
	}
	return s.release(ctx, e.lease)
}

// finish completes the lease. A store that does not answer is tried again,
// with backoff, for as long as the lease is still ours by the local clock
// (execution.heldFor): a success recorded late still answers its
// duplicates, where one given up on leaves the key to expire and a later
// duplicate to run again. A lost lease or a refused request is final. The
// first try is made directly so the common path pays nothing for the retry
// machinery.
func (s *Idempotency) finish(ctx context.Context, e *execution, out store.Completion) error {
	err := s.complete(ctx, e.lease, out)
	if err == nil || isFinal(err) {
		return err
	}
	held := e.heldFor()
	if held <= 0 {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, held)
	defer cancel()
	_, rerr := backoff.Retry(ctx, func() (struct{}, error) {
		err := s.complete(ctx, e.lease, out)
		if errors.Is(err, store.ErrLeaseLost) && s.wroteBefore(ctx, e.lease, out) {
			return struct{}{}, nil
		}
		if isFinal(err) {
			return struct{}{}, backoff.Permanent(err)
		}
		return struct{}{}, err
	}, backoff.WithMaxElapsedTime(held), backoff.WithBackOff(&backoff.ExponentialBackOff{
		InitialInterval: 50 * time.Millisecond, RandomizationFactor: 0.3, Multiplier: 2, MaxInterval: time.Second,
	}))
	if rerr != nil && ctx.Err() != nil && !isFinal(rerr) {
		return fmt.Errorf("%w (gave up as the lease ran out: %w)", err, rerr)
	}
	return rerr
}

// recordReader reads a record back (store.Admin's Get; every store of this
// module has it).
type recordReader interface {
	Get(ctx context.Context, scope, key string) (store.Record, error)
}

// wroteBefore reports whether an earlier Complete of this lease was written
// although its answer was lost (a cut between the commit and the reply):
// a retry then finds the lease finished, and only the record tells that
// from a takeover. The record holds the lease's own token and status.
func (s *Idempotency) wroteBefore(ctx context.Context, lease store.Claim, out store.Completion) bool {
	r, ok := s.store.(recordReader)
	if !ok {
		return false
	}
	rec, err := r.Get(ctx, lease.Scope, lease.Key)
	return err == nil && rec.Token == lease.Token && rec.Status == out.Status
}

func (s *Idempotency) complete(ctx context.Context, lease store.Claim, out store.Completion) error {
	ctx, m := s.tel.startStore(ctx, opComplete)
	err := s.store.Complete(ctx, lease, out)
	m.end(ctx, err)
	return err
}

// isFinal reports store errors that retrying cannot change: a lost lease,
// a refused request, a closed store.
func isFinal(err error) bool {
	return errors.Is(err, store.ErrLeaseLost) || errors.Is(err, store.ErrInvalidRequest) || errors.Is(err, store.ErrClosed)
}

// logReplay logs a replay at the configured level, with what a reader needs
// to tell a redelivery from a wrong key: the original outcome and its age.
//
//go:noinline
func (s *Idempotency) logReplay(d *delivery, rec *store.Record) {
	ctx, level := d.msg.Context(), s.replayLevel.Level()
	if !s.logger.Enabled(ctx, level) {
		return
	}
	s.logger.LogAttrs(ctx, level, "Duplicate replayed; the handler did not run", s.attrs(d,
		slog.String("original", rec.Status.String()),
		slog.Int("original_attempt", rec.Attempt),
		slog.String("age", time.Since(rec.UpdatedAt).Round(time.Millisecond).String()),
	)...)
}

// logError logs msg at error level with the delivery's fields and err.
func (s *Idempotency) logError(d *delivery, msg string, err error) {
	s.logger.LogAttrs(d.msg.Context(), slog.LevelError, msg, s.attrs(d, slog.Any("error", err))...)
}

// attrs are the delivery's fields, then extra.
func (s *Idempotency) attrs(d *delivery, extra ...slog.Attr) []slog.Attr {
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
