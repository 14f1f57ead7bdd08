package pipeline

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill"
)

// TxManager begins, commits and rolls back the transactions of the
// transaction stage. The transaction travels in the context: ClaimLease returns a
// context carrying it, where the handler finds it. The methods mention only
// standard types, so store/postgres satisfies this interface without
// importing this package, and this package never imports a driver.
type TxManager interface {
	// ClaimLease starts a transaction and returns a context carrying it.
	Begin(ctx context.Context) (context.Context, error)
	// Commit commits the transaction ctx carries. A failed commit leaves it
	// rolled back, as pgx and database/sql do.
	Commit(ctx context.Context) error
	// Rollback rolls back the transaction ctx carries.
	Rollback(ctx context.Context) error
}

// ErrTransaction wraps failures to begin or commit the handler's transaction.
// They are retryable unless the policy says otherwise.
var ErrTransaction = errors.New("oncemill: transaction")

// Transaction runs the handler inside a transaction of a TxManager: it
// commits only after the handler succeeds, and rolls back on an error or a
// panic. Each retry attempt gets a fresh transaction.
//
// This is the lease mode's transaction, separate from the record: the
// idempotency stage records the success after this commit, so a crash
// between the two runs the message again. Use it when the records live
// elsewhere than the business data (Redis, another database). When they
// share a PostgreSQL database, the one-transaction mode
// (IdempotencyConfig.TxStore) commits both together instead.
type Transaction struct {
	tm TxManager
}

// NewTransaction returns the transaction stage over tm.
func NewTransaction(tm TxManager) (*Transaction, error) {
	if tm == nil {
		return nil, oncemill.InvalidConfig("TxManager", "nil; pass a transaction manager such as postgres.NewTxManager(pool, pgx.TxOptions{})")
	}
	return &Transaction{tm: tm}, nil
}

// Middleware is the stage as a Watermill middleware.
func (t *Transaction) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) (msgs []*message.Message, err error) {
		orig := msg.Context()
		txCtx, err := t.tm.Begin(orig)
		if err != nil {
			return nil, fmt.Errorf("%w: begin: %w", ErrTransaction, err)
		}
		msg.SetContext(txCtx)
		settled := false
		defer func() {
			msg.SetContext(orig)
			if settled {
				return
			}
			// An error, a panic (the deferred call runs while it unwinds), or a
			// failed outcome write: nothing of this attempt may stay.
			if rerr := t.tm.Rollback(context.WithoutCancel(txCtx)); rerr != nil {
				err = errors.Join(err, fmt.Errorf("%w: rollback: %w", ErrTransaction, rerr))
			}
		}()

		msgs, err = h(msg)
		if err != nil {
			return nil, err
		}
		settled = true // a failed commit has already rolled back
		if err := t.tm.Commit(txCtx); err != nil {
			return nil, fmt.Errorf("%w: commit: %w", ErrTransaction, err)
		}
		return msgs, nil
	}
}
