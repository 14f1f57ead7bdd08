// Package claimtx is an open claim of the one-transaction mode on a key
// (store.Tx): the handler's transaction, holding the claim's record, which
// Commit commits with the produced messages and Rollback rolls back. A
// deferred claim's statements go out with the handler's first statement
// (Claim).
package claimtx

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres/internal/guardtx"
	"github.com/oncemill/oncemill/store/postgres/internal/lazytx"
	"github.com/oncemill/oncemill/store/postgres/internal/pgerr"
)

// Config is what every claim of one store shares.
type Config struct {
	// Timeout bounds Commit and Rollback (Options.StatementTimeout).
	Timeout        time.Duration
	MaxResultBytes int
	// CommitResult stores the produced messages, and the expiry counted
	// from now: $1 scope, $2 key, $3 result, $4 the TTL in microseconds.
	CommitResult string
}

// Record is the claimed record's: its key, its TTL from the commit (in
// microseconds), and the slack by which the claim's expiry outlives it
// (Commit rewrites the expiry only past it).
type Record struct {
	Scope, Key string
	TTLMicros  int64
	Slack      time.Duration
	// Started is when the claim's transaction began, at the latest.
	Started time.Time
}

// Tx is an open one-transaction claim: store.Tx.
type Tx struct {
	cfg     *Config
	conn    *pgxpool.Conn
	rec     Record
	handler *guardtx.Handler
	// lazy is set for a deferred claim: the handler's transaction, begun
	// with its first statement and the claim.
	lazy *lazytx.Tx
	// claim is the deferred claim, lazy's prelude: a field, so that it
	// takes no allocation of its own.
	claim Claim
	// ended is set before the last round trip, so that the handler's
	// pgx.Tx, and what it made, refuse to touch the connection, which goes
	// back to the pool.
	ended bool
}

var _ store.Tx = (*Tx)(nil)

// New returns the claim held by tx, begun on conn.
func New(cfg *Config, conn *pgxpool.Conn, tx pgx.Tx, rec Record) *Tx {
	t := &Tx{cfg: cfg, conn: conn, rec: rec}
	t.handler = guardtx.NewHandler(tx, &t.ended)
	return t
}

// NewDeferred returns the deferred claim c on conn: the transaction to
// begin, with opts, by the handler's first statement.
func NewDeferred(cfg *Config, conn *pgxpool.Conn, opts pgx.TxOptions, rec Record, c Claim) *Tx {
	t := &Tx{cfg: cfg, conn: conn, rec: rec, claim: c}
	t.lazy = lazytx.New(conn, opts, cfg.Timeout, &t.claim)
	t.handler = guardtx.NewHandler(t.lazy, &t.ended)
	return t
}

// Context implements store.Tx: ctx carrying the handler's pgx.Tx.
func (t *Tx) Context(ctx context.Context) context.Context { return t.handler.With(ctx) }

// Commit implements store.Tx. It writes the produced messages, and the
// expiry when the transaction outran the expiry's slack, in the commit's
// round trip; otherwise it sends COMMIT alone.
func (t *Tx) Commit(ctx context.Context, result []byte) error {
	if t.ended {
		return fmt.Errorf("oncemill: postgres: commit: %w", pgx.ErrTxClosed)
	}
	t.ended = true
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.cfg.Timeout)
	defer cancel()
	if len(result) > t.cfg.MaxResultBytes {
		guardtx.Release(ctx, t.conn)
		return pgerr.Invalid("commit", "result is %d bytes, more than MaxResultBytes %d; raise Options.MaxResultBytes or lower policy.MaxResultBytes", len(result), t.cfg.MaxResultBytes)
	}
	if t.lazy != nil { // a deferred claim: BEGIN and the claim, unless the handler's first statement took them
		err := t.lazy.Start(ctx)
		if err == nil {
			err = t.lazy.Broken()
		}
		if err != nil {
			guardtx.Release(ctx, t.conn)
			if refused := t.lazy.Refused(); refused != nil {
				return refused
			}
			return pgerr.Wrap("commit", err)
		}
	}
	if t.conn.Conn().PgConn().TxStatus() == 'E' {
		guardtx.Release(ctx, t.conn)
		return pgerr.Wrap("commit", guardtx.ErrAborted)
	}
	var err error
	if result != nil || time.Since(t.rec.Started) > t.rec.Slack {
		err = guardtx.Commit(ctx, t.conn, t.cfg.CommitResult, t.rec.Scope, t.rec.Key, result, t.rec.TTLMicros)
	} else {
		err = guardtx.Commit(ctx, t.conn, "")
	}
	guardtx.Release(ctx, t.conn) // a no-op after a commit; releases the connection
	if err != nil {
		return pgerr.Wrap("commit", err)
	}
	return nil
}

// Rollback implements store.Tx.
func (t *Tx) Rollback(ctx context.Context) error {
	if t.ended {
		return nil
	}
	t.ended = true
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.cfg.Timeout)
	defer cancel()
	if t.lazy != nil && t.lazy.Settle() != nil {
		_ = t.conn.Conn().Close(ctx) // a batch left mid-way: the connection cannot be trusted
	}
	if t.lazy != nil && !t.lazy.Begun() {
		// A deferred claim the handler sent no statement with: whether its
		// failure is the key's, or a duplicate's, only the claim can tell.
		_ = t.lazy.Start(ctx)
	}
	guardtx.Release(ctx, t.conn)
	if t.lazy != nil {
		return t.lazy.Refused() // a deferred claim that did not take the key
	}
	return nil
}
