package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// The one-transaction mode of the idempotency stage (IdempotencyConfig.TxStore).
//
// The stage claims the key with the first statement of a new transaction,
// before retry and the breaker, so that a duplicate is answered from the
// record even while the circuit is open. The claim's open transaction is
// the first attempt's; the handler finds it in its context. The innermost
// link of the chain (attempt) commits each successful attempt with the
// record, and rolls a failed one back, claim included; a retry claims again
// in a fresh transaction. What the stage finds still open once the chain
// returns (no attempt link ran: the stage is used alone, or the breaker
// refused the attempt) it ends itself.

// errClaimTaken ends a retry whose new claim found the key taken by another
// delivery in the moment between the rollback and the claim.
var errClaimTaken = fmt.Errorf("oncemill: another delivery claimed the key between two attempts: %w", store.ErrLeaseLost)

func (s *Idempotency) handleTx(d *delivery, h message.HandlerFunc) ([]*message.Message, error) {
	req := store.TxRequest{
		Scope:       d.event.Scope,
		Key:         d.event.Key,
		Fingerprint: s.fingerprint(d.msg),
		SuccessTTL:  s.policy.SuccessTTL,
		Retain:      s.retain,
	}
	// The claim itself waits for a transaction that holds the key, up to
	// policy.HeldKeyTimeout; the waiter polls only records that another
	// worker committed in progress (the lease mode's, on a shared table).
	w := waiter{until: time.Now().Add(s.policy.HeldKeyTimeout)}
	for {
		req.Wait = time.Millisecond // policy.HeldKeyNack and policy.HeldKeyReject do not wait
		if s.policy.HeldKey == policy.HeldKeyWait {
			req.Wait = max(time.Until(w.until), time.Millisecond)
		}
		res, err := s.claim(d.msg.Context(), req)
		if err != nil {
			return s.storeFailed(d, err)
		}
		d.event.Decision = res.Decision
		d.event.Contended = d.event.Contended || res.Contended
		if res.Decision == store.DecisionExecute {
			return s.executeTx(d, h, &req, &res)
		}
		if msgs, done, err := s.answer(d, &w, &res.ClaimResult); done {
			return msgs, err
		}
	}
}

func (s *Idempotency) executeTx(d *delivery, h message.HandlerFunc, req *store.TxRequest, res *store.TxResult) ([]*message.Message, error) {
	lease := res.Claim
	d.event.Attempt, d.event.Token, d.event.Takeover = lease.Attempt, lease.Token, res.Takeover

	orig := d.msg.Context()
	e := newExecution(orig, lease, s)
	e.claim, e.tx = req, res.Tx
	d.msg.SetContext(res.Tx.Context(e))
	started := s.tel.leaseTaken(orig)
	msgs, herr := runHandler(h, d.msg)
	s.tel.leaseDone(orig, started)
	d.msg.SetContext(orig)
	if e.tx != nil { // no attempt link ended it
		if herr == nil {
			herr = s.commit(&e.detached, e, msgs)
		} else {
			s.rollback(&e.detached, e)
		}
	}
	e.finish()

	if herr != nil { // the last attempt rolled back
		return s.fail(&e.detached, d, e, herr)
	}
	d.event.Outcome = OutcomeExecuted // and committed: a nil error comes only with a commit
	return msgs, nil
}

// attempt is the innermost link of the chain in the one-transaction mode:
// it runs one attempt of the handler in the execution's transaction, and
// commits it with the record or rolls it back. An attempt after a rolled
// back one claims the key again first.
func (s *Idempotency) attempt(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		e, ok := msg.Context().Value(executionKey{}).(*execution)
		if !ok || e.claim == nil || e.stage != s {
			return h(msg)
		}
		if e.tx == nil {
			ctx := msg.Context()
			res, err := s.claim(ctx, *e.claim)
			if err != nil {
				return nil, err
			}
			if res.Decision != store.DecisionExecute {
				return nil, errClaimTaken
			}
			e.lease, e.tx = res.Claim, res.Tx
			msg.SetContext(res.Tx.Context(ctx))
			defer msg.SetContext(ctx)
		}
		msgs, err := runHandler(h, msg)
		if err != nil {
			s.rollback(&e.detached, e)
			return nil, err
		}
		if err := s.commit(&e.detached, e, msgs); err != nil {
			return nil, err
		}
		return msgs, nil
	}
}

// commit ends the attempt's transaction with the record of its success.
func (s *Idempotency) commit(ctx context.Context, e *execution, msgs []*message.Message) error {
	tx := e.tx
	e.tx = nil
	ctx, m := s.tel.startStore(ctx, opCommit)
	err := tx.Commit(ctx, s.successOutcome(msgs).Result)
	m.end(ctx, err)
	if err != nil {
		return fmt.Errorf("%w: commit: %w", ErrTransaction, err)
	}
	return nil
}

// rollback ends the attempt's transaction, claim and business writes
// included. A failed rollback leaves nothing behind either: the store
// closes a connection it cannot roll back.
func (s *Idempotency) rollback(ctx context.Context, e *execution) {
	tx := e.tx
	e.tx = nil
	if err := tx.Rollback(ctx); err != nil {
		s.logger.LogAttrs(ctx, slog.LevelError, "Rolling back the handler's transaction failed", slog.String("scope", e.lease.Scope), slog.String("key", e.lease.Key), slog.Any("error", err))
	}
}

// claim and recordRollback are the store's calls, measured.
func (s *Idempotency) claim(ctx context.Context, req store.TxRequest) (store.TxResult, error) {
	ctx, m := s.tel.startStore(ctx, opClaim)
	res, err := s.txStore.ClaimInTx(ctx, req)
	m.end(ctx, err)
	if err == nil {
		s.storeAnswered()
	}
	return res, err
}

func (s *Idempotency) recordRollback(ctx context.Context, e *execution, out store.Completion) error {
	ctx, m := s.tel.startStore(ctx, opRecordRollback)
	err := s.txStore.RecordRollback(ctx, e.lease, e.claim.Fingerprint, out)
	m.end(ctx, err)
	return err
}
