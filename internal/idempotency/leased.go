package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v5"

	"github.com/oncemill/oncemill/internal/configerr"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/store"
)

// Leased is the idempotency stage of the lease mode, for records kept apart
// from the business data (memory, Redis, another database): it claims the
// key with a statement of its own, which gives the delivery a lease; runs
// the handler (with retries and the circuit breaker, Config) while a
// heartbeat keeps the lease alive; and records the outcome after it. A
// crash between the handler's effect and the record runs the message again
// once the lease expires: make the effect idempotent, or use
// NewTransactional.
type Leased struct {
	idempotency
	store store.Store
	beats *heartbeats
}

// NewLeased validates cfg and returns the lease mode's stage over st.
func NewLeased(st store.Store, cfg Config) (*Leased, error) {
	if st == nil {
		return nil, configerr.New("New", "nil; pass a store such as memory.New(memory.Options{})")
	}
	if cfg.KafkaWatermark != nil {
		return nil, configerr.New("WithKafkaWatermark", "is the one-transaction mode's (receiver.NewTransactional): the watermark moves in the handler's transaction; the lease mode has none")
	}
	if cfg.DeferredClaim {
		return nil, configerr.New("WithDeferredClaim", "is the one-transaction mode's (receiver.NewTransactional): the claim rides the handler's first statement in its transaction; the lease mode claims before the handler runs")
	}
	s := &Leased{store: st}
	if err := s.configure(cfg, st.Limits()); err != nil {
		return nil, err
	}
	s.beats = newHeartbeats(s.policy.Heartbeat, s.policy.LeaseDuration)
	return s, nil
}

// Middleware is the stage as a Watermill middleware.
func (s *Leased) Middleware(h message.HandlerFunc) message.HandlerFunc {
	h = s.breaker.wrap(h)
	return s.tel.wrap(func(msg *message.Message) ([]*message.Message, error) {
		if msgs, refused, err := s.refused(msg); refused {
			return msgs, err
		}
		d := &delivery{msg: msg, event: pipeline.Event{MessageUUID: msg.UUID}}
		msgs, err := s.handle(d, h)
		s.decided(d)
		return msgs, err
	})
}

// handle computes the key, then asks the store for it until the store
// decides: execute under a new lease, or answer a duplicate (replay, wait
// for the holder, reject).
func (s *Leased) handle(d *delivery, h message.HandlerFunc) ([]*message.Message, error) {
	if msgs, done, err := s.keyed(d, h); done {
		return msgs, err
	}
	req := store.LeaseRequest{
		Scope:         d.event.Scope,
		Key:           d.event.Key,
		Fingerprint:   s.fingerprint(d.msg),
		LeaseDuration: s.policy.LeaseDuration,
		Retain:        d.ttl.retain,
		MessageUUID:   d.msg.UUID,
	}
	var w waiter
	for {
		res, err := s.claimLease(d.msg.Context(), &req)
		if err != nil {
			if s.shadow {
				return s.shadowStoreFailed(d, h, err)
			}
			return s.storeFailed(d, err)
		}
		d.event.Decision = res.Decision
		if res.Decision == store.DecisionExecute {
			return s.execute(d, h, &res)
		}
		if s.shadow {
			return s.shadowed(d, h, &res)
		}
		if msgs, done, err := s.answer(d, &w, &res); done {
			return msgs, err
		}
	}
}

// claimLease, release and complete are the store's calls, measured
// (extend is the execution's).
func (s *Leased) claimLease(ctx context.Context, req *store.LeaseRequest) (store.ClaimResult, error) {
	ctx, m := s.tel.startStore(ctx, opBegin)
	res, err := s.store.ClaimLease(ctx, *req)
	m.end(ctx, err)
	if err == nil {
		s.storeAnswered()
	}
	return res, err
}

func (s *Leased) release(ctx context.Context, lease store.Claim, out store.Completion) error {
	ctx, m := s.tel.startStore(ctx, opRelease)
	err := s.store.Release(ctx, lease, out)
	m.end(ctx, err)
	return err
}

