// Package lazytx is a pgx.Tx whose BEGIN goes out with its first
// statement, in one batch (pgx.Batch.BeginTx), rather than in a round trip
// of its own: the watermark mode's fast path (internal/watermark), where
// nothing else has to be sent before the handler's first statement, and
// the key mode's deferred claim (internal/claimtx), whose statements go
// out between BEGIN and the handler's first statement (a Prelude).
package lazytx

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Conn is what a Tx needs of its connection (a *pgxpool.Conn).
type Conn interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
	Conn() *pgx.Conn
}

// Prelude is statements sent with BEGIN, after it and ahead of the first
// statement, in the same batch.
type Prelude interface {
	// Queue queues the statements.
	Queue(b *pgx.Batch)
	// Read reads their results, after BEGIN's; err is BEGIN's error, if
	// any. An error it returns refuses the transaction: the server skips
	// the rest of the batch, and every statement fails with the error
	// (Refused).
	Read(br pgx.BatchResults, err error) error
}

// New returns a transaction on conn, begun with opts by its first
// statement, with prelude (nil for none). beginTimeout bounds a BEGIN sent
// where no context is given (Conn, LargeObjects).
func New(conn Conn, opts pgx.TxOptions, beginTimeout time.Duration, prelude Prelude) *Tx {
	return &Tx{conn: conn, opts: opts, beginTimeout: beginTimeout, prelude: prelude}
}

// Begun tells whether BEGIN was sent (and did not fail).
func (t *Tx) Begun() bool { return t.tx != nil }

// Broken is the error of a BEGIN that failed where it could not be
// returned (Conn, LargeObjects): the transaction must not commit.
func (t *Tx) Broken() error { return t.broken }

// Refused is the prelude's error: the transaction cannot commit, and its
// statements fail with it.
func (t *Tx) Refused() error { return t.refused }

// Settle closes the batch the first statement went out in if its rows are
// still open; the connection is then free.
func (t *Tx) Settle() error { return t.settle() }

// Start sends BEGIN, with the prelude, unless the transaction has begun:
// for a commit when the handler sent no statement.
func (t *Tx) Start(ctx context.Context) error { return t.begin(ctx) }

// Tx is a pgx.Tx: BEGIN goes out with the handler's
// first statement, in one batch (pgx.Batch.BeginTx), rather than in a
// round trip of its own. What cannot share a batch (CopyFrom, Prepare, a
// savepoint, LargeObjects, Conn, a statement with a query mode option or
// several statements in one string) sends BEGIN alone first. Until the
// first statement, tx is nil.
type Tx struct {
	conn Conn
	opts pgx.TxOptions
	// beginTimeout bounds a BEGIN sent where no context is given (Conn,
	// LargeObjects).
	beginTimeout time.Duration
	tx           pgx.Tx
	// pending is the batch the first statement went out in while its rows
	// are still being read (Query, QueryRow): it is closed when they are,
	// or before the next statement.
	pending pgx.BatchResults
	// broken is set when BEGIN failed where the error could not be
	// returned: the transaction must not commit.
	broken error
	// prelude goes out with BEGIN; refused is its error.
	prelude Prelude
	refused error
}

var _ pgx.Tx = (*Tx)(nil)

// settle closes the pending batch, if any.
func (t *Tx) settle() error {
	if t.pending == nil {
		return nil
	}
	br := t.pending
	t.pending = nil
	return br.Close()
}

// begin sends BEGIN, alone or with the prelude, unless the transaction has
// begun.
func (t *Tx) begin(ctx context.Context) error {
	if err := t.settle(); err != nil {
		return err
	}
	if t.refused != nil {
		return t.refused
	}
	if t.tx != nil {
		return nil
	}
	if t.prelude != nil {
		br, err := t.send(ctx, t.batch())
		if err != nil {
			return err
		}
		return br.Close()
	}
	tx, err := t.conn.BeginTx(ctx, t.opts)
	if err != nil {
		return err
	}
	t.tx = tx
	return nil
}

// first prepares a statement: it returns the begun transaction to send it
// in (after closing a pending batch, and after sending BEGIN alone if the
// statement cannot share a batch with it), or, when the transaction has not
// begun, sends BEGIN and the statement in one batch and returns its
// results, BEGIN's read.
func (t *Tx) first(ctx context.Context, sql string, args []any, exec bool) (pgx.Tx, pgx.BatchResults, error) {
	if err := t.settle(); err != nil {
		return nil, nil, err
	}
	if t.refused != nil {
		return nil, nil, t.refused
	}
	if t.tx == nil && !batchable(sql, args, exec) {
		if err := t.begin(ctx); err != nil {
			return nil, nil, err
		}
	}
	if t.tx != nil {
		return t.tx, nil, nil
	}
	b := t.batch()
	b.Queue(sql, args...)
	br, err := t.send(ctx, b)
	return nil, br, err
}

// batch is a batch that begins the transaction: BEGIN and the prelude.
func (t *Tx) batch() *pgx.Batch {
	b := &pgx.Batch{}
	b.BeginTx(t.opts)
	if t.prelude != nil {
		t.prelude.Queue(b)
	}
	return b
}

