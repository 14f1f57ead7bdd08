// Package guardtx is the handler's transaction in the one-transaction
// modes (Handler), and how its owner ends it on the connection (Commit,
// Release). A Tx stops touching its connection once the owner has ended
// the transaction and given the connection back to the pool: a handler
// that kept its pgx.Tx past its delivery gets pgx.ErrTxClosed instead of a
// statement on a connection that now serves someone else.
package guardtx

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Tx is a pgx.Tx whose statements fail with pgx.ErrTxClosed once *Ended is
// true. Begin, Commit and Rollback are the embedding type's to decide.
type Tx struct {
	pgx.Tx
	Ended *bool
}

// Check returns pgx.ErrTxClosed once the owner ended the transaction.
func (t Tx) Check() error {
	if *t.Ended {
		return pgx.ErrTxClosed
	}
	return nil
}

func (t Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.Check(); err != nil {
		return 0, err
	}
	return t.Tx.CopyFrom(ctx, table, columns, src)
}

func (t Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.Check(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return t.Tx.SendBatch(ctx, b)
}

func (t Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.Check(); err != nil {
		return nil, err
	}
	return t.Tx.Prepare(ctx, name, sql)
}

func (t Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.Check(); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.Tx.Exec(ctx, sql, args...)
}

func (t Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.Check(); err != nil {
		return nil, err
	}
	return t.Tx.Query(ctx, sql, args...)
}

func (t Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.Check(); err != nil {
		return errRow{err}
	}
	return t.Tx.QueryRow(ctx, sql, args...)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
