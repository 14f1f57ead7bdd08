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

// txStore is the memory store plus store.TxCompleter: the outcome is
// written when the fake transaction commits. It counts plain Completes.
type txStore struct {
	*memory.Store
	completes, completesInTx atomic.Int32
}

func newTxStore() *txStore {
	st, err := memory.New(memory.Options{})
	if err != nil {
		panic(err)
	}
	return &txStore{Store: st}
}

func (s *txStore) Complete(ctx context.Context, l store.Lease, o store.Outcome) error {
	s.completes.Add(1)
	return s.Store.Complete(ctx, l, o)
}

func (s *txStore) CompleteInTx(ctx context.Context, l store.Lease, o store.Outcome) error {
	tx, ok := ctx.Value(fakeTxKey{}).(*fakeTx)
	if !ok {
		return store.ErrNoTransaction
	}
	s.completesInTx.Add(1)
	tx.mu.Lock()
	tx.writes = append(tx.writes, func() error { return s.Store.Complete(context.Background(), l, o) })
	tx.mu.Unlock()
	return nil
}

// countingStore counts Extend calls.
type countingStore struct {
	store.Store
	extends atomic.Int32
}

func (c *countingStore) Extend(ctx context.Context, l store.Lease, d time.Duration) (store.Lease, error) {
	c.extends.Add(1)
	return c.Store.Extend(ctx, l, d)
}

// contendedSignal signals each Begin that finds the key in progress.
type contendedSignal struct {
	store.Store
	inProgress chan struct{}
}

func (c *contendedSignal) Begin(ctx context.Context, req store.BeginRequest) (store.BeginResult, error) {
	res, err := c.Store.Begin(ctx, req)
	if err == nil && res.Decision == store.InProgress {
		select {
		case c.inProgress <- struct{}{}:
		default:
		}
	}
	return res, err
}