// batchable: a statement that can go out in a batch with BEGIN. pgx sends
// Exec without arguments with the simple protocol, which allows several
// statements in one string; a batch does not, so such a string (any ';')
// begins alone. A query mode or result format option is not a batch's
// either.
func batchable(sql string, args []any, exec bool) bool {
	if exec && len(args) == 0 && strings.Contains(sql, ";") {
		return false
	}
	if len(args) > 0 {
		switch args[0].(type) {
		case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			return false
		}
	}
	return true
}

// send sends a batch of t.batch(), and reads the results of BEGIN and the
// prelude.
func (t *Tx) send(ctx context.Context, b *pgx.Batch) (pgx.BatchResults, error) {
	br := t.conn.SendBatch(ctx, b)
	t.tx = br.Tx()
	_, err := br.Exec()
	if t.prelude != nil {
		if err = t.prelude.Read(br, err); err != nil {
			br.Close() // the server skipped the rest of the batch
			t.refused = err
			return nil, err
		}
	}
	if err != nil {
		br.Close()
		t.tx = nil // nothing began: the next statement tries again
		return nil, err
	}
	return br, nil
}

func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tx, br, err := t.first(ctx, sql, args, true)
	switch {
	case err != nil:
		return pgconn.CommandTag{}, err
	case tx != nil:
		return tx.Exec(ctx, sql, args...)
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	tx, br, err := t.first(ctx, sql, args, false)
	switch {
	case err != nil:
		return errRow{err}
	case tx != nil:
		return tx.QueryRow(ctx, sql, args...)
	}
	t.pending = br
	return lazyRow{t: t, row: br.QueryRow()}
}

// lazyRow closes the first statement's batch once scanned.
type lazyRow struct {
	t   *Tx
	row pgx.Row
}

func (r lazyRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.t.settle(); err == nil {
		err = cerr
	}
	return err
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	tx, br, err := t.first(ctx, sql, args, false)
	switch {
	case err != nil:
		return nil, err
	case tx != nil:
		return tx.Query(ctx, sql, args...)
	}
	t.pending = br
	rows, err := br.Query()
	if err != nil {
		if cerr := t.settle(); cerr != nil && rows == nil {
			return nil, cerr
		}
		return rows, err
	}
	return &lazyRows{Rows: rows, t: t}, nil
}

// lazyRows closes the first statement's batch when the rows are closed,
// or read to the end (pgx closes them then).
type lazyRows struct {
	pgx.Rows
	t   *Tx
	err error
}

func (r *lazyRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *lazyRows) Close() {
	r.Rows.Close()
	if err := r.t.settle(); err != nil && r.err == nil {
		r.err = err
	}
}

func (r *lazyRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.settle(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	if t.tx == nil && b.Len() == 0 {
		if err := t.begin(ctx); err != nil {
			return pgx.FailedBatchResults(b, err)
		}
	}
	if t.refused != nil {
		return pgx.FailedBatchResults(b, t.refused)
	}
	if t.tx != nil {
		return t.tx.SendBatch(ctx, b)
	}
	// The handler's queued queries, callbacks included, after BEGIN.
	nb := t.batch()
	nb.QueuedQueries = append(nb.QueuedQueries, b.QueuedQueries...)
	br, err := t.send(ctx, nb)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	t.pending = br
	return lazyBatch{BatchResults: br, t: t}
}

// lazyBatch is the handler's batch, sent after BEGIN in the same batch:
// its Close closes both.
type lazyBatch struct {
	pgx.BatchResults
	t *Tx
}

func (b lazyBatch) Close() error {
	if b.t.pending != b.BatchResults {
		return b.BatchResults.Close() // closed already: its first error again
	}
	return b.t.settle()
}

// Tx is nil: the handler's batch began no transaction of its own.
func (b lazyBatch) Tx() pgx.Tx { return nil }

func (t *Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.tx.Begin(ctx)
}

func (t *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.begin(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, table, columns, src)
}

func (t *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.tx.Prepare(ctx, name, sql)
}

// beginNow begins where no context is given and no error can be returned.
// A failure closes the connection, so that nothing the handler sends on it
// runs outside the transaction, leaves a closed pgx.Tx (its statements
// fail with pgx.ErrTxClosed), and makes the commit refuse.
func (t *Tx) beginNow() {
	ctx, cancel := context.WithTimeout(context.Background(), t.beginTimeout)
	defer cancel()
	if err := t.begin(ctx); err != nil {
		t.broken = err
		_ = t.conn.Conn().Close(ctx)
		b := &pgx.Batch{}
		b.BeginTx(t.opts)
		t.tx = pgx.FailedBatchResults(b, err).Tx()
	}
}

func (t *Tx) LargeObjects() pgx.LargeObjects {
	t.beginNow()
	return t.tx.LargeObjects()
}

// Conn is the connection, in the begun transaction: statements sent on it
// directly are the transaction's.
func (t *Tx) Conn() *pgx.Conn {
	t.beginNow()
	return t.conn.Conn()
}

// Commit and Rollback serve no caller: the handler's top level refuses
// them (guardtx.Handler), and its savepoints are pgx's.
func (t *Tx) Commit(ctx context.Context) error {
	if err := t.begin(ctx); err != nil {
		return err
	}
	return t.tx.Commit(ctx)
}

func (t *Tx) Rollback(ctx context.Context) error {
	if err := t.settle(); err != nil || t.tx == nil {
		return err
	}
	return t.tx.Rollback(ctx)
}
