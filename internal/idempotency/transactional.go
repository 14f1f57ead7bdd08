package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/internal/claimctx"
	"github.com/oncemill/oncemill/internal/configerr"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// errCommit wraps failures to commit the handler's transaction. They are
// retryable unless the policy says otherwise.
var errCommit = errors.New("oncemill: committing the handler's transaction")

// errTxLost wraps a commit or rollback that found the transaction without
// the key (store.ErrLeaseLost): a claim made at the commit (the watermark
// mode's fast path) or sent with the handler's first statement
// (store.TxRequest.Deferrable) lost to another delivery. Nothing committed.
var errTxLost = errors.New("oncemill: the handler's transaction did not hold the key, so nothing of it committed")

// errClaimTaken ends a retry whose new claim found the key taken by another
// delivery in the moment between the rollback and the claim.
var errClaimTaken = fmt.Errorf("oncemill: another delivery claimed the key between two attempts: %w", store.ErrLeaseLost)

// Transactional is the idempotency stage of the one-transaction mode, for
// records in the handler's own PostgreSQL database (store/postgres,
// store/tiered): the first statement of the handler's transaction claims
// the key, the handler finds the transaction in its context
// (postgres.TxFromContext), and its success commits with the record or not
// at all. A concurrent duplicate waits for that transaction, up to
// policy.HeldKeyTimeout. There is no lease to keep alive.
type Transactional struct {
	idempotency
	store store.Transactional
	// deferred is Config.DeferredClaim.
	deferred bool
}

// NewTransactional validates cfg and returns the one-transaction mode's
// stage over ts. The policy's LeaseDuration and Heartbeat have no effect in
// this mode and are refused.
func NewTransactional(ts store.Transactional, cfg Config) (*Transactional, error) {
	switch {
	case ts == nil:
		return nil, configerr.New("NewTransactional", "nil; pass a store that claims in the handler's transaction, such as postgres.New(pool, postgres.Options{})")
	case cfg.Policy.LeaseDuration != 0:
		return nil, configerr.New("WithPolicy(Policy.LeaseDuration)", "has no effect in the one-transaction mode: the claim is held by the handler's open transaction; leave it 0")
	case cfg.Policy.Heartbeat != 0:
		return nil, configerr.New("WithPolicy(Policy.Heartbeat)", "has no effect in the one-transaction mode: there is no lease to extend; leave it 0")
	}
	if cfg.KafkaWatermark != nil {
		if cfg.DeferredClaim {
			return nil, configerr.New("WithDeferredClaim", "is the key mode's: the watermark mode's fast path claims at the commit already; leave it off")
		}
		var err error
		if ts, err = watermarkStore(ts, &cfg); err != nil {
			return nil, err
		}
	}
	s := &Transactional{store: ts, deferred: cfg.DeferredClaim}
	if err := s.configure(cfg, ts.Limits()); err != nil {
		return nil, err
	}
	return s, nil
}

