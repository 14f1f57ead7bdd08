package pipeline_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
)

// fakeTxManager is a transaction manager whose transactions stage writes and
// apply them on commit: enough to test the transaction stage's logic. The
// real one (store/postgres) is tested against PostgreSQL.
type fakeTxManager struct {
	begins, commits, rollbacks atomic.Int32
	failCommit                 atomic.Bool
}

type fakeTxKey struct{}

type fakeTx struct {
	mu     sync.Mutex
	writes []func() error
}

func (m *fakeTxManager) Begin(ctx context.Context) (context.Context, error) {
	m.begins.Add(1)
	return context.WithValue(ctx, fakeTxKey{}, &fakeTx{}), nil
}

func (m *fakeTxManager) Commit(ctx context.Context) error {
	tx := ctx.Value(fakeTxKey{}).(*fakeTx)
	if m.failCommit.Load() {
		return errors.New("could not serialize access")
	}
	tx.mu.Lock()
	defer tx.mu.Unlock()
	for _, w := range tx.writes {
		if err := w(); err != nil {
			return err
		}
	}
	m.commits.Add(1)
	return nil
}

func (m *fakeTxManager) Rollback(ctx context.Context) error {
	m.rollbacks.Add(1)
	return nil
}

// txStore is the memory store counting Completes, under the lease mode's
// separate transaction (fakeTxManager).
type txStore struct {
	*memory.Store
	completes atomic.Int32
}

func newTxStore() *txStore {
	st, err := memory.New(memory.Options{})
	if err != nil {
		panic(err)
	}
	return &txStore{Store: st}
}

func (s *txStore) Complete(ctx context.Context, l store.Claim, o store.Completion) error {
	s.completes.Add(1)
	return s.Store.Complete(ctx, l, o)
}

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
	claims, commits, rollbacks, records atomic.Int32
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
		return s.Release(ctx, res.Claim, out.TTL)
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
	t.s.commits.Add(1)
	return t.s.Complete(ctx, t.lease, store.Completion{Status: store.StatusSucceeded, Result: result, TTL: t.ttl})
}

func (t *fakeClaimTx) Rollback(ctx context.Context) error {
	t.s.rollbacks.Add(1)
	return t.s.Delete(ctx, t.lease.Scope, t.lease.Key)
}