// execute runs the handler under the lease, with retries and the breaker,
// while a heartbeat keeps the lease alive; then records the outcome.
func (s *Leased) execute(d *delivery, h message.HandlerFunc, res *store.ClaimResult) ([]*message.Message, error) {
	lease := res.Claim
	d.event.Attempt, d.event.Token, d.event.Takeover = lease.Attempt, lease.Token, res.Takeover

	orig := d.msg.Context()
	e := newExecution(orig, lease, s)
	e.ttl = d.ttl
	e.confirmedAt(monotonicNow())
	d.msg.SetContext(e)
	e.startHeartbeat()
	s.processing(d)
	started := s.tel.leaseTaken(orig)
	msgs, herr := s.retry.run(e, func() ([]*message.Message, error) { return runHandler(h, d.msg) })
	s.tel.leaseDone(orig, started)
	e.stopHeartbeat()
	e.finish()
	d.msg.SetContext(orig)

	if herr == nil {
		return s.succeed(&e.detached, d, e, msgs)
	}
	msgs, err := s.fail(&e.detached, d, e, herr)
	d.stored = e.stored
	return msgs, err
}

func (s *Leased) succeed(ctx context.Context, d *delivery, e *execution, msgs []*message.Message) ([]*message.Message, error) {
	d.event.Outcome = pipeline.OutcomeExecuted
	if err := s.finish(ctx, e, s.successOutcome(msgs, d.ttl.success)); err != nil {
		// The effect happened: nacking now would run it again after the lease
		// expires. Ack, and let the router publish what the handler produced.
		d.event.Err = err
		s.logError(d, "Handler succeeded but the success could not be recorded while the lease was held; a duplicate delivered after the lease expires runs again", err)
	} else {
		d.stored = d.ttl.success
	}
	return msgs, nil
}

// finish completes the lease. A store that does not answer is tried again,
// with backoff, for as long as the lease is still ours by the local clock
// (execution.heldFor): a success recorded late still answers its
// duplicates, where one given up on leaves the key to expire and a later
// duplicate to run again. A lost lease or a refused request is final. The
// first try is made directly so the common path pays nothing for the retry
// machinery; the retries start one interval after it (backoff.Retry's own
// first try is immediate, and a store that just failed would most likely
// fail again at once).
func (s *Leased) finish(ctx context.Context, e *execution, out store.Completion) error {
	err := s.complete(ctx, e.lease, out)
	if err == nil || isFinal(err) {
		return err
	}
	return s.finishLater(ctx, e, out, err)
}

// finishLater is finish's retries after a first Complete failed with err.
// Not inlined: its backoff and timeout would take finish's stack frame, on
// the deepest path of every delivery.
//
//go:noinline
func (s *Leased) finishLater(ctx context.Context, e *execution, out store.Completion, err error) error {
	held := e.heldFor()
	if held <= 0 {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, held)
	defer cancel()
	if serr := sleep(ctx, finishRetryInterval); serr != nil {
		return fmt.Errorf("%w (gave up as the lease ran out: %w)", err, serr)
	}
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
		InitialInterval: finishRetryInterval, RandomizationFactor: 0.3, Multiplier: 2, MaxInterval: time.Second,
	}))
	if rerr != nil && ctx.Err() != nil && !isFinal(rerr) {
		return fmt.Errorf("%w (gave up as the lease ran out: %w)", err, rerr)
	}
	return rerr
}

// finishRetryInterval is the first wait before Complete is tried again;
// the waits double from it, ±30%, up to a second.
const finishRetryInterval = 50 * time.Millisecond

// recordReader reads a record back (store.Admin's Get; every store of this
// module has it).
type recordReader interface {
	Get(ctx context.Context, scope, key string) (store.Record, error)
}

// wroteBefore reports whether an earlier Complete of this lease was written
// although its answer was lost (a cut between the commit and the reply):
// a retry then finds the lease finished, and only the record tells that
// from a takeover. The record holds the lease's own token and status.
func (s *Leased) wroteBefore(ctx context.Context, lease store.Claim, out store.Completion) bool {
	r, ok := s.store.(recordReader)
	if !ok {
		return false
	}
	rec, err := r.Get(ctx, lease.Scope, lease.Key)
	return err == nil && rec.Token == lease.Token && rec.Status == out.Status
}

func (s *Leased) complete(ctx context.Context, lease store.Claim, out store.Completion) error {
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

// cache and giveBack make the execution the lease mode's recorder: the
// failure completes the lease, or the key is released. Each notes the TTL
// it wrote (stored).
func (e *execution) cache(ctx context.Context, out store.Completion) error {
	err := e.stage.finish(ctx, e, out)
	if err == nil {
		e.stored = out.TTL
	}
	return err
}

func (e *execution) giveBack(ctx context.Context, out store.Completion) error {
	err := e.stage.release(ctx, e.lease, out)
	if err == nil {
		e.stored = out.TTL
	}
	return err
}