// Middleware is the stage as a Watermill middleware.
func (s *Transactional) Middleware(h message.HandlerFunc) message.HandlerFunc {
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

// handle computes the key, then claims it with the first statement of a new
// transaction, before retry and the breaker, so that a duplicate is
// answered from the record even while the circuit is open. The claim itself waits for a
// transaction that holds the key, up to policy.HeldKeyTimeout; the waiter
// polls only records that another worker committed in progress (the lease
// mode's, on a shared table).
func (s *Transactional) handle(d *delivery, h message.HandlerFunc) ([]*message.Message, error) {
	if msgs, done, err := s.keyed(d, h); done {
		return msgs, err
	}
	req := store.TxRequest{
		Scope:       d.event.Scope,
		Key:         d.event.Key,
		Fingerprint: s.fingerprint(d.msg),
		SuccessTTL:  d.ttl.success,
		Retain:      d.ttl.retain,
		MessageUUID: d.msg.UUID,
		// Until it is claimed again after losing that way (execute).
		// Shadow mode runs a duplicate's handler unguarded after its
		// claim, which must then have been decided: it claims up front.
		Deferrable: s.deferred && !s.shadow,
	}
	w := waiter{until: time.Now().Add(s.policy.HeldKeyTimeout)}
	reclaim := true // once: see execute
	for {
		req.Wait = time.Millisecond // policy.HeldKeyNack and policy.HeldKeyReject do not wait, nor does shadow mode
		if s.policy.HeldKey == policy.HeldKeyWait && !s.shadow {
			req.Wait = max(time.Until(w.until), time.Millisecond)
		}
		res, err := s.claim(d.msg.Context(), &req)
		if err != nil {
			if s.shadow {
				return s.shadowStoreFailed(d, h, err)
			}
			return s.storeFailed(d, err)
		}
		d.event.Decision = res.Decision
		d.event.Contended = d.event.Contended || res.Contended
		if res.Decision == store.DecisionExecute {
			msgs, lost, err := s.execute(d, h, &req, res, reclaim)
			if !lost {
				return msgs, err
			}
			d.event.Contended, reclaim, req.Deferrable = true, false, false
			continue
		}
		if s.shadow {
			return s.shadowed(d, h, &res.ClaimResult)
		}
		if msgs, done, err := s.answer(d, &w, &res.ClaimResult); done {
			return msgs, err
		}
	}
}

// execute runs the handler in the claim's transaction and commits its
// success with the record, or rolls the attempt back, claim included. A
// retry claims again in a fresh transaction. This is the one place where
// the mode's transactions end.
//
// A commit or rollback that fails with store.ErrLeaseLost committed
// nothing because another delivery got the key first: the watermark mode's
// fast path, which claims at the commit, finds the offset committed by
// another owner; a deferred claim (store.TxRequest.Deferrable), sent with
// the handler's first statement, finds the key held or recorded, whatever
// the handler returned. With reclaim, execute then returns lost, records
// nothing and leaves the delivery to claim again, up front, which answers
// it from the record (a replay) or runs it again: never a failed attempt,
// never a nack.
func (s *Transactional) execute(d *delivery, h message.HandlerFunc, req *store.TxRequest, res store.TxResult, reclaim bool) (_ []*message.Message, lost bool, _ error) {
	run := txRun{stage: s, claim: res.Claim, fingerprint: req.Fingerprint}
	tx := res.Tx
	d.event.Attempt, d.event.Token, d.event.Takeover = run.claim.Attempt, run.claim.Token, res.Takeover

	orig := d.msg.Context()
	detached := context.WithoutCancel(orig)
	handlerCtx := context.WithValue(orig, claimctx.ClaimKey{}, &run.claim)
	started := s.tel.leaseTaken(orig)
	s.processing(d)
	msgs, herr := s.retry.run(orig, func() ([]*message.Message, error) {
		if tx == nil { // a retry: the last attempt rolled back, claim included
			res, err := s.claim(orig, req)
			if err != nil {
				return nil, err
			}
			if res.Decision != store.DecisionExecute {
				return nil, errClaimTaken
			}
			run.claim, tx = res.Claim, res.Tx
		}
		d.msg.SetContext(tx.Context(handlerCtx))
		msgs, err := runHandler(h, d.msg)
		d.msg.SetContext(orig)
		if err != nil {
			if rerr := s.rollback(detached, tx, &run.claim); rerr != nil {
				err = rerr // the claim was lost: the handler's error is moot
			}
		} else {
			err = s.commit(detached, tx, msgs)
		}
		tx = nil
		if err != nil {
			return nil, err
		}
		return msgs, nil
	})
	s.tel.leaseDone(orig, started)

	if reclaim && errors.Is(herr, errTxLost) {
		return nil, true, nil
	}
	if herr != nil { // the last attempt rolled back
		d.event.Attempt = run.claim.Attempt
		msgs, err := s.fail(detached, d, &run, herr)
		d.stored = run.stored
		return msgs, false, err
	}
	d.event.Outcome = pipeline.OutcomeExecuted // and committed: a nil error comes only with a commit
	d.stored = req.SuccessTTL
	return msgs, false, nil
}

// commit ends the attempt's transaction with the record of its success.
func (s *Transactional) commit(ctx context.Context, tx store.Tx, msgs []*message.Message) error {
	ctx, m := s.tel.startStore(ctx, opCommit)
	err := tx.Commit(ctx, s.successOutcome(msgs, 0).Result) // the TTL is the claim's (TxRequest.SuccessTTL)
	m.end(ctx, err)
	switch {
	case errors.Is(err, store.ErrLeaseLost):
		return fmt.Errorf("%w: %w", errTxLost, err)
	case err != nil:
		return fmt.Errorf("%w: %w", errCommit, err)
	}
	return nil
}

// rollback ends the attempt's transaction, claim and business writes
// included. A failed rollback leaves nothing behind either: the store
// closes a connection it cannot roll back. It returns an error only when
// the transaction turns out not to have held the key (errTxLost).
func (s *Transactional) rollback(ctx context.Context, tx store.Tx, claim *store.Claim) error {
	err := tx.Rollback(ctx)
	switch {
	case errors.Is(err, store.ErrLeaseLost):
		return fmt.Errorf("%w: %w", errTxLost, err)
	case err != nil:
		s.logger.LogAttrs(ctx, slog.LevelError, "Rolling back the handler's transaction failed", slog.String("scope", claim.Scope), slog.String("key", claim.Key), slog.Any("error", err))
	}
	return nil
}

// claim is the store's call, measured.
func (s *Transactional) claim(ctx context.Context, req *store.TxRequest) (store.TxResult, error) {
	ctx, m := s.tel.startStore(ctx, opClaim)
	res, err := s.store.ClaimInTx(ctx, *req)
	m.end(ctx, err)
	if err == nil {
		s.storeAnswered()
	}
	return res, err
}

// txRun is the mode's recorder: after the last attempt rolled back, the
// failure is recorded in a transaction of its own (RecordRollback).
type txRun struct {
	stage       *Transactional
	claim       store.Claim
	fingerprint string
	stored      time.Duration // the TTL recorded; 0: none
}

func (r *txRun) cache(ctx context.Context, out store.Completion) error {
	return r.record(ctx, out)
}

func (r *txRun) giveBack(ctx context.Context, out store.Completion) error {
	return r.record(ctx, out)
}

func (r *txRun) record(ctx context.Context, out store.Completion) error {
	ctx, m := r.stage.tel.startStore(ctx, opRecordRollback)
	err := r.stage.store.RecordRollback(ctx, r.claim, r.fingerprint, out)
	m.end(ctx, err)
	if err == nil {
		r.stored = out.TTL
	}
	return err
}
