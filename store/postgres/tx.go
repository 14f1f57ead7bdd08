package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/store"
)

// TxManager begins, commits and rolls back the handler's transactions on the
// store's pool. It satisfies pipeline.TxManager (this package does not
// import pipeline): the transaction travels in the context, where the
// handler finds it with TxFromContext and CompleteInTx writes the outcome
// into it.
type TxManager struct {
	s *Store
}

// TxManager returns the store's transaction manager, for the pipeline's
// transaction stage (receiver's WithTransaction, pipeline.NewTransaction).
func (s *Store) TxManager() *TxManager { return &TxManager{s: s} }

type txKey struct{}

// txValue is what the context carries: the transaction and the pool it came
// from, so that a store writes only into transactions on its own database.
type txValue struct {
	tx   pgx.Tx
	pool *pgxpool.Pool
}

func txFrom(ctx context.Context) *txValue {
	v, _ := ctx.Value(txKey{}).(*txValue)
	return v
}

// TxFromContext returns the transaction the transaction stage began for the
// handler. Do the handler's database writes on it: they commit together with
// the record of the message's success, or not at all. ok is false outside
// the stage.
func TxFromContext(ctx context.Context) (tx pgx.Tx, ok bool) {
	if v := txFrom(ctx); v != nil {
		return v.tx, true
	}
	return nil, false
}

// Begin starts a transaction with Options.TxOptions and returns a context
// carrying it. Each call starts a new transaction, even when ctx already
// carries one.
func (m *TxManager) Begin(ctx context.Context) (context.Context, error) {
	if err := m.s.checkOpen("begin transaction"); err != nil {
		return ctx, err
	}
	tx, err := m.s.pool.BeginTx(ctx, m.s.opts.TxOptions)
	if err != nil {
		return ctx, wrap("begin transaction", err)
	}
	return context.WithValue(ctx, txKey{}, &txValue{tx: tx, pool: m.s.pool}), nil
}

// Commit commits the transaction ctx carries. A failed commit leaves it
// rolled back.
func (m *TxManager) Commit(ctx context.Context) error {
	v := txFrom(ctx)
	if v == nil {
		return fmt.Errorf("postgres: commit: %w", store.ErrNoTransaction)
	}
	if err := v.tx.Commit(ctx); err != nil {
		return wrap("commit", err)
	}
	return nil
}

// Rollback rolls back the transaction ctx carries. Rolling back a
// transaction that already ended is not an error.
func (m *TxManager) Rollback(ctx context.Context) error {
	v := txFrom(ctx)
	if v == nil {
		return fmt.Errorf("postgres: rollback: %w", store.ErrNoTransaction)
	}
	if err := v.tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return wrap("rollback", err)
	}
	return nil
}

// CompleteInTx implements store.TxCompleter: Complete's conditional write,
// run inside the transaction ctx carries (begun by this store's TxManager).
// It takes effect only if that transaction commits, and returns an error
// wrapping store.ErrLeaseLost, changing nothing, when the lease is not
// current; the transaction stage then rolls the handler's writes back.
func (s *Store) CompleteInTx(ctx context.Context, lease store.Lease, out store.Outcome) error {
	out, err := s.checkComplete("complete in transaction", lease, out)
	if err != nil {
		return err
	}
	if err := s.checkOpen("complete in transaction"); err != nil {
		return err
	}
	v := txFrom(ctx)
	if v == nil || v.pool != s.pool {
		return fmt.Errorf("postgres: complete in transaction: no transaction of this store's pool in the context (use Store.TxManager with the transaction stage): %w", store.ErrNoTransaction)
	}
	c := &call[completeReq, struct{}]{req: completeReq{lease: lease, out: out}}
	applied, err := s.completeStatement(ctx, v.tx, []*call[completeReq, struct{}]{c})
	if err != nil {
		return wrap("complete in transaction", err)
	}
	if !applied[0] {
		return leaseLost("complete in transaction", lease)
	}
	return nil
}
