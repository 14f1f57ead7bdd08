package watermark

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres/internal/guardtx"
	"github.com/oncemill/oncemill/store/postgres/internal/lazytx"
	"github.com/oncemill/oncemill/store/postgres/internal/pgerr"
)

// errWatermarkMoved: the fast path's commit found the watermark past its
// offset, or conflicted with another transaction; nothing was committed.
// It wraps store.ErrLeaseLost: the offset is, or may be, another owner's.
var errWatermarkMoved = fmt.Errorf("the partition's watermark moved past the offset, or another owner's transaction conflicted, before the commit: nothing was committed: %w", store.ErrLeaseLost)

// Tx is an open claim of an offset: store.Tx. Commit writes the produced
// messages into the partition's row.
type Tx struct {
	m       *Mode
	conn    *pgxpool.Conn
	key     string
	pos     store.KafkaPosition
	uuid    string
	handler *guardtx.Handler
	// token is the pessimistic claim's (the row's after it); the fast
	// path's commit reads it from the row.
	token int64
	// lazy is set for the fast path (fast.go): the handler's transaction,
	// begun with its first statement; Commit claims the offset.
	lazy *lazytx.Tx
	// ended is set before the last round trip, so that the handler's
	// pgx.Tx, and what it made, refuse to touch the connection, which goes
	// back to the pool.
	ended bool
}

var _ store.Tx = (*Tx)(nil)

// newTx is the pessimistic claim's: tx holds the row's lock.
func (m *Mode) newTx(conn *pgxpool.Conn, tx pgx.Tx, key string, pos store.KafkaPosition, uuid string, token int64) *Tx {
	t := &Tx{m: m, conn: conn, key: key, pos: pos, uuid: uuid, token: token}
	t.handler = guardtx.NewHandler(tx, &t.ended)
	return t
}

// newFastTx is the fast path's: nothing is sent before the handler's first
// statement.
func (m *Mode) newFastTx(conn *pgxpool.Conn, key string, pos store.KafkaPosition, uuid string) *Tx {
	t := &Tx{m: m, conn: conn, key: key, pos: pos, uuid: uuid}
	t.lazy = lazytx.New(conn, m.cfg.TxOptions, m.cfg.Gate.Timeout, nil)
	t.handler = guardtx.NewHandler(t.lazy, &t.ended)
	return t
}

// Context implements store.Tx: ctx carrying the handler's pgx.Tx.
func (t *Tx) Context(ctx context.Context) context.Context { return t.handler.With(ctx) }

// Commit implements store.Tx: the produced messages, when there are some,
// in COMMIT's round trip; on the fast path the claim too (commitFast).
func (t *Tx) Commit(ctx context.Context, result []byte) error {
	if t.ended {
		return fmt.Errorf("oncemill: postgres: commit: %w", pgx.ErrTxClosed)
	}
	t.ended = true
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.m.cfg.Gate.Timeout)
	defer cancel()
	if max := t.m.cfg.Limits.MaxResultBytes; len(result) > max {
		guardtx.Release(ctx, t.conn)
		return pgerr.Invalid("commit", "result is %d bytes, more than MaxResultBytes %d; raise Options.MaxResultBytes or lower policy.MaxResultBytes", len(result), max)
	}
	if t.lazy != nil {
		return t.commitFast(ctx, result)
	}
	if t.conn.Conn().PgConn().TxStatus() == 'E' {
		guardtx.Release(ctx, t.conn)
		return pgerr.Wrap("commit", guardtx.ErrAborted)
	}
	var err error
	if result != nil {
		err = guardtx.Commit(ctx, t.conn, t.m.cfg.SQL.commitResult, t.m.cfg.Group, t.pos.Topic, t.pos.Partition, result)
	} else {
		err = guardtx.Commit(ctx, t.conn, "")
	}
	guardtx.Release(ctx, t.conn) // a no-op after a commit; releases the connection
	if err != nil {
		return pgerr.Wrap("commit", err)
	}
	// The next message of the partition may take the fast path.
	t.m.cache.put(wmPart(t.pos), wmKnown{next: t.pos.Offset + 1, token: t.token})
	return nil
}

// commitFast ends a fast-path transaction: the commit statement, then
// COMMIT, in one round trip; the commit statement alone, in a transaction
// of its own, when the handler sent no statement.
func (t *Tx) commitFast(ctx context.Context, result []byte) error {
	lz := t.lazy
	settled := lz.Settle()
	args := []any{t.m.group, t.pos.Topic, t.pos.Partition, t.pos.Offset, t.uuid, result}
	var token int64
	var err error
	switch {
	case settled != nil || lz.Broken() != nil || lz.Begun() && t.conn.Conn().PgConn().TxStatus() != 'T':
		guardtx.Release(ctx, t.conn)
		return pgerr.Wrap("commit", guardtx.ErrAborted)
	case !lz.Begun():
		err = t.conn.QueryRow(ctx, t.m.cfg.SQL.commitFast, args...).Scan(&token)
	default:
		b := &pgx.Batch{}
		b.Queue(t.m.cfg.SQL.commitFast, args...)
		b.Queue("commit")
		br := t.conn.SendBatch(ctx, b)
		var tag pgconn.CommandTag
		if err = br.QueryRow().Scan(&token); err == nil {
			tag, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err == nil && tag.String() != "COMMIT" {
			err = guardtx.ErrAborted
		}
	}
	guardtx.Release(ctx, t.conn) // a no-op after a commit; releases the connection
	// The errors are told apart only here: the tests allocate, and a
	// commit almost always succeeds.
	if err != nil {
		var pgErr *pgconn.PgError
		if pgerr.IsMarker(err, wmMovedMarker) || errors.As(err, &pgErr) && (pgErr.Code == serializationFailure || pgErr.Code == deadlockDetected) {
			return fmt.Errorf("oncemill: postgres: commit %s: %w (%w)", t.key, errWatermarkMoved, err)
		}
		return pgerr.Wrap("commit", err)
	}
	t.m.cache.put(wmPart(t.pos), wmKnown{next: t.pos.Offset + 1, token: token})
	return nil
}

// Rollback implements store.Tx.
func (t *Tx) Rollback(ctx context.Context) error {
	if t.ended {
		return nil
	}
	t.ended = true
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.m.cfg.Gate.Timeout)
	defer cancel()
	if t.lazy != nil && t.lazy.Settle() != nil {
		_ = t.conn.Conn().Close(ctx) // a batch left mid-way: the connection cannot be trusted
	}
	guardtx.Release(ctx, t.conn)
	if t.lazy != nil {
		return t.lazy.Refused()
	}
	return nil
}
