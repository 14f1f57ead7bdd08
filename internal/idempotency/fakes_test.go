package idempotency_test

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
)

// fakeTxKey carries a fakeClaimTx in the handler's context.
type fakeTxKey struct{}

// countingStore counts Extend calls.
type countingStore struct {
	store.Store
	extends atomic.Int32
}

func (c *countingStore) Extend(ctx context.Context, l store.Claim, d time.Duration) (store.Claim, error) {
	c.extends.Add(1)
	return c.Store.Extend(ctx, l, d)
}

// contendedSignal signals each ClaimLease that finds the key in progress.
type contendedSignal struct {
	store.Store
	inProgress chan struct{}
}

func (c *contendedSignal) ClaimLease(ctx context.Context, req store.LeaseRequest) (store.ClaimResult, error) {
	res, err := c.Store.ClaimLease(ctx, req)
	if err == nil && res.Decision == store.DecisionHeld {
		select {
		case c.inProgress <- struct{}{}:
		default:
		}
	}
	return res, err
}

// fakeTxStore is a store.Transactional over the memory store, enough to test
// the one-transaction mode's flow through the stages: a claim is a ClaimLease, a
// commit a Complete, a rollback forgets the claim. The real one
// (store/postgres) is tested against PostgreSQL.
type fakeTxStore struct {
	*memory.Store
	// txs counts the transactions opened for the handler (a claim that
	// executes); commits those committed, rollbacks those rolled back.
	claims, txs, commits, rollbacks, records atomic.Int32
	// failCommit makes Commit fail, having rolled back, as pgx's does.
	failCommit atomic.Bool
}

func newFakeTxStore() *fakeTxStore {
	st, err := memory.New(memory.Options{})
	if err != nil {
		panic(err)
	}
	return &fakeTxStore{Store: st}
}

func (s *fakeTxStore) ClaimInTx(ctx context.Context, req store.TxRequest) (store.TxResult, error) {
	s.claims.Add(1)
	res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: req.Scope, Key: req.Key, Fingerprint: req.Fingerprint, LeaseDuration: time.Hour})
	if err != nil || res.Decision != store.DecisionExecute {
		return store.TxResult{ClaimResult: res}, err
	}
	s.txs.Add(1)
	return store.TxResult{ClaimResult: res, Tx: &fakeClaimTx{s: s, lease: res.Claim, ttl: req.SuccessTTL}}, nil
}

// RecordRollback writes the outcome under a fresh claim, unless the key is
// taken.
func (s *fakeTxStore) RecordRollback(ctx context.Context, l store.Claim, fp string, out store.Completion) error {
	s.records.Add(1)
	res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: l.Scope, Key: l.Key, Fingerprint: fp, LeaseDuration: time.Hour})
	if err != nil {
		return err
	}
	if res.Decision != store.DecisionExecute {
		return store.ErrLeaseLost
	}
	if out.Status == store.StatusRetryable {
		return s.Release(ctx, res.Claim, out)
	}
	return s.Complete(ctx, res.Claim, out)
}

type fakeClaimTx struct {
	s     *fakeTxStore
	lease store.Claim
	ttl   time.Duration
}

func (t *fakeClaimTx) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, fakeTxKey{}, t)
}

func (t *fakeClaimTx) Commit(ctx context.Context, result []byte) error {
	if t.s.failCommit.Load() {
		_ = t.s.Delete(ctx, t.lease.Scope, t.lease.Key, t.lease.Token) // rolled back, claim included
		return errors.New("could not serialize access")
	}
	if err := t.s.Complete(ctx, t.lease, store.Completion{Status: store.StatusSucceeded, Result: result, TTL: t.ttl}); err != nil {
		return err
	}
	t.s.commits.Add(1)
	return nil
}

func (t *fakeClaimTx) Rollback(ctx context.Context) error {
	t.s.rollbacks.Add(1)
	return t.s.Delete(ctx, t.lease.Scope, t.lease.Key, t.lease.Token)
}
