package guardtx

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrOwned is returned by Commit and Rollback of a Handler at the top
// level: the stage ends the transaction, committing when the handler
// returns nil and rolling back when it returns an error.
var ErrOwned = errors.New("oncemill: postgres: the handler's transaction is committed or rolled back by oncemill: return nil to commit, an error to roll back")

// ErrAborted: a statement of the handler failed, and the handler went on
// to return nil; the transaction can only roll back.
var ErrAborted = fmt.Errorf("the transaction was aborted by an earlier error of the handler's statements, so it rolled back: %w", pgx.ErrTxCommitRollback)

// Handler is the pgx.Tx a handler gets in the one-transaction modes: the
// transaction its owner commits or rolls back on the connection directly
// (so that the owner's last statement can share COMMIT's round trip). At
// the top level it refuses to end the transaction itself; its savepoints
// (Begin) are Handler values too. Once the owner has ended the
// transaction, every call fails with pgx.ErrTxClosed.
type Handler struct {
	Tx
	top bool
}

var _ pgx.Tx = (*Handler)(nil)

// NewHandler returns the top level of tx, ended once *ended is true.
func NewHandler(tx pgx.Tx, ended *bool) *Handler {
	return &Handler{Tx: Tx{Tx: tx, Ended: ended}, top: true}
}

type handlerKey struct{}

// With returns ctx carrying h, for FromContext.
func (h *Handler) With(ctx context.Context) context.Context {
	return context.WithValue(ctx, handlerKey{}, pgx.Tx(h))
}

// FromContext returns the handler's transaction that With put in ctx.
func FromContext(ctx context.Context) (tx pgx.Tx, ok bool) {
	tx, ok = ctx.Value(handlerKey{}).(pgx.Tx)
	return tx, ok
}

// Begin starts a pseudo nested transaction (a savepoint), as pgx.Tx does.
func (h *Handler) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := h.Check(); err != nil {
		return nil, err
	}
	tx, err := h.Tx.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &Handler{Tx: Tx{Tx: tx, Ended: h.Ended}}, nil
}

// Commit of the top level refuses: the stage commits when the handler
// returns nil. A savepoint is released.
func (h *Handler) Commit(ctx context.Context) error {
	if h.top {
		return ErrOwned
	}
	if err := h.Check(); err != nil {
		return err
	}
	return h.Tx.Tx.Commit(ctx)
}

// Rollback of the top level refuses: the stage rolls back when the handler
// returns an error, so a deferred tx.Rollback(ctx) in the handler is
// harmless. A savepoint is rolled back to.
func (h *Handler) Rollback(ctx context.Context) error {
	if h.top {
		return ErrOwned
	}
	if err := h.Check(); err != nil {
		return err
	}
	return h.Tx.Tx.Rollback(ctx)
}

// Release ends whatever transaction conn is in and gives conn back to the
// pool. A connection that cannot roll back is closed, so the pool never
// hands out one in a transaction.
func Release(ctx context.Context, conn *pgxpool.Conn) {
	if conn.Conn().PgConn().TxStatus() != 'I' {
		if _, err := conn.Exec(ctx, "rollback"); err != nil {
			_ = conn.Conn().Close(ctx)
		}
	}
	conn.Release()
}

// Commit sends COMMIT on conn, preceded in the same round trip by stmt
// when it is not empty. A COMMIT that rolled back is ErrAborted. It does
// not release conn.
func Commit(ctx context.Context, conn *pgxpool.Conn, stmt string, args ...any) error {
	var tag pgconn.CommandTag
	var err error
	if stmt != "" {
		b := &pgx.Batch{}
		b.Queue(stmt, args...)
		b.Queue("commit")
		br := conn.SendBatch(ctx, b)
		if _, err = br.Exec(); err == nil {
			tag, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	} else {
		tag, err = conn.Exec(ctx, "commit")
	}
	if err == nil && tag.String() != "COMMIT" {
		err = ErrAborted // COMMIT of an aborted transaction rolls back
	}
	return err
}
